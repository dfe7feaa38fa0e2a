"""Evaluations in the queue (jobs/queue/evaluations.py), on a made-up GPU and the fake trainer
(tests/jobs/fakes.py, which also stands in for `python -m jobs.evaluate`: the runner starts it with the
evaluation's config, and a config named `hang` runs until cancelled): an evaluation waits while a job
holds its GPU, saying so, and starts when the GPU is free; cancel works queued and running; on a
machine without GPUs it starts at once beside a training job."""
import pytest
import yaml

from jobs.io import gpus
from jobs.io.layout import EvalLayout
from jobs.queue import evaluations
from jobs.queue.runner import Runner, RunnerError
from jobs.queue.store import JobState
from jobs.spec import JobSpec
from tests.jobs.fakes import starts, write_fake_trainer
from tests.jobs.queue.queue_jobs import gpu
from tests.waiting import wait_for


def _runner(tmp_path, monkeypatch, machine):
    monkeypatch.setattr(gpus, "read_gpus", lambda: machine)
    runner = Runner(tmp_path / "data", python=str(write_fake_trainer(tmp_path)))
    folder = tmp_path / "data" / "jobs" / "trained"
    folder.mkdir(parents=True)
    runner.store.add("trained", "tiny · chat", folder, {"model": "x"}, state=JobState.DONE)
    return runner


def _settled(runner, job_id):
    runner.reconcile()
    return runner.store.get(job_id).finished and runner.store.get(job_id)


def test_an_evaluation_waits_while_a_job_holds_the_gpu_then_starts(tmp_path, monkeypatch):
    runner = _runner(tmp_path, monkeypatch, [gpu(0)])
    busy = runner.submit(JobSpec(name="hang"))
    assert runner.get(busy.id).state == "running"
    evaluation = runner.submit_evaluation("trained", {"name": "e1", "max_new_tokens": 8})
    waiting = runner.get(evaluation.id)
    assert waiting.state == "queued" and "GPU 0 is in use by job 'hang'" in waiting.reason
    assert starts(waiting.job_dir) == []
    assert [r.id for r in runner.list_jobs()] == [busy.id, "trained"]   # an evaluation is not a job
    assert [r.id for r in runner.list_evaluations("trained")] == [evaluation.id]

    assert runner.cancel(busy.id)
    done = wait_for(lambda: _settled(runner, evaluation.id), timeout=60, interval=0.1)
    assert done.state == "done" and len(starts(done.job_dir)) == 1, done.reason
    layout = EvalLayout(done.job_dir)
    assert layout.root == tmp_path / "data" / "jobs" / "trained" / "evaluations" / "e1"
    config = yaml.safe_load(layout.config.read_text())
    assert config["gpus"] == "0" and config["max_new_tokens"] == 8 and config["job"] == str(layout.root.parent.parent)
    assert runner.gpu_inventory()[0].busy_by_jobs == ()


def test_the_job_queued_after_a_running_evaluation_waits_for_it(tmp_path, monkeypatch):
    runner = _runner(tmp_path, monkeypatch, [gpu(0)])
    evaluation = runner.submit_evaluation("trained", {"name": "hang"})
    assert runner.get(evaluation.id).state == "running"
    job = runner.get(runner.submit(JobSpec(name="after")).id)
    assert job.state == "queued" and "evaluation of tiny · chat" in job.reason
    assert runner.cancel(evaluation.id)
    cancelled = wait_for(lambda: _settled(runner, evaluation.id), timeout=60, interval=0.1)
    assert cancelled.state == "cancelled"
    wait_for(lambda: _settled(runner, job.id), timeout=60, interval=0.1)


def test_cancel_while_waiting_never_starts_it(tmp_path, monkeypatch):
    runner = _runner(tmp_path, monkeypatch, [gpu(0)])
    busy = runner.submit(JobSpec(name="hang"))
    evaluation = runner.submit_evaluation("trained", {"name": "e2"})
    assert runner.cancel(evaluation.id) and runner.get(evaluation.id).state == "cancelled"
    runner.cancel(busy.id)
    wait_for(lambda: _settled(runner, busy.id), timeout=60, interval=0.1)
    runner.reconcile()
    assert runner.get(evaluation.id).state == "cancelled" and starts(evaluation.job_dir) == []


def test_without_gpus_it_starts_at_once_beside_a_training_job(tmp_path, monkeypatch):
    runner = _runner(tmp_path, monkeypatch, [])
    busy = runner.submit(JobSpec(name="hang"))
    evaluation = runner.submit_evaluation("trained", {"name": "hang"})
    assert runner.get(busy.id).state == runner.get(evaluation.id).state == "running"
    with pytest.raises(RunnerError, match="has an evaluation running"):   # it reads the job's folder
        runner.delete("trained")
    for record in (busy, evaluation):
        runner.cancel(record.id)
        assert wait_for(lambda: _settled(runner, record.id), timeout=60, interval=0.1).state == "cancelled"
    assert runner.delete("trained") and runner.list_evaluations("trained") == []


def test_a_stopped_evaluation_is_cancelled_with_its_rows_kept(tmp_path):
    from jobs.queue.store import JobRecord
    record = JobRecord(id="e", name="n", state="running", created_at=0, job_dir=str(tmp_path),
                       spec={"kind": "evaluate"})
    assert evaluations.ended(record, {"type": "done", "rows": 3, "cancelled": True}, "exit code 130") == (
        JobState.CANCELLED, "cancelled: the 3 rows scored before it are kept, with their table")
    assert evaluations.ended(record, {"type": "done", "rows": 3, "cancelled": False}, "") is None
    assert "see evaluate.log" in evaluations.ended(record, None, "exit code 1")[1]
    EvalLayout(tmp_path).cancel_request.write_text("1")   # killed by the cancel before it could say
    assert evaluations.ended(record, None, "signal SIGTERM") is None
    assert evaluations.ended(JobRecord(id="j", name="n", state="running", created_at=0, job_dir="/x"), None, "") is None
