"""The Jobs tab's poll: everything from disk, and only what changed is re-sent."""
from jobs.events import EventWriter
from jobs.store import JobRecord
from studio.context import StudioContext
from studio.jobs_tab import EMPTY_DETAIL, refresh


class ListRunner:
    def __init__(self, records):
        self.records = records

    def list_jobs(self):
        return list(self.records)

    def get(self, job_id):
        return next((r for r in self.records if r.id == job_id), None)


def is_skip(value):
    return value == {"__type__": "update"}


def step(n):
    return dict(step=n, max_steps=10, loss=3.0 - n / 10, elapsed_s=float(n), eta_s=10.0 - n, rss_gb=1.0, gpus=[])


def test_refresh_reads_disk_and_skips_unchanged_parts(tmp_path):
    job_dir = tmp_path / "a"
    rec = JobRecord(id="a", name="tiny", state="running", created_at=1.7e9, job_dir=str(job_dir), spec={})
    writer = EventWriter(job_dir)
    writer.emit("start", device="cpu", patch_report=["rms_norm: torch"])
    writer.emit("step", **step(1))
    ctx = StudioContext(data_dir=tmp_path, runner=ListRunner([rec]))

    out = refresh(ctx, None, None, None)
    table, select, progress, failure, loss, rss, cpu, gpu_util, gpu_mem, report, log, cancel, t_sig, d_sig = out
    assert table["value"][0][:4] == ["a", "tiny", "running", "1/10"]
    assert select["value"] == "a"
    assert 'data-step="1"' in progress and loss["step"].tolist() == [1]
    assert gpu_util["visible"] is False and cancel["interactive"] is True
    assert "rms_norm: torch" in report

    again = refresh(ctx, "a", t_sig, d_sig)
    assert all(is_skip(v) for v in again[:12])

    writer.emit("step", **step(2))
    moved = refresh(ctx, "a", t_sig, d_sig)
    assert 'data-step="2"' in moved[2] and moved[4]["loss"].tolist() == [2.9, 2.8]
    assert not is_skip(moved[0])  # the table's step column changed too

    rec.state = "done"
    finished = refresh(ctx, "a", moved[-2], moved[-1])
    assert finished[11]["interactive"] is False and 'data-state="done"' in finished[2]


def test_refresh_with_no_jobs(tmp_path):
    ctx = StudioContext(data_dir=tmp_path, runner=ListRunner([]))
    out = refresh(ctx, "gone", None, None)
    assert out[1]["value"] is None and out[2:12] == EMPTY_DETAIL
