"""Jobs tab views: table rows, plot frames, reports from records and events.jsonl."""
from pathlib import Path

from jobs.io.events import EventWriter, read_events, summarize
from jobs.queue.store import JobRecord, JobState
from studio import jobs_view as view


def record(tmp_path: Path, state="running", job_id="j1", reason="", **spec) -> JobRecord:
    job_dir = tmp_path / job_id
    job_dir.mkdir(exist_ok=True)
    return JobRecord(id=job_id, name="tiny · identity", state=state, created_at=1.7e9,
                     job_dir=str(job_dir), spec={"max_steps": 30, **spec}, reason=reason)


def step(n, loss, gpus=(), elapsed=None):
    return dict(step=n, max_steps=30, epoch=0.1 * n, loss=loss, lr=1e-4, grad_norm=1.0,
                tokens_per_s=100.0, elapsed_s=elapsed if elapsed is not None else 2.0 * n,
                eta_s=2.0 * (30 - n), rss_gb=1.0 + n / 10, cpu_pct=10.0 * n, gpus=list(gpus))


def write(rec, *events):
    writer = EventWriter(rec.job_dir)
    for kind, fields in events:
        writer.emit(kind, **fields)
    return summarize(rec.job_dir)


def test_row_shows_last_step_and_loss(tmp_path):
    rec = record(tmp_path)
    events = write(rec, ("start", {"device": "cpu", "patch_report": []}), ("step", step(1, 2.5)),
                   ("step", step(4, 2.125)))
    assert view.job_row(rec, events)[:5] == ["j1", "tiny · identity", "running", "4/30", "2.1250"]
    done = write(rec, ("done", {"final_loss": 1.5, "adapter_dir": "x"}))
    assert view.job_row(rec, done)[4] == "1.5000"
    assert view.job_row(record(tmp_path, "queued", "j2"), summarize(tmp_path / "none"))[3:5] == ["0/30", ""]
    assert view.job_row(rec, done, "zh-CN")[2] == "运行中"


def test_a_done_job_states_its_smoothed_final_loss_with_the_eval_loss_beside_it(tmp_path):
    rec = record(tmp_path, "done")
    running = write(rec, ("start", {"device": "cpu"}), ("step", step(1, 2.5)))
    assert view.outcome_html(running) == ""
    done = write(rec, ("done", {"final_loss": 1.08, "final_loss_steps": 10, "last_loss": 2.017, "eval_loss": 1.2}))
    assert "Final loss 1.0800 (mean of the last 10 steps), eval loss 1.2000" in view.outcome_html(done)
    assert "1.0800" in view.outcome_html(done, "zh-CN") and "验证损失 1.2000" in view.outcome_html(done, "zh-CN")
    assert view.job_row(rec, done)[4] == "1.0800"   # the table shows the same smoothed value


def test_an_identity_job_states_its_held_out_check_under_the_base_template(tmp_path):
    """Issue 42: the trainer's held-out identity check (jobs/train/identity_eval.py) in the summary."""
    rec = record(tmp_path, "done")
    check = {"identity": 15, "identity_with_system": 14, "identity_total": 16, "general": 12, "general_total": 13}
    done = write(rec, ("done", {"final_loss": 1.08, "final_loss_steps": 10, "identity_heldout": check}))
    text = view.outcome_html(done)
    assert 'id="ft-identity-heldout"' in text and "15/16 answered with the name and author" in text
    assert "14/16 after a user&#x27;s system message" in text and "general answers kept: 12/13" in text
    assert "15/16" in view.outcome_html(done, "zh-CN") and "通用回答保持不变：12/13" in view.outcome_html(done, "zh-CN")
    plain = write(record(tmp_path, "done", "j2"), ("done", {"final_loss": 1.0}))
    assert "ft-identity-heldout" not in view.outcome_html(plain)


def test_plot_frames_are_numeric_even_when_empty(tmp_path):
    nothing = summarize(tmp_path / "none")
    for frame in (view.loss_frame(nothing), view.rss_frame(nothing), view.cpu_frame(nothing),
                  *view.gpu_frames(nothing)):
        assert frame.empty
        assert frame.dtypes.iloc[0].kind == "f" or frame.dtypes.iloc[0].kind == "i"
        assert frame.dtypes.iloc[1].kind == "f"
    rec = record(tmp_path)
    gpus = [{"index": 0, "util_pct": 90.0, "mem_used_gb": 10.0, "mem_total_gb": 80.0},
            {"index": 1, "util_pct": 50.0, "mem_used_gb": 5.0, "mem_total_gb": 80.0}]
    events = write(rec, ("step", step(1, 3.0, gpus)), ("step", step(2, None, gpus)), ("step", step(3, 2.0, gpus)))
    loss = view.loss_frame(events)
    assert loss["step"].tolist() == [1, 3] and loss["loss"].tolist() == [3.0, 2.0]  # null loss skipped
    assert set(loss["series"]) == {"training loss"}
    util, mem = view.gpu_frames(events)
    assert len(util) == 6 and sorted(set(util["gpu"])) == ["GPU 0", "GPU 1"]
    assert util[util["gpu"] == "GPU 1"]["util_pct"].tolist() == [50.0] * 3
    assert mem["mem_used_gb"].max() == 10.0
    assert view.rss_frame(events)["rss_gb"].tolist() == [1.1, 1.2, 1.3]
    odd = write(record(tmp_path, job_id="j9"), ("step", {**step(1, 2.0), "rss_gb": 1.827000123}))
    assert view.rss_frame(odd)["rss_gb"].tolist() == [1.83]  # what a person reads
    assert view.cpu_frame(events)[["elapsed_s", "cpu_pct"]].values.tolist() == [[2.0, 10.0], [4.0, 20.0], [6.0, 30.0]]


def test_patch_report_and_failure(tmp_path):
    rec = record(tmp_path, "failed", reason="the job reported an error")
    nothing = summarize(tmp_path / "none")
    assert "queued" in view.patch_report_text(record(tmp_path, "queued", "q"), nothing)
    assert "before the model loaded" in view.patch_report_text(rec, nothing)  # not "has not started"
    events = write(rec, ("start", {"device": "cuda:0 H200", "patch_report": ["rms_norm: triton", "rope: torch (why)"]}),
                   ("error", {"message": "CUDA out of memory: lower batch_size", "kind": "oom"}))
    assert view.patch_report_text(rec, events).splitlines() == [
        "device: cuda:0 H200", "rms_norm: triton", "rope: torch (why)"]
    text = view.failure_text(rec, events)
    assert "CUDA out of memory: lower batch_size (oom)" in text and "failed" in text
    assert "失败" in view.failure_text(rec, events, "zh-CN")
    assert view.failure_text(record(tmp_path, "done", "j3"), events) == ""
    cancelled = record(tmp_path, "cancelled", "j4", reason="cancelled by the user")
    assert "cancelled by the user" in view.failure_text(cancelled, nothing)


def test_failure_before_any_event_shows_the_store_reason(tmp_path):
    rec = record(tmp_path, "failed", reason="the training process ended with exit code 1 without reporting why")
    text = view.failure_text(rec, summarize(rec.job_dir))
    assert "exit code 1" in text


def test_eval_loss_is_its_own_series(tmp_path):
    rec = record(tmp_path)
    events = write(rec, ("step", step(1, 3.0)), ("step", step(2, 2.5)), ("eval", {"step": 2, "eval_loss": 2.7}),
                   ("step", step(2, 2.4)),  # a resumed job repeats a step: the latest counts
                   ("eval", {"step": 4, "eval_loss": None}))
    frame = view.loss_frame(events, "zh-CN")
    train = frame[frame["series"] == "训练损失"]
    evals = frame[frame["series"] == "评估损失"]
    assert train[["step", "loss"]].values.tolist() == [[1, 3.0], [2, 2.4]]
    assert evals[["step", "loss"]].values.tolist() == [[2, 2.7]]


def test_progress_numbers(tmp_path):
    rec = record(tmp_path)
    events = write(rec, ("step", step(6, 2.0)))
    numbers = view.progress_numbers(rec, events)
    assert numbers["progress"] == 0.2 and numbers["eta_s"] == 48.0 and numbers["step"] == 6


def test_exportable_needs_an_adapter(tmp_path):
    rec = record(tmp_path, "cancelled")
    assert not view.exportable(rec)
    adapter = Path(rec.job_dir) / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    assert not view.exportable(rec)  # the weights are still missing
    (adapter / "adapter_model.safetensors").write_bytes(b"")
    assert view.exportable(rec)
    rec.state = JobState.RUNNING
    assert not view.exportable(rec)


def test_event_cache_rereads_only_on_change(tmp_path):
    rec = record(tmp_path)
    calls = []

    def reader(job_dir):
        calls.append(job_dir)
        return read_events(job_dir)

    cache = view.EventCache(reader)
    assert cache.get(rec.job_dir).steps == [] and calls == []  # no file yet: nothing read
    write(rec, ("step", step(1, 2.0)))
    assert len(cache.get(rec.job_dir).steps) == 1 and len(cache.get(rec.job_dir).steps) == 1
    assert len(calls) == 1
    write(rec, ("step", step(2, 1.9)))
    assert [e["step"] for e in cache.get(rec.job_dir).steps] == [1, 2] and len(calls) == 2


def test_the_tensorboard_command_shows_for_a_job_that_reports_to_it():
    from types import SimpleNamespace

    from studio.jobs_view import tracking_html
    tracked = SimpleNamespace(spec={"report_to": ["mlflow", "tensorboard"]}, job_dir="/data/jobs/j1")
    assert "<code>tensorboard --logdir /data/jobs/j1/tensorboard</code>" in tracking_html(tracked)
    assert "TensorBoard" in tracking_html(tracked, "zh-CN")
    assert tracking_html(SimpleNamespace(spec={"report_to": "none"}, job_dir="/d")) == ""
    assert tracking_html(SimpleNamespace(spec=None, job_dir="/d")) == ""


def test_a_job_that_finished_before_its_cancel_says_so(tmp_path):
    from jobs.io.events import JobSummary
    from jobs.queue.outcome import FINISHED_BEFORE_CANCEL
    done = JobRecord(id="a", name="n", state="done", created_at=1.0, job_dir=str(tmp_path), reason=FINISHED_BEFORE_CANCEL)
    assert "finished all its steps before the cancel" in view.failure_text(done, JobSummary())
    done.reason = ""
    assert view.failure_text(done, JobSummary()) == ""
