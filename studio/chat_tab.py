"""The Chat tab: the tuned model and its base, side by side, same prompt, same sampling settings.

The tuned answer streams first (it is what the user came to see), then the base answer, from the
same loaded weights with the adapter switched off (studio.chat)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import gradio as gr

from jobs.export import list_exports
from jobs.spec import BUILTIN_MODEL
from studio import jobs_view as view
from studio.chat import ChatEngine, Sampling, history_to_messages
from studio.context import StudioContext

NO_ADAPTER = "none"
LOADING = "*(loading the model…)*"


@dataclass
class ChatTab:
    adapter: gr.Dropdown
    model: gr.Dropdown

    def refresh(self, ctx: StudioContext) -> list[Any]:
        return [gr.update(choices=adapter_choices(ctx)), gr.update(choices=model_choices(ctx))]


def adapter_choices(ctx: StudioContext) -> list[tuple[str, str]]:
    jobs = [view.job_choice(r) for r in ctx.runner.list_jobs() if view.exportable(r)]
    return [("— none: base model only —", NO_ADAPTER)] + jobs


def model_choices(ctx: StudioContext) -> list[tuple[str, str]]:
    """Base models jobs used, then every job's exported merged folders and GGUF files, so an
    export can be checked here before it is copied anywhere."""
    choices = [(model, model) for model in ctx.known_models()]
    for record in ctx.runner.list_jobs():
        choices += [(f"{record.id} · export: {path.name}", str(path)) for path in list_exports(record.job_dir)]
    return choices


def is_export(model_id: str | None) -> bool:
    """An exported model has the adapter merged in: it is chatted with alone."""
    return bool(model_id) and "exports" in Path(model_id).parts


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def _stream_into(history: list[dict[str, Any]], chunks: Iterator[str], loading: bool) -> Iterator[None]:
    """Append an assistant message to history and grow it as chunks arrive (one yield per chunk).
    A failure becomes a marked notice (metadata), kept out of later prompts."""
    history.append({"role": "assistant", "content": LOADING if loading else ""})
    yield None
    try:
        for text in chunks:
            history[-1] = {"role": "assistant", "content": text}
            yield None
    except Exception as exc:  # shown in the chat, the tab stays usable
        history[-1] = {"role": "assistant", "content": f"{type(exc).__name__}: {exc}",
                       "metadata": {"title": "⚠️ Generation failed"}}
        gr.Warning(f"Generation failed: {exc}")
        yield None


def respond(engine: ChatEngine, model_id: str, adapter_dir: str | None, message: str,
            tuned: list[dict[str, Any]], base: list[dict[str, Any]], sampling: Sampling,
            system: str = "") -> Iterator[tuple[str, list[dict[str, Any]], list[dict[str, Any]]]]:
    """Yield ("", tuned history, base history) as both answers stream in."""
    if not (message or "").strip():
        yield gr.skip(), tuned, base
        return
    tuned, base = list(tuned or []), list(base or [])
    if adapter_dir:
        tuned.append(_user(message))
    base.append(_user(message))
    yield "", tuned, base
    if adapter_dir:
        chunks = engine.stream(model_id, adapter_dir, history_to_messages(tuned, system), sampling, True)
        for _ in _stream_into(tuned, chunks, not engine.is_loaded(model_id, adapter_dir)):
            yield "", tuned, base
    chunks = engine.stream(model_id, adapter_dir, history_to_messages(base, system), sampling, False)
    for _ in _stream_into(base, chunks, not engine.is_loaded(model_id, adapter_dir)):
        yield "", tuned, base


def build_chat_tab(ctx: StudioContext) -> ChatTab:
    with gr.Row():
        model = gr.Dropdown(choices=[BUILTIN_MODEL], value=BUILTIN_MODEL, allow_custom_value=True,
                            label="Base model",
                            info="Picking a job's adapter sets this to the model it was trained on. "
                                 "A job's export (merged folder or GGUF) answers alone, on the right.",
                            elem_id="ft-chat-model", scale=3)
        adapter = gr.Dropdown(choices=[("— none: base model only —", NO_ADAPTER)], value=NO_ADAPTER,
                              label="Adapter (finished job)", elem_id="ft-chat-adapter", scale=3)
    with gr.Accordion("Sampling (the same for both answers)", open=False):
        with gr.Row():
            temperature = gr.Slider(0.0, 2.0, value=0.7, step=0.05, label="Temperature (0 = greedy)",
                                    elem_id="ft-chat-temperature")
            top_p = gr.Slider(0.05, 1.0, value=0.9, step=0.05, label="Top-p", elem_id="ft-chat-top-p")
            max_new = gr.Slider(8, 2048, value=128, step=8, label="Max new tokens", elem_id="ft-chat-max-new")
            seed = gr.Number(0, precision=0, minimum=0, label="Seed", elem_id="ft-chat-seed")
        system = gr.Textbox(label="System prompt (optional)", lines=1, elem_id="ft-chat-system")
    with gr.Row(equal_height=True):
        tuned = gr.Chatbot(label="Tuned (base + adapter)", elem_id="ft-chat-tuned", height=380,
                           placeholder="Pick a finished job's adapter above to see the tuned model here.")
        base = gr.Chatbot(label="Base model", elem_id="ft-chat-base", height=380)
    with gr.Row():
        prompt = gr.Textbox(placeholder="Ask something, e.g. “Who are you?”", show_label=False,
                            elem_id="ft-chat-input", scale=6, lines=1)
        send = gr.Button("Send", variant="primary", elem_id="ft-chat-send", scale=1, min_width=100)
        clear = gr.Button("Clear", elem_id="ft-chat-clear", scale=0, min_width=80)

    def on_adapter(job_id: str | None, current_model: str | None) -> Any:
        record = ctx.runner.get(job_id) if job_id and job_id != NO_ADAPTER else None
        trained_on = (record.spec or {}).get("model") if record else None
        return gr.update(value=trained_on) if trained_on else gr.update(value=current_model)

    adapter.change(on_adapter, [adapter, model], model)
    # input, not change: only the user's own pick, never the update on_adapter makes
    model.input(lambda chosen: gr.update(value=NO_ADAPTER) if is_export(chosen) else gr.skip(), model, adapter)

    def on_send(message, model_id, job_id, tuned_h, base_h, temp, top, max_tokens, seed_value, system_text):
        model_id = (model_id or "").strip()
        if not model_id:
            gr.Warning("Pick a base model first.")
            yield gr.skip(), tuned_h, base_h
            return
        adapter_dir = ctx.adapter_dir(job_id) if job_id and job_id != NO_ADAPTER else None
        if job_id and job_id != NO_ADAPTER and adapter_dir is None:
            gr.Warning(f"Job {job_id} has no adapter (any more); answering with the base model only.")
        sampling = Sampling(temperature=float(temp), top_p=float(top), max_new_tokens=int(max_tokens),
                            seed=int(seed_value or 0))
        yield from respond(ctx.chat, model_id, adapter_dir, message, tuned_h, base_h, sampling,
                           system_text or "")

    inputs = [prompt, model, adapter, tuned, base, temperature, top_p, max_new, seed, system]
    send.click(on_send, inputs, [prompt, tuned, base])
    prompt.submit(on_send, inputs, [prompt, tuned, base])
    clear.click(lambda: ([], []), None, [tuned, base])
    return ChatTab(adapter=adapter, model=model)
