"""The Chat tab's Serve panel without a browser: it refuses another address than 127.0.0.1 while no
API key exists, and a server that cannot start (a job whose adapter is not a real one) ends with the
log's last lines shown and the switch back off. The served path is in tests/e2e/test_serve_browser.py."""
from pathlib import Path

from jobs.io.layout import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from jobs.queue.store import JobRecord, JobState
from jobs.serve.keys import KeyStore, keys_file
from studio.context import StudioContext
from studio.serve_panel import _refusal, _switch
from tests.studio.fakes import ListRunner


def _ctx(tmp_path: Path) -> StudioContext:
    job = tmp_path / "jobs" / "job-1"
    (job / "adapter").mkdir(parents=True)
    for name in (ADAPTER_WEIGHTS, ADAPTER_CONFIG):
        (job / "adapter" / name).write_text("{}")
    record = JobRecord(id="job-1", name="n", state=JobState.DONE, created_at=0.0, job_dir=str(job))
    return StudioContext(data_dir=tmp_path / "data", runner=ListRunner([record]))


def test_another_address_needs_a_key(tmp_path):
    ctx = _ctx(tmp_path)
    assert _refusal(ctx, ["job-1"], "127.0.0.1", 0, "en") == ""
    assert "without an API key" in _refusal(ctx, ["job-1"], "0.0.0.0", 0, "en")
    assert "没有 API 密钥" in _refusal(ctx, ["job-1"], "0.0.0.0", 0, "zh-CN")
    KeyStore(keys_file(ctx.data_dir)).create("remote")
    assert _refusal(ctx, ["job-1"], "0.0.0.0", 0, "en") == ""
    assert "finished job" in _refusal(ctx, [], "127.0.0.1", 0, "en")


def test_a_server_that_fails_shows_its_log_and_switches_off(tmp_path):
    ctx = _ctx(tmp_path)
    steps = list(_switch(ctx, True, ["job-1"], False, "", 0, "en"))
    assert steps[0][0] is True and "Starting" in steps[0][1]
    on, status = steps[-1]
    assert on is False and "stopped" in status and "error:" in status and "Traceback" not in status
