"""Fault injection: two studios racing on one data dir, failed spawns, a dying monitor, broken job
files, zombies, a full disk during a checkpoint and a trainer killed mid-run. After each, every job
is in exactly one finished state and its files say the same thing (issue 12)."""
from __future__ import annotations

import errno
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import yaml

from jobs.queue import procs
from jobs.io.events import summarize
from jobs.io.layout import JobLayout
from jobs.queue.runner import Runner, RunnerError
from jobs.spec import JobSpec
from jobs.queue.store import FINISHED, JobState, JobStore
from tests.conftest import ROOT
from tests.jobs.fakes import starts, write_fake_trainer
from tests.waiting import wait_for


@pytest.fixture
def fake(tmp_path):
    return str(write_fake_trainer(tmp_path))


def assert_files_match_states(store: JobStore, trained: bool = False) -> None:
    """Every job finished, nothing half-written, no trainer alive, and the state agrees with the
    job's own events (and, for real training, with its adapter)."""
    for record in store.list():
        layout = JobLayout(record.job_dir)
        assert record.state in FINISHED, (record.id, record.state)
        assert not layout.partials(), layout.partials()
        assert not procs.is_trainer_of(record.pid, record.job_dir)
        final = summarize(record.job_dir).final
        if record.state == JobState.DONE:
            assert final and final["type"] == "done" and record.reason == ""
            assert layout.has_adapter() or not trained
        elif record.state == JobState.FAILED:
            assert record.reason and (final is None or final["type"] == "error")
            assert not layout.has_adapter()
        else:
            assert record.reason and (layout.cancel_request.exists() or not starts(record.job_dir))


def zombie_children() -> list[psutil.Process]:
    return [p for p in psutil.Process().children() if p.status() == psutil.STATUS_ZOMBIE]


def test_two_runners_racing_on_one_data_dir_start_each_job_exactly_once(tmp_path, fake):
    data, go, rounds = tmp_path / "data", tmp_path / "go", 20
    JobStore(data / "jobs.sqlite")
    env = {**os.environ, "FAKE_TRAINER_SECONDS": "0.02"}
    workers = [subprocess.Popen([sys.executable, "-m", "tests.jobs.fakes", "race", str(data), fake, str(rounds),
                                 str(go)], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    owners = {w.stdout.readline().strip() for w in workers}
    go.touch()
    for worker in workers:
        assert worker.wait(timeout=150) == 0
    store = JobStore(data / "jobs.sqlite")
    records = store.list()
    assert len(records) == 2 * rounds
    for record in records:
        assert record.state == JobState.DONE, (record.state, record.reason)
        assert len(starts(record.job_dir)) == 1, record.id
    assert {r.owner for r in records} == owners  # both instances won claims; each job has one owner
    runs = sorted((float(s.split()[1]), float(e.split()[1])) for r in records
                  for s, e in zip(starts(r.job_dir), (Path(r.job_dir) / "ends").read_text().splitlines()))
    for (_, previous_end), (start, _) in zip(runs, runs[1:]):
        assert start >= previous_end  # max_running=1 held across both instances
    assert_files_match_states(store)


def test_a_failed_spawn_fails_that_job_with_the_reason_and_the_queue_moves_on(tmp_path, fake):
    broken = Runner(tmp_path, python=str(tmp_path / "no-such-python"))
    first = broken.submit(JobSpec(name="a"))
    second = broken.submit(JobSpec(name="b"))
    for record in (first, second):
        assert record.state == JobState.FAILED
        assert "could not start the trainer" in record.reason and "no-such-python" in record.reason
    assert "could not start the trainer" in JobLayout(first.job_dir).log.read_text()
    restarted = Runner(tmp_path, python=fake)  # as after fixing it and restarting: loads work, jobs run
    assert len(restarted.list_jobs()) == 2
    third = restarted.submit(JobSpec(name="c"))
    assert wait_for(lambda: restarted.get(third.id).state == JobState.DONE, timeout=60)
    assert_files_match_states(restarted.store)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the death we inject
def test_the_monitor_survives_errors_and_is_restarted_when_it_dies(tmp_path, fake, capfd):
    runner = Runner(tmp_path, python=fake)
    real_claim, failures = runner.store.claim, [sqlite3.OperationalError("database or disk is full")] * 3

    def flaky_claim(*args):
        if failures:
            raise failures.pop()
        return real_claim(*args)
    runner.store.claim = flaky_claim
    runner.start_monitor(interval_s=0.02)
    try:
        first = runner.submit(JobSpec(name="m"))  # its own reconcile fails quietly; the monitor retries
        assert wait_for(lambda: runner.store.get(first.id).state == JobState.DONE, timeout=60)
        assert "database or disk is full" in capfd.readouterr().err

        real_reconcile = runner.reconcile
        runner.reconcile = lambda: (_ for _ in ()).throw(SystemExit("the thread dies"))
        wait_for(lambda: not runner._monitor.is_alive(), timeout=60, interval=0.02)
        runner.reconcile = real_reconcile
        runner.list_jobs()  # a page load notices the dead monitor and restarts it
        assert runner.monitor_restarts == 1 and runner._monitor.is_alive()
        second = runner.store.add("later", "later", tmp_path / "jobs" / "later", {})
        (tmp_path / "jobs" / "later").mkdir()
        (tmp_path / "jobs" / "later" / "config.yaml").write_text("name: later\n")
        assert wait_for(lambda: runner.store.get(second.id).state == JobState.DONE, timeout=60)
    finally:
        runner.shutdown()


def test_one_broken_job_never_breaks_a_page_load(tmp_path, fake):
    runner = Runner(tmp_path, python=fake, max_running=5)
    jobs = [runner.submit(JobSpec(name=f"job{i}")) for i in range(4)]
    wait_for(lambda: all(r.finished for r in runner.list_jobs()), timeout=60, interval=0.05)
    with sqlite3.connect(tmp_path / "jobs.sqlite") as db:
        db.execute("UPDATE jobs SET spec = '{not json' WHERE id = ?", (jobs[0].id,))
        db.execute("UPDATE jobs SET state = 'exploded' WHERE id = ?", (jobs[1].id,))
    events = JobLayout(jobs[2].job_dir).events
    events.unlink()
    events.mkdir()  # unreadable as a file
    JobLayout(jobs[3].job_dir).events.write_bytes(b'\xff\xfe\x00garbage\n{"type": "step"}\n[1, 2]\n')
    dead = subprocess.Popen(["true"])
    dead.wait()
    stuck = runner.store.add("stuck", "stuck", jobs[2].job_dir, {})  # "running" with a trainer long gone
    runner.store.transition("stuck", (JobState.QUEUED,), state=JobState.RUNNING, pid=dead.pid, owner="elsewhere:1:x")

    listed = {r.id: r for r in runner.list_jobs()}
    assert len(listed) == 5
    assert listed[jobs[0].id].spec == {}
    assert listed[jobs[1].id].state == JobState.FAILED and "exploded" in listed[jobs[1].id].reason
    assert listed[stuck.id].state == JobState.FAILED and "without reporting why" in listed[stuck.id].reason
    assert summarize(jobs[2].job_dir).steps == [] and summarize(jobs[3].job_dir).steps == []
    assert all(runner.get(job_id) is not None for job_id in listed)


def test_no_zombies_when_another_instance_finishes_our_jobs(tmp_path, fake, monkeypatch):
    release = tmp_path / "release"
    monkeypatch.setenv("FAKE_TRAINER_WAIT_FOR", str(release))  # all four run until released
    mine, other = Runner(tmp_path, python=fake, max_running=4), Runner(tmp_path, python=fake, max_running=4)
    records = [mine.submit(JobSpec(name="z")) for _ in range(4)]
    assert all(r.pid and r.state == JobState.RUNNING for r in records)
    release.touch()
    wait_for(lambda: len(zombie_children()) == 4, timeout=60, interval=0.05)
    assert all(r.state == JobState.DONE for r in other.list_jobs())  # finished by the other instance
    mine.reconcile()
    assert zombie_children() == [] and mine._children == {}


def test_cancel_and_delete_act_only_on_the_job_given(tmp_path, fake):
    runner = Runner(tmp_path, python=fake)
    running = runner.submit(JobSpec(name="hang"))
    queued = runner.submit(JobSpec(name="hang"))
    removed = runner.submit(JobSpec(name="hang"))
    assert (running.state, queued.state) == (JobState.RUNNING, JobState.QUEUED)
    assert runner.cancel(queued.id) and runner.get(queued.id).state == JobState.CANCELLED
    assert runner.delete(removed.id) and runner.get(removed.id) is None
    assert not Path(removed.job_dir).exists()
    assert runner.get(running.id).state == JobState.RUNNING and procs.is_trainer_of(running.pid, running.job_dir)
    with pytest.raises(RunnerError, match="cancel it first"):
        runner.delete(running.id)
    assert runner.cancel(running.id)
    final = wait_for(lambda: (r := runner.get(running.id)).finished and r, timeout=60)
    assert final.state == JobState.CANCELLED and final.reason == "cancelled by the user"
    assert runner.get(queued.id).pid is None and starts(queued.job_dir) == []
    assert_files_match_states(runner.store)
    assert runner.delete(running.id) and not Path(running.job_dir).exists()
    assert [r.id for r in runner.list_jobs()] == [queued.id]
    assert runner.delete("no-such-job") is False


def test_a_full_disk_during_a_checkpoint_is_an_io_error_and_the_last_checkpoint_resumes(
        tmp_path, tiny_model, monkeypatch, capsys, in_process_cli):
    import torch

    from jobs.train import cli as train
    out, real_save, saves = tmp_path / "job", torch.save, []

    def disk_fills_up(obj, path, *args, **kwargs):
        optimizer = Path(path).name == "optim.pt"  # one a checkpoint (its rng_state.pt is saved beside it)
        if optimizer:
            saves.append(path)
        if optimizer and len(saves) == 2:  # the second checkpoint: half a file, then ENOSPC, as a full disk does
            Path(path).write_bytes(b"\0" * 100)
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_save(obj, path, *args, **kwargs)
    monkeypatch.setattr(torch, "save", disk_fills_up)
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump({"model": str(tiny_model), "output_dir": str(out), "max_steps": 6,
                                      "save_steps": 2, "max_seq_length": 64, "learning_rate": 5e-3}))
    cli = [str(config), "--data-dir", str(tmp_path / "data")]
    assert train.main(cli) == train.EXIT_IO
    final = summarize(out).final
    assert final["kind"] == "io" and "No space left on device" in final["message"]
    assert str(out / "checkpoints") in final["message"] and "free on that disk" in final["message"]
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"fusetune: {final['message']}"
    assert JobLayout(out).partials() == []
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-2"]  # the last good one
    assert "No space left on device" in JobLayout(out).log.read_text()  # a CLI run writes train.log

    monkeypatch.setattr(torch, "save", real_save)
    assert train.main(cli + ["--resume_from", str(out / "checkpoints" / "step-2")]) == 0
    summary = summarize(out)  # resumed into the same folder: each step once, the new ending only
    assert [e["step"] for e in summary.steps] == [1, 2, 3, 4, 5, 6]
    assert summary.final["type"] == "done" and JobLayout(out).has_adapter()


def test_a_trainer_killed_mid_run_is_failed_and_its_half_written_files_are_removed(tmp_path, tiny_model):
    runner = Runner(tmp_path)
    record = runner.submit(JobSpec.from_dict({"model": str(tiny_model), "max_steps": 100000, "save_steps": 0,
                                              "max_seq_length": 64}))
    wait_for(lambda: summarize(record.job_dir).steps)
    half_saved = JobLayout(record.job_dir).partial_checkpoint(7)
    half_saved.mkdir(parents=True)  # as if the kill came in the middle of a checkpoint
    os.killpg(record.pid, signal.SIGKILL)
    final = wait_for(lambda: (r := runner.get(record.id)).finished and r, timeout=60)
    assert final.state == JobState.FAILED and "signal SIGKILL" in final.reason
    assert not half_saved.exists() and zombie_children() == []
    assert_files_match_states(runner.store, trained=True)


def test_a_claim_whose_owner_died_is_failed_or_adopted_never_left_running(tmp_path, fake, monkeypatch):
    release = tmp_path / "release"
    monkeypatch.setenv("FAKE_TRAINER_WAIT_FOR", str(release))
    runner = Runner(tmp_path, python=fake, max_running=2)
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead_owner = f"{procs.HOST}:{gone.pid}:abcdef"
    for job_id in ("never-spawned", "spawned"):
        layout = JobLayout(tmp_path / "jobs" / job_id)
        layout.root.mkdir(parents=True)
        layout.config.write_text("name: x\n")
        runner.store.add(job_id, job_id, layout.root, {})
        assert runner.store.claim_next(dead_owner, max_running=2).id == job_id
    orphan = subprocess.Popen([fake, "-m", "jobs.train", str(JobLayout(tmp_path / "jobs" / "spawned").config)])
    wait_for(lambda: starts(tmp_path / "jobs" / "spawned"), timeout=60, interval=0.02)

    jobs = {r.id: r for r in runner.list_jobs()}
    never = jobs["never-spawned"]
    assert never.state == JobState.FAILED and "before starting its trainer" in never.reason
    assert jobs["spawned"].state == JobState.RUNNING and jobs["spawned"].pid == orphan.pid  # adopted
    release.touch()
    orphan.wait(timeout=60)
    assert wait_for(lambda: runner.get("spawned").state == JobState.DONE, timeout=60)
    assert_files_match_states(runner.store)
