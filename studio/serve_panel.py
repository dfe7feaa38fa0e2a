"""The Serve panel of the Chat tab (issue 39): a switch that serves the picked finished jobs over the
OpenAI-compatible API (`python -m jobs.serve`, run by studio/serve_runs.py), the URL, the model ids
and ready-to-copy curl / openai snippets once it answers, the server's log tail when it fails, and
the API keys (jobs/serve/keys.py): created (shown once), listed (never the key), revoked.

Like Unsloth Studio's served API and LM Studio's "Start server" switch, it binds 127.0.0.1 unless
the operator ticks "other machines may connect" (with a warning), and then only with a key."""
from __future__ import annotations

from typing import Any, Iterator

import gradio as gr
import pandas as pd

from jobs.serve.keys import KeyFileError, KeyStore, keys_file
from studio import jobs_view as view
from studio.context import StudioContext
from studio.i18n import t
from studio.serve_runs import LOOPBACK, ServeState, serve_process

READY_TIMEOUT_S = 600.0   # loading a large base model on a CPU takes minutes

CURL = """curl {url}/chat/completions \\
  -H "Content-Type: application/json" {auth}\\
  -d '{{"model": "{model}", "messages": [{{"role": "user", "content": "Hello!"}}]}}'"""
PYTHON = """from openai import OpenAI

client = OpenAI(base_url="{url}", api_key={key})
answer = client.chat.completions.create(model="{model}", messages=[{{"role": "user", "content": "Hello!"}}])
print(answer.choices[0].message.content)"""


def snippets(url: str, model: str, with_key: bool) -> str:
    """curl and openai-client examples that run as pasted (the key from $FUSETUNE_API_KEY)."""
    auth = '-H "Authorization: Bearer $FUSETUNE_API_KEY" ' if with_key else ""
    key = 'os.environ["FUSETUNE_API_KEY"]' if with_key else '"none"'
    python = PYTHON.format(url=url, key=key, model=model)
    if with_key:
        python = "import os\n" + python
    return f"```bash\n{CURL.format(url=url, auth=auth, model=model)}\n```\n\n```python\n{python}\n```"


def status_text(state: ServeState, lang: str, with_key: bool) -> str:
    if state.failed:
        return f"{t('serve.failed', lang)}\n\n```text\n{state.log_tail}\n```"
    if not state.running:
        return t("serve.off", lang)
    if not state.url:
        return t("serve.starting", lang)
    models = ", ".join(f"`{m}`" for m in state.models)
    text = t("serve.ready", lang, url=state.url, models=models)
    if state.host not in LOOPBACK:
        text += "\n\n" + t("serve.public_warning", lang)
    return f"{text}\n\n{snippets(state.url, state.models[-1] if state.models else 'MODEL', with_key)}"


def key_frame(store: KeyStore, lang: str) -> pd.DataFrame:
    columns = [t("serve.col_name", lang), t("serve.col_id", lang), t("serve.col_created", lang),
               t("serve.col_last_used", lang)]
    rows = [[k.name, k.id, view.format_time(k.created), view.format_time(k.last_used) or t("serve.never", lang)]
            for k in store.list()]
    return pd.DataFrame(rows, columns=columns)


def key_choices(store: KeyStore) -> list[tuple[str, str]]:
    return [(f"{k.name} · {k.id}", k.id) for k in store.list()]


def job_dirs(ctx: StudioContext, job_ids: list[str]) -> list[str]:
    records = [ctx.runner.get(job_id) for job_id in job_ids or []]
    return [str(r.job_dir) for r in records if r is not None and view.exportable(r)]


def build_serve_panel(ctx: StudioContext) -> None:
    bind = ctx.page.bind
    with bind(gr.Accordion(open=False, elem_id="ft-serve"), label="serve.title") as panel:
        bind(gr.Markdown(), value="serve.intro")
        with gr.Row():
            jobs = bind(gr.Dropdown(choices=[], multiselect=True, elem_id="ft-serve-jobs", scale=3),
                        label="serve.jobs", info="serve.jobs_info")
            port = bind(gr.Number(8000, precision=0, minimum=0, maximum=65535, elem_id="ft-serve-port", scale=1),
                        label="serve.port", info="serve.port_info")
        with gr.Row():
            public = bind(gr.Checkbox(False, elem_id="ft-serve-public"), label="serve.public",
                          info="serve.public_info")
            host = bind(gr.Textbox("0.0.0.0", elem_id="ft-serve-host", visible=False), label="serve.host")
        switch = bind(gr.Checkbox(False, elem_id="ft-serve-on"), label="serve.switch")
        status = gr.Markdown(elem_id="ft-serve-status")
        with bind(gr.Accordion(open=True, elem_id="ft-keys"), label="serve.keys"):
            with gr.Row():
                name = bind(gr.Textbox(elem_id="ft-key-name", scale=3), label="serve.key_name",
                            placeholder="serve.key_name_placeholder")
                create = bind(gr.Button(elem_id="ft-key-create", scale=1), value="serve.key_create")
            new_key = bind(gr.Textbox(elem_id="ft-key-new", interactive=False, visible=False, buttons=["copy"]),
                           label="serve.key_new", info="serve.key_new_info")
            table = gr.Dataframe(elem_id="ft-keys-table", interactive=False)
            with gr.Row():
                pick = bind(gr.Dropdown(choices=[], elem_id="ft-key-pick", scale=3), label="serve.key_pick")
                revoke = bind(gr.Button(variant="stop", elem_id="ft-key-revoke", scale=1), value="serve.key_revoke")
    public.change(lambda on: gr.update(visible=bool(on)), public, host, show_progress="hidden")
    key_outputs = [table, pick]
    panel.expand(lambda lang, picked: _refresh(ctx, lang, picked), [ctx.lang, jobs],
                 [jobs, switch, status, *key_outputs], show_progress="hidden")

    def on_switch(*values: Any) -> Iterator[tuple[Any, str]]:
        yield from _switch(ctx, *values)

    switch.input(on_switch, [switch, jobs, public, host, port, ctx.lang], [switch, status])
    create.click(lambda key_name, lang: _create(ctx, key_name, lang), [name, ctx.lang],
                 [name, new_key, *key_outputs, status])
    revoke.click(lambda key_id, lang: _revoke(ctx, key_id, lang), [pick, ctx.lang], key_outputs)


def _store(ctx: StudioContext) -> KeyStore:
    return KeyStore(keys_file(ctx.data_dir))


def _keys_view(ctx: StudioContext, lang: str) -> list[Any]:
    try:
        store = _store(ctx)
        return [key_frame(store, lang), gr.update(choices=key_choices(store), value=None)]
    except KeyFileError as exc:
        gr.Warning(str(exc))
        return [gr.skip(), gr.skip()]


def _has_keys(ctx: StudioContext) -> bool:
    try:
        return bool(_store(ctx).list())
    except KeyFileError:
        return False


def _refresh(ctx: StudioContext, lang: str, picked: list[str] | None) -> list[Any]:
    finished = [view.job_choice(r, lang) for r in ctx.runner.list_jobs() if view.exportable(r)]
    still = [p for p in picked or [] if p in {value for _, value in finished}]
    state = serve_process(ctx.data_dir).state()
    return [gr.update(choices=finished, value=still), state.running,
            status_text(state, lang, _has_keys(ctx)), *_keys_view(ctx, lang)]


def _switch(ctx: StudioContext, on: bool, job_ids: list[str], public: bool, host: str, port: Any,
            lang: str) -> Iterator[tuple[Any, str]]:
    """Switched on: check the fields, start the server and wait for its URL; off: stop it."""
    server = serve_process(ctx.data_dir)
    if not on:
        server.stop()
        yield False, t("serve.off", lang)
        return
    host = (host or "").strip() if public else "127.0.0.1"
    refusal = _refusal(ctx, job_ids, host, port, lang)
    if refusal:
        gr.Warning(refusal)
        yield False, refusal
        return
    server.start(job_dirs(ctx, job_ids), host, int(port))
    yield True, t("serve.starting", lang)
    state = server.wait_ready(READY_TIMEOUT_S)
    yield state.running, status_text(state, lang, _has_keys(ctx))


def _refusal(ctx: StudioContext, job_ids: list[str], host: str, port: Any, lang: str) -> str:
    """Why the server cannot start with these fields, or ""."""
    if not job_dirs(ctx, job_ids):
        return t("serve.pick_jobs", lang)
    if port is None or not 0 <= int(port) <= 65535:
        return t("serve.bad_port", lang)
    if not host:
        return t("serve.no_host", lang)
    if host not in LOOPBACK and not _has_keys(ctx):
        return t("serve.needs_key", lang, host=host)
    return ""


def _create(ctx: StudioContext, key_name: str, lang: str) -> list[Any]:
    try:
        _, key = _store(ctx).create(key_name)
    except OSError as exc:   # KeyFileError, or a data dir that cannot be written
        gr.Warning(str(exc))
        return [gr.skip(), gr.skip(), *_keys_view(ctx, lang), gr.skip()]
    # the running server asks for a key from now on: its snippets say how to send one
    status = status_text(serve_process(ctx.data_dir).state(), lang, True)
    return ["", gr.update(value=key, visible=True), *_keys_view(ctx, lang), status]


def _revoke(ctx: StudioContext, key_id: str | None, lang: str) -> list[Any]:
    if not key_id:
        gr.Warning(t("serve.pick_key", lang))
        return [gr.skip(), gr.skip()]
    try:
        _store(ctx).revoke(key_id)
    except OSError as exc:
        gr.Warning(str(exc))
    return _keys_view(ctx, lang)
