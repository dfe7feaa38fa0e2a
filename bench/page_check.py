"""The studio page on a machine, driven as a user drives it, as a repeatable check.

Starts `python app.py` on a free port with a fresh data dir, then calls the same Gradio endpoints
the page's buttons call (gradio_client; the events are named in studio/: start_job, job_detail,
chat, export, ask_cancel and job_action): Start the default job (fused kernels on a GPU), follow it in the Jobs tab until it
is done (progress, loss, and on a GPU the utilisation and memory series), chat with base and tuned
side by side, export the adapter and a GGUF, then Start a second job right after chatting (the
chat model is loaded in the studio's process: the job must start, not wait for good) and cancel it. One JSON
line per stage (ok, seconds, what was seen) goes to --out; the exit status is 0 when all passed.

    python bench/page_check.py                  # on the GPU machine: the default job, fused kernels
    python bench/page_check.py --smoke          # on CPU: the built-in model, a few steps
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
ENDPOINTS = ("/on_load", "/start_job", "/after_start", "/job_detail", "/chat", "/export", "/ask_cancel",
             "/job_action")
FINISHED = ("done", "failed", "cancelled")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class AppDidNotStart(RuntimeError):
    """`python app.py` exited or did not answer in time; the message ends with its log's tail."""


@contextlib.contextmanager
def running_app(data_dir: Path, log_path: Path, timeout_s: float, allow: list[str] = (), extra: list[str] = ()):
    """`python app.py` on a free port (reading also the folders in `allow`, with the further flags in
    `extra`); yields its URL once the page answers. tests/e2e starts the studio through this too."""
    port = free_port()
    extra = [*(arg for folder in allow for arg in ("--allow-dir", folder)), *extra]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONUNBUFFERED": "1"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "app.py", "--port", str(port), "--data-dir", str(data_dir), *extra],
                                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.time() + timeout_s
        while True:
            try:
                urllib.request.urlopen(url, timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    raise AppDidNotStart("the app did not come up:\n" + log_path.read_text(errors="replace")[-3000:])
                time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def form_values(overrides: dict) -> list:
    """The Train form's values as the page sends them (studio/train_tab.py `_component`): the
    JobSpec defaults, number fields as text, with `overrides` by JobSpec key."""
    from studio import form
    values = []
    for name in form.form_names():
        widget = next(w for w in form.field_widgets() if w.name == name)
        value = overrides.get(name, widget.default)
        if widget.kind in form.NUMBER_KINDS and not isinstance(value, str):
            value = form.number_text(value)
        elif widget.kind == "text":
            value = str(value)
        values.append(value)
    return values


class PageCheck:
    """The stages, each timed and recorded; a failed stage records why and the next ones go on
    where they can."""

    def __init__(self, client, args, out: Path):
        self.client, self.args, self.out = client, args, out
        self.rows: list[dict] = []

    def record(self, stage: str, ok: bool, began: float, **detail) -> dict:
        row = {"stage": stage, "ok": bool(ok), "seconds": round(time.time() - began, 2),
               "mode": "smoke" if self.args.smoke else "gpu", "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
               **detail}
        self.rows.append(row)
        with self.out.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(row, default=str) + "\n")
        print(("PASS " if ok else "FAIL ") + json.dumps(row, default=str)[:600], flush=True)
        return row

    def stage(self, name: str, action):
        began = time.time()
        try:
            ok, detail = action()
        except Exception as exc:
            ok, detail = False, {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-1500:]}
        return self.record(name, ok, began, **detail)

    # ---- the stages ------------------------------------------------------------------------
    def endpoints(self):
        named = set(self.client.view_api(print_info=False, return_format="dict")["named_endpoints"])
        missing = [e for e in ENDPOINTS if e not in named]
        return not missing, {"missing": missing}

    def start(self, name: str):
        overrides = {"name": name, "model": self.args.model, "max_steps": self.args.steps, "save_steps": 0,
                     "fused_kernels": not self.args.smoke}
        if self.args.max_gpu_memory_gb:
            overrides["max_gpu_memory_gb"] = self.args.max_gpu_memory_gb
        # the config Start warned about is session state (gr.State, not an API input): a second
        # press in the same session is the page's "Start anyway"
        status, job_id, *_ = self.client.predict("en", *form_values(overrides), api_name="/start_job")
        if not job_id:
            status, job_id, *_ = self.client.predict("en", *form_values(overrides), api_name="/start_job")
        if job_id:   # what the page does next: the Jobs tab opens with the new job picked
            self.client.predict(job_id, "en", api_name="/after_start")
        self.job_ids.append(job_id)
        return bool(job_id), {"job_id": job_id, "status": _text(status)[:300]}

    def detail(self, job_id: str) -> dict:
        out = self.client.predict(job_id, "en", api_name="/job_detail")
        table, progress, loss, gpu_util, gpu_mem = out[0], out[2], out[4], out[7], out[8]
        row = _table_row(table, job_id)
        return {"state": row.get("state", ""), "row": row, "progress": _text(progress)[:200],
                "loss_points": _points(loss), "gpu_util_points": _points(gpu_util), "gpu_mem_points": _points(gpu_mem)}

    def follow(self, job_id: str):
        began, first_step, seen = time.time(), None, {}
        while time.time() - began < self.args.job_timeout:
            seen = self.detail(job_id)
            if first_step is None and seen["loss_points"]:
                first_step = round(time.time() - began, 2)
            if seen["state"] in FINISHED:
                break
            time.sleep(2)
        series = seen.get("loss_points", 0) > 0
        gpu_series = self.args.smoke or (seen.get("gpu_util_points", 0) > 0 and seen.get("gpu_mem_points", 0) > 0)
        ok = seen.get("state") == "done" and series and gpu_series
        return ok, {**seen, "first_loss_s": first_step}

    def page_load(self) -> None:
        """What a (re)load of the page runs: the job lists of every tab, the chat's adapters."""
        self.client.predict("en", api_name="/on_load")

    def chat(self, job_id: str):
        self.page_load()
        _, tuned, base = self.client.predict("Who are you?", self.args.model, job_id, [], [], 0.0, 0.9, 32, 0, "",
                                             "en", api_name="/chat")
        answers = {"tuned": _last_answer(tuned), "base": _last_answer(base)}
        failed = any(m.get("metadata") for m in (tuned or []) + (base or []) if isinstance(m, dict))
        return all(answers.values()) and not failed, answers

    def export(self, job_id: str, fmt: str):
        self.page_load()
        result, files = self.client.predict(job_id, fmt, "q8_0", "en", api_name="/export")
        files = _value(files) or []
        names = [Path(f if isinstance(f, str) else f.get("orig_name") or f.get("path") or "").name for f in files]
        wanted = ".gguf" if fmt == "gguf" else ".zip"
        return any(n.endswith(wanted) for n in names), {"files": names, "result": _text(result)[:300]}

    def second_job_starts(self):
        ok, detail = self.start("second after chat")
        if not ok:
            return False, detail
        job_id, began, seen = detail["job_id"], time.time(), {}
        while time.time() - began < self.args.start_timeout:
            seen = self.detail(job_id)
            if seen["state"] and seen["state"] != "queued":
                break
            time.sleep(2)
        return seen.get("state") not in ("", "queued", "failed"), {"job_id": job_id, **seen}

    def cancel(self, job_id: str):
        """The Jobs tab's Cancel: the button asks, Yes acts (the question is session state)."""
        self.client.predict(job_id, "en", api_name="/ask_cancel")
        self.client.predict(1, "en", api_name="/job_action")  # more_steps: hidden, read only by Continue
        began, seen = time.time(), {}
        while time.time() - began < 120:
            seen = self.detail(job_id)
            if seen["state"] in FINISHED:
                break
            time.sleep(2)
        return seen.get("state") in ("cancelled", "done"), seen

    def run(self) -> bool:
        self.job_ids: list[str] = []
        if not self.stage("endpoints", self.endpoints)["ok"]:
            return False
        self.page_load()
        started = self.stage("start_job", lambda: self.start("page check"))
        job_id = started.get("job_id")
        if not job_id:
            return False
        followed = self.stage("follow_job", lambda: self.follow(job_id))
        if followed["ok"]:
            self.stage("chat_base_and_tuned", lambda: self.chat(job_id))
            self.stage("export_adapter", lambda: self.export(job_id, "adapter"))
            self.stage("export_gguf", lambda: self.export(job_id, "gguf"))
        second = self.stage("second_job_after_chat", self.second_job_starts)
        if second.get("job_id"):   # a job must not outlive the check's data dir
            self.stage("cancel_second_job", lambda: self.cancel(second["job_id"]))
        return all(row["ok"] for row in self.rows)


def _text(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str) if value is not None else ""


def _value(output):
    """An output's value: gradio_client hands a gr.update(...) over as {"__type__": "update", "value": ...}."""
    if isinstance(output, dict) and output.get("__type__") == "update":
        return output.get("value")
    return output


def _table_row(table, job_id: str) -> dict:
    """The Jobs table's row of `job_id` as {header (lower case): cell}."""
    table = _value(table)
    if isinstance(table, dict) and "headers" in table:
        headers = [str(h).lower() for h in table["headers"]]
        for row in table.get("data") or []:
            if row and str(row[0]) == job_id:
                return dict(zip(headers, row))
    return {}


def _points(plot) -> int:
    """How many points a LinePlot's value holds ({"columns": ..., "data": [...]})."""
    plot = _value(plot)
    return len(plot.get("data") or []) if isinstance(plot, dict) else 0


def _last_answer(history) -> str:
    for message in reversed(history or []):
        if isinstance(message, dict) and message.get("role") == "assistant" and not message.get("metadata"):
            content = message.get("content")
            if isinstance(content, list):
                content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
            return str(content or "").strip()
    return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="CPU: the built-in model, fused kernels off, few steps")
    parser.add_argument("--steps", type=int, default=None, help="max_steps of each job (default 60, smoke 3)")
    parser.add_argument("--model", default=None,
                        help="the jobs' and the chat's model (default: the built-in model); a folder is "
                             "passed to app.py with --allow-dir (on the device: `bench/bench_job.py prepare "
                             "--shape smollm2-135m` builds one, the built-in model's wheel is too big to carry)")
    parser.add_argument("--max-gpu-memory-gb", type=float, default=0.0)
    parser.add_argument("--job-timeout", type=float, default=900.0)
    parser.add_argument("--start-timeout", type=float, default=180.0, help="how long the second job may stay queued")
    parser.add_argument("--data-dir", type=Path, default=None, help="default: a fresh temporary folder")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "page_check.jsonl")
    args = parser.parse_args(argv)
    from jobs.spec import BUILTIN_MODEL
    args.steps = args.steps or (3 if args.smoke else 60)
    args.model = args.model or BUILTIN_MODEL
    allow = [str(Path(args.model).resolve().parent)] if Path(args.model).is_dir() else []
    if allow:
        args.model = str(Path(args.model).resolve())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    from gradio_client import Client
    with tempfile.TemporaryDirectory(prefix="page-check-") as scratch:
        data_dir, log = args.data_dir or Path(scratch) / "data", Path(scratch) / "app.log"
        began = time.time()
        check = PageCheck(None, args, args.out)
        try:
            with running_app(data_dir, log, timeout_s=300, allow=allow) as url:
                check.client = Client(url, verbose=False)
                check.record("app_up", True, began, url=url)
                passed = check.run()
        except RuntimeError as exc:   # the app did not come up: its log says why
            check.record("app_up", False, began, error=str(exc)[-1500:])
            passed = False
        if not passed and log.is_file():
            print(log.read_text(errors="replace")[-3000:], file=sys.stderr)
        check.record("all", passed, began, stages=len(check.rows))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
