"""The rule for code at Start (issue 36 item 1): a .py file uploaded through Gradio's real upload
route lands in the data dir's upload cache; with an --allow-dir that contains the data dir, naming
it as reward_file is refused at Start, naming the field and the fix, and nothing is queued."""
import shutil
from pathlib import Path

import gradio as gr
import httpx
import pytest

import app
from jobs.checks.access import ALLOW_DIRS_ENV, ALLOW_REWARD_CODE_ENV
from studio.route_guard import launch_kwargs
from studio.start_check import StartCheck
from studio.train_start import start_job
from tests.asgi_call import run_coroutine
from tests.studio.fakes import RecordingRunner
from tests.studio.form_fill import form_values

REWARD = b"import pathlib\npathlib.Path(__file__).with_suffix('.ran').write_text('ran')\n\n" \
         b"def r(prompts, completions, **kw):\n    return [0.0] * len(completions)\n"


def upload_through_the_page(data_dir, monkeypatch) -> Path:
    """POST /gradio_api/upload on Gradio's own app, guarded as app.py guards it; the cached file's path."""
    from gradio.routes import App
    cache = data_dir / "cache" / "gradio"
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(cache))   # where app.py puts Gradio's cache (jobs/io/paths.py)
    with gr.Blocks() as demo:
        gr.UploadButton()
    demo.max_file_size = None
    gradio_app = App.create_app(demo, app_kwargs=launch_kwargs(app.guards(None, str(cache), 10))["app_kwargs"])

    async def go():
        transport = httpx.ASGITransport(app=gradio_app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            return await http.post("/gradio_api/upload", files={"files": ("rewards.py", REWARD)})
    response = run_coroutine(go)
    assert response.status_code == 200, response.text
    uploaded = Path(response.json()[0])
    assert uploaded.is_file() and uploaded.is_relative_to(data_dir)
    return uploaded


def start_grpo(data_dir, reward_file, lang="en"):
    runner = RecordingRunner()
    names, values = form_values(data_dir, method="grpo", dataset="builtin:arithmetic", reward_file=str(reward_file))
    with pytest.warns(UserWarning):
        result = start_job(runner, StartCheck(data_dir, free_memory=lambda _i: None), names, values, lang=lang)
    return result, runner


def test_an_upload_named_as_reward_file_is_refused_at_start_even_inside_an_allowed_dir(data_dir, monkeypatch):
    monkeypatch.setenv(ALLOW_DIRS_ENV, str(data_dir.parent))   # the operator allowed a folder holding the data dir
    monkeypatch.delenv(ALLOW_REWARD_CODE_ENV, raising=False)
    uploaded = upload_through_the_page(data_dir, monkeypatch)
    result, runner = start_grpo(data_dir, uploaded)
    assert result.job_id == "" and runner.submitted == []
    assert "reward_file" in result.status and "never runs such a file as code" in result.status
    assert "--allow-reward-code" in result.status and str(data_dir / "rewards") in result.status
    chinese, _ = start_grpo(data_dir, uploaded, lang="zh-CN")
    assert "从不把这样的文件当作代码运行" in chinese.status
    assert not uploaded.with_suffix(".ran").exists()


def test_the_same_file_in_the_operators_reward_folder_passes_the_rule(data_dir, monkeypatch):
    """The fix the message names works: the check that refused the upload lets the operator's file by."""
    monkeypatch.delenv(ALLOW_REWARD_CODE_ENV, raising=False)
    own = data_dir / "rewards" / "mine.py"
    own.parent.mkdir(exist_ok=True)
    own.write_bytes(REWARD)
    names, values = form_values(data_dir, method="grpo", dataset="builtin:arithmetic", reward_file=str(own))
    spec = StartCheck(data_dir, free_memory=lambda _i: None).spec(names, values)
    assert spec.reward_file == str(own.resolve())
    uploads = data_dir / "rewards" / "uploads"   # where the page's reward button stores, with the flag only
    uploads.mkdir(exist_ok=True)
    shutil.copy(own, uploads / "up.py")
    result, _ = start_grpo(data_dir, uploads / "up.py")
    assert "--allow-reward-code" in result.status and "uploaded through the page" in result.status
    monkeypatch.setenv(ALLOW_REWARD_CODE_ENV, "1")
    values[names.index("reward_file")] = str(uploads / "up.py")
    assert StartCheck(data_dir, free_memory=lambda _i: None).spec(names, values).reward_file.endswith("up.py")
