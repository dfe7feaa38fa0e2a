"""Placement by need (jobs/io/gpus.py `Demand`, jobs/queue/placement.py) on made-up NVML readings: a job
starts when the free memory covers its predicted peak, the studio's chat models are the studio's
(unloaded for a job that needs the room, never a stranger), and a waiting job says on what."""
import yaml

from jobs.io import gpus
from jobs.queue import placement
from jobs.io.gpus import Demand, Placement, Wait
from tests.jobs.queue.queue_jobs import gpu
from tests.waiting import wait_for


def test_a_job_with_a_prediction_starts_beside_the_chat_model_when_the_rest_is_free():
    # the machine: a 1B chat model (2.1 GiB reserved) in the studio's process, 3.2 GB used
    decision = gpus.place("auto", 0, [gpu(used=3.2)], held={}, demand=Demand(20.0, {0: 2.1}))
    assert decision == Placement((0,), 1) and not decision.unload_chat


def test_the_deadlock_case_a_job_without_a_prediction_unloads_the_chat_model():
    """No prediction: the job wants a whole GPU, as before; the chat model gives way instead of
    counting as another process (the queue stayed `queued` for good)."""
    decision = gpus.place("auto", 0, [gpu(used=3.2)], held={}, demand=Demand(None, {0: 2.1}))
    assert isinstance(decision, Placement) and decision.unload_chat
    # without the studio's share it waits, as before, naming the other processes
    waiting = gpus.place("auto", 0, [gpu(used=3.2)], held={}, demand=Demand(None))
    assert isinstance(waiting, Wait) and "3.2 of 140.4 GiB in use by other processes" in waiting.reason


def test_the_chat_model_is_unloaded_only_when_the_job_needs_its_room():
    machine = [gpu(used=30.0, total=40.0)]   # 10 GB free, the chat model holds 8 of the 30 used
    fits = gpus.place("0", 0, machine, held={}, demand=Demand(8.0, {0: 8.0}))
    assert isinstance(fits, Placement) and not fits.unload_chat
    needs_room = gpus.place("0", 0, machine, held={}, demand=Demand(14.0, {0: 8.0}))
    assert isinstance(needs_room, Placement) and needs_room.unload_chat


def test_a_job_waits_while_the_chat_model_is_answering_and_says_so():
    machine = [gpu(used=30.0, total=40.0)]
    decision = gpus.place("0", 0, machine, held={}, demand=Demand(14.0, {0: 8.0}, releasable=False))
    assert isinstance(decision, Wait)
    assert "the Chat tab holds 8.0 GiB" in decision.reason and "unload it" in decision.reason


def test_a_waiting_job_shows_need_against_free_and_who_holds_the_rest():
    decision = gpus.place("auto", 0, [gpu(used=30.0, total=40.0)], held={}, demand=Demand(25.0, {0: 2.0}))
    assert isinstance(decision, Wait)
    assert ("GPU 0: needs 25.0 GiB, 10.0 GiB free (28.0 GiB held by other processes, the Chat tab 2.0 GiB)"
            in decision.reason)


def test_a_job_larger_than_the_gpu_says_it_can_never_fit_there():
    decision = gpus.place("0", 0, [gpu(total=24.0)], held={}, demand=Demand(30.0))
    assert isinstance(decision, Wait) and "more than its 24.0 GiB" in decision.reason
    assert "Start anyway" in decision.reason


def test_start_anyway_ignores_other_processes_but_not_our_running_job():
    machine = [gpu(used=70.0, total=80.0)]
    assert gpus.place("0", 0, machine, held={}, demand=Demand(20.0, anyway=True)) == Placement((0,), 1)
    ours = gpus.place("0", 0, machine, held={0: "job A"}, demand=Demand(20.0, anyway=True))
    assert isinstance(ours, Wait) and "in use by job 'job A'" in ours.reason


def test_auto_prefers_a_gpu_where_the_chat_model_can_stay():
    machine = [gpu(0, used=12.0, total=24.0), gpu(1, used=1.0, total=24.0)]
    decision = gpus.place("auto", 0, machine, held={}, demand=Demand(15.0, {0: 10.0}))
    assert decision == Placement((1,), 1) and not decision.unload_chat


def test_the_margin_covers_the_over_prediction_and_a_little_more():
    assert gpus.need_with_margin(20.0) == 20.0 * 1.05 + 0.5
    just_short = gpu(used=140.4 - 21.4)
    assert isinstance(gpus.place("0", 0, [just_short], held={}, demand=Demand(20.0)), Wait)


def test_the_need_and_start_anyway_live_beside_the_config(tmp_path):
    assert placement.read(tmp_path) == {"need_gb": None, "start_anyway": False}
    placement.write_need(tmp_path, 12.345678)
    placement.mark_start_anyway(tmp_path)
    assert placement.read(tmp_path) == {"need_gb": 12.346, "start_anyway": True}


class FakeChat:
    """The chat engine's GPU share as the runner sees it (jobs/placement.StudioGpuUse)."""

    def __init__(self, held, answering=False):
        self.held, self.answering, self.released = held, answering, []

    def held_gb(self):
        return dict(self.held)

    def can_release(self):
        return not self.answering

    def release(self, reason):
        self.released.append(reason)
        self.held = {}
        return True


def test_the_runner_unloads_the_chat_model_then_starts_the_job(tmp_path, tiny_model, monkeypatch):
    """Chat, then train on a one-GPU machine (the jobs train on the CPU; the GPU is made up): the
    job starts after the chat model is unloaded, instead of waiting for good."""
    from jobs.queue.runner import Runner
    from jobs.spec import JobSpec
    monkeypatch.setattr(gpus, "read_gpus", lambda: [gpu(used=3.2)])
    runner = Runner(tmp_path)
    runner.studio_gpu = chat = FakeChat({0: 2.1})
    spec = JobSpec.from_dict({"model": str(tiny_model), "max_steps": 2, "save_steps": 0, "max_seq_length": 48})
    job = runner.submit(spec)
    assert runner.get(job.id).state == "running" and chat.released == [f"job '{job.name}'"]
    wait_for(lambda: runner.get(job.id).finished, timeout=300)
    assert runner.get(job.id).state == "done", runner.get(job.id).reason
    assert yaml.safe_load((tmp_path / "jobs" / job.id / "config.yaml").read_text())["gpus"] == "0"


def test_a_runner_job_waits_on_what_and_starts_anyway_when_asked(tmp_path, monkeypatch):
    from jobs.queue.runner import Runner
    from jobs.spec import JobSpec
    monkeypatch.setattr(gpus, "read_gpus", lambda: [gpu(used=30.0, total=40.0)])
    runner = Runner(tmp_path)
    runner.studio_gpu = FakeChat({0: 8.0}, answering=True)
    spawned = []
    monkeypatch.setattr(runner, "_spawn", lambda record: spawned.append(record.id))
    job = runner.submit(JobSpec(), need_gb=14.0)
    record = runner.get(job.id)
    assert record.state == "queued" and "the Chat tab holds 8.0 GiB" in record.reason
    assert placement.read(record.job_dir)["need_gb"] == 14.0
    assert runner.start_anyway(job.id) and spawned == [job.id]
    assert not runner.start_anyway("no-such-job")


def test_start_anyway_is_offered_only_for_reasons_about_memory():
    memory = [gpus.place("auto", 0, [gpu(used=3.2)], held={}, demand=Demand(None)),
              gpus.place("0", 0, [gpu(used=30.0, total=40.0)], held={}, demand=Demand(25.0)),
              gpus.place("0", 0, [gpu(used=30.0, total=40.0)], held={}, demand=Demand(14.0, {0: 8.0}, False)),
              gpus.place("0", 0, [gpu(total=24.0)], held={}, demand=Demand(30.0))]
    assert all(gpus.waits_for_memory(w.reason) for w in memory)
    ours = gpus.place("0", 0, [gpu()], held={0: "job A"}, demand=Demand(1.0))
    assert not gpus.waits_for_memory(ours.reason)
    assert not gpus.waits_for_memory("waiting for the running job to finish")
