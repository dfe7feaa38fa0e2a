"""The Chat tab: the tuned model and its base, side by side, same prompt, same sampling settings.

Both answers stream at the same time, from one batched generate over the same loaded weights
(the tuned row with the job's adapter, the base row without: studio.chat)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import gradio as gr

from jobs.checks.access import AccessError, DataAccess
from jobs.export import list_exports
from jobs.spec import BUILTIN_MODEL
from studio import jobs_view as view
from studio.chat import ChatEngine, Sampling, history_to_messages
from studio.context import PICKER_REFRESH, StudioContext
from studio.form import error_text
from studio.i18n import t
from studio.serve_panel import build_serve_panel

NO_ADAPTER = "none"


@dataclass
class ChatTab:
    adapter: gr.Dropdown
    model: gr.Dropdown
    image: Any = None   # gr.Image: a picture sent with the message to a vision-language model
    auto: Any = None    # gr.State: the adapter the page picked by itself ("" once the user picks one)
    known: Any = None   # gr.State: the adapter choices as last sent by follow_jobs

    def refresh(self, ctx: StudioContext, lang: str = "en", current: str | None = NO_ADAPTER,
                auto: str | None = "") -> list[Any]:
        """[adapter, model, auto] updates: the choices; while the user has not picked an adapter
        (none yet, or the one the page picked by itself), the newest finished job's is picked: the
        one a user who just trained wants to talk to, also when an older job was picked at page load."""
        choices = adapter_choices(ctx, lang)
        adapter, picked = gr.update(choices=choices), gr.skip()
        if (current in (None, "", NO_ADAPTER) or (auto and current == auto)) and len(choices) > 1:
            adapter, picked = gr.update(choices=choices, value=choices[1][1]), choices[1][1]
        return [adapter, gr.update(choices=model_choices(ctx)), picked]

    def follow_jobs(self, ctx: StudioContext, lang: str, current: str | None, auto: str | None,
                    known: Any) -> list[Any]:
        """[adapter, model, auto, known] when the Jobs table changed (a job started, stepped or
        ended): a refresh only when the finished jobs differ from those last sent, so a job that
        finishes while the Chat tab is open is offered (and picked, as `refresh` picks) without a
        reload or a tab switch (issue 40 item 10); the polls of a running job send nothing."""
        choices = adapter_choices(ctx, lang)
        if choices == known:
            return [gr.skip()] * 4
        return [*self.refresh(ctx, lang, current, auto), choices]


def adapter_choices(ctx: StudioContext, lang: str = "en") -> list[tuple[str, str]]:
    jobs = [view.job_choice(r, lang) for r in ctx.runner.list_jobs() if view.exportable(r)]
    return [(t("chat.no_adapter", lang), NO_ADAPTER)] + jobs


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


def readable_model(ctx: StudioContext, model_id: str, lang: str = "en") -> str | None:
    """The model to load under the studio's read policy (a path typed into a web page must not
    open the server's files: jobs/checks/access.py), or None after a notice naming the field."""
    try:
        return DataAccess.for_studio(ctx.data_dir).chat_model(model_id)
    except AccessError as refused:
        gr.Warning(error_text(refused, lang))
        return None


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def respond(engine: ChatEngine, model_id: str, adapter_dir: str | None, message: str,
            tuned: list[dict[str, Any]], base: list[dict[str, Any]], sampling: Sampling,
            system: str = "", lang: str = "en", image: str | None = None, served_elsewhere: bool = False
            ) -> Iterator[tuple[str, list[dict[str, Any]], list[dict[str, Any]]]]:
    """Yield ("", tuned history, base history) as both answers stream in, side by side.
    `served_elsewhere`: the tuned model gets the base's tokenizer and template, as vLLM or PEFT serve it.

    Without an adapter only the base answers. A failure becomes a marked notice (metadata) on
    every side that was answering, kept out of later prompts.
    """
    if not (message or "").strip():
        yield gr.skip(), tuned, base
        return
    tuned, base = list(tuned or []), list(base or [])
    sides = [tuned, base] if adapter_dir else [base]
    conversations = [history_to_messages(history + [_user(message)], system) for history in sides]
    for history in sides:
        if image:   # shown in the chat; only the current turn's image reaches the model
            history.append({"role": "user", "content": {"path": image}})
        history.append(_user(message))
    yield "", tuned, base
    waiting = "" if engine.is_loaded(model_id, adapter_dir) else t("chat.loading", lang)
    if waiting and getattr(engine, "released_for", ""):  # the runner unloaded it for a job (jobs/queue/placement.py)
        waiting, engine.released_for = t("chat.reloading", lang, job=engine.released_for), ""
    for history in sides:
        history.append({"role": "assistant", "content": waiting})
    yield "", tuned, base
    use_adapter = [True, False] if adapter_dir else [False]
    try:
        for texts in engine.stream_batch(model_id, adapter_dir, conversations, sampling, use_adapter,
                                         **({"image": image} if image else {}),
                                         **({"base_template": True} if served_elsewhere else {})):
            for history, text in zip(sides, texts):
                history[-1] = {"role": "assistant", "content": text}
            yield "", tuned, base
    except Exception as exc:  # shown in the chat, the tab stays usable
        for history in sides:
            history[-1] = {"role": "assistant", "content": f"{type(exc).__name__}: {exc}",
                           "metadata": {"title": t("chat.failed_title", lang)}}
        gr.Warning(t("chat.failed", lang, error=str(exc)))
        yield "", tuned, base


def build_chat_tab(ctx: StudioContext) -> ChatTab:
    bind = ctx.page.bind
    with gr.Row():
        model = bind(gr.Dropdown(choices=[BUILTIN_MODEL], value=BUILTIN_MODEL, allow_custom_value=True,
                                 elem_id="ft-chat-model", scale=3), label="chat.model", info="chat.model_info")
        adapter = bind(gr.Dropdown(choices=[(t("chat.no_adapter"), NO_ADAPTER)], value=NO_ADAPTER,
                                   elem_id="ft-chat-adapter", scale=3), label="chat.adapter")
    with bind(gr.Accordion(open=False), label="chat.sampling"):
        with gr.Row():
            temperature = bind(gr.Slider(0.0, 2.0, value=0.7, step=0.05, elem_id="ft-chat-temperature"),
                               label="chat.temperature")
            top_p = bind(gr.Slider(0.05, 1.0, value=0.9, step=0.05, elem_id="ft-chat-top-p"), label="chat.top_p")
            max_new = bind(gr.Slider(8, 2048, value=128, step=8, elem_id="ft-chat-max-new"), label="chat.max_new")
            seed = bind(gr.Number(0, precision=0, minimum=0, elem_id="ft-chat-seed"), label="chat.seed")
        system = bind(gr.Textbox(lines=1, elem_id="ft-chat-system"), label="chat.system")
    served = bind(gr.Checkbox(value=False, elem_id="ft-chat-served"), label="chat.served", info="chat.served_info")
    with gr.Row(equal_height=True):
        tuned = bind(gr.Chatbot(elem_id="ft-chat-tuned", height=380), label="chat.tuned",
                     placeholder="chat.tuned_placeholder")
        base = bind(gr.Chatbot(elem_id="ft-chat-base", height=380), label="chat.base")
    with gr.Row():
        image = bind(gr.Image(type="filepath", sources=["upload"], elem_id="ft-chat-image", height=140, scale=1,
                              min_width=160), label="chat.image")   # for a vision-language model
        prompt = bind(gr.Textbox(show_label=False, elem_id="ft-chat-input", scale=6, lines=1),
                      placeholder="chat.prompt_placeholder")
        send = bind(gr.Button(variant="primary", elem_id="ft-chat-send", scale=1, min_width=100), value="chat.send")
        clear = bind(gr.Button(elem_id="ft-chat-clear", scale=0, min_width=80), value="chat.clear")
    auto = gr.State("")
    adapter.input(lambda _picked: "", adapter, auto, show_progress="hidden")   # the user's own pick stays
    tab = ChatTab(adapter=adapter, model=model, image=image, auto=auto, known=gr.State(None))
    _wire(ctx, tab, prompt, [tuned, base], [temperature, top_p, max_new, seed, system], [send, clear], served)
    build_serve_panel(ctx)   # the jobs over the OpenAI API, beside the chat (issue 39)
    return tab


def _wire(ctx: StudioContext, tab: ChatTab, prompt: Any, chats: list[Any], settings: list[Any],
          buttons: list[Any], served: Any) -> None:
    tuned, base = chats
    send, clear = buttons

    def on_adapter(job_id: str | None, current_model: str | None) -> Any:
        record = ctx.runner.get(job_id) if job_id and job_id != NO_ADAPTER else None
        trained_on = (record.spec or {}).get("model") if record else None
        return gr.update(value=trained_on) if trained_on else gr.update(value=current_model)

    tab.adapter.change(on_adapter, [tab.adapter, tab.model], tab.model)
    # an exported model answers alone, in the right-hand box: it is not the base model
    tab.model.change(lambda model_id, language: gr.update(label=t("chat.export" if is_export(model_id) else "chat.base",
                                                                language)),
                     [tab.model, ctx.lang], chats[1], show_progress="hidden")
    # input, not change: only the user's own pick, never the update on_adapter makes
    tab.model.input(lambda chosen: gr.update(value=NO_ADAPTER) if is_export(chosen) else gr.skip(),
                    tab.model, tab.adapter)
    ctx.lang.change(lambda language, current, auto: tab.refresh(ctx, language, current, auto)[0::2],
                    [ctx.lang, tab.adapter, tab.auto], [tab.adapter, tab.auto], show_progress="hidden",
                    **PICKER_REFRESH)

    def on_send(message, model_id, job_id, tuned_h, base_h, temp, top, max_tokens, seed_value, system_text, lang,
                image=None, served_elsewhere=False):
        model_id = (model_id or "").strip()
        if not model_id:
            gr.Warning(t("chat.pick_model", lang))
            yield gr.skip(), tuned_h, base_h
            return
        model_id = readable_model(ctx, model_id, lang)
        if model_id is None:
            yield gr.skip(), tuned_h, base_h
            return
        adapter_dir = ctx.adapter_dir(job_id) if job_id and job_id != NO_ADAPTER else None
        if job_id and job_id != NO_ADAPTER and adapter_dir is None:
            gr.Warning(t("chat.no_adapter_any_more", lang, job=job_id))
        sampling = Sampling(temperature=float(temp), top_p=float(top), max_new_tokens=int(max_tokens),
                            seed=int(seed_value or 0))
        if image and not ctx.chat.reads_images(model_id, adapter_dir):
            gr.Warning(t("chat.no_images", lang))
            image = None
        yield from respond(ctx.chat, model_id, adapter_dir, message, tuned_h, base_h, sampling,
                           system_text or "", lang, image=image, served_elsewhere=bool(served_elsewhere))

    inputs = [prompt, tab.model, tab.adapter, tuned, base, *settings, ctx.lang, tab.image, served]
    send.click(on_send, inputs, [prompt, tuned, base], api_name="chat")
    prompt.submit(on_send, inputs, [prompt, tuned, base])
    clear.click(lambda: ([], []), None, [tuned, base])
