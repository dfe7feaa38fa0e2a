"""The GPU queue's rules (jobs/io/gpus.py) on made-up NVML readings."""
import pytest
import yaml

from jobs.io import gpus
from jobs.io.gpus import GpuInfo, Placement, Wait
from jobs.spec import SpecError
from tests.waiting import wait_for


def machine(*used_gb, total=80.0):
    """GPUs 0..n-1 with this much memory in use by other processes."""
    return [GpuInfo(i, "NVIDIA H200", free_gb=total - used, total_gb=total) for i, used in enumerate(used_gb)]


def test_auto_takes_the_first_free_gpu_and_skips_ours_and_busy_ones():
    four = machine(0.5, 40.0, 0.3, 0.0)
    assert gpus.place("auto", 0, four, held={}) == Placement((0,), 1)
    # GPU 0 runs our job, GPU 1 holds 40 GB of someone else's: the first free one is GPU 2
    assert gpus.place("auto", 0, four, held={0: "job A"}) == Placement((2,), 1)
    assert gpus.place("auto", 2, four, held={0: "job A"}) == Placement((2, 3), 2)


def test_a_job_waits_for_its_listed_gpus_and_says_why():
    two = machine(0.0, 30.0)
    decision = gpus.place("0,1", 0, two, held={0: "tiny · identity"})
    assert isinstance(decision, Wait)
    assert "GPU 0 is in use by job 'tiny · identity'" in decision.reason
    assert "GPU 1 has 30.0 of 80.0 GiB in use by other processes" in decision.reason
    assert decision.claims == {0, 1}
    assert gpus.place("0,1", 2, machine(0.0, 1.0), held={}) == Placement((0, 1), 2)


def test_jobs_on_disjoint_gpus_are_placed_side_by_side():
    two = machine(0.0, 0.0)
    first = gpus.place("0", 0, two, held={})
    second = gpus.place("1", 0, two, held={i: "first" for i in first.gpus})
    assert first.gpus == (0,) and second.gpus == (1,)
    third = gpus.place("auto", 0, two, held={0: "first", 1: "second"})
    assert isinstance(third, Wait) and "a free GPU" in third.reason


def test_all_waits_for_every_gpu():
    three = machine(0.0, 0.0, 0.0)
    assert gpus.place("all", 0, three, held={}) == Placement((0, 1, 2), 3)
    waiting = gpus.place("all", 0, three, held={2: "other"})
    assert isinstance(waiting, Wait) and waiting.claims == {0, 1, 2}


def test_gpus_kept_for_an_earlier_queued_job_are_not_given_to_a_later_one():
    two = machine(0.0, 0.0)
    # an older job waits for GPUs 0 and 1 (GPU 1 is busy); a newer auto job may not take GPU 0
    older = gpus.place("0,1", 0, two, held={1: "running"})
    newer = gpus.place("auto", 0, two, held={1: "running"}, claimed=older.claims)
    assert isinstance(newer, Wait) and "kept for a job queued earlier" in newer.reason
    # an older auto job that needs two GPUs keeps the one free GPU it found
    older = gpus.place("auto", 2, two, held={1: "running"})
    assert isinstance(older, Wait) and older.claims == {0} and "2 free GPUs (1 free now)" in older.reason


def test_the_idle_limit_decides_what_counts_as_another_process_using_a_gpu():
    one = machine(1.5)
    assert isinstance(gpus.place("0", 0, one, held={}), Placement)
    assert isinstance(gpus.place("0", 0, one, held={}, idle_gb=1.0), Wait)


def test_a_machine_without_gpus_places_cpu_processes():
    assert gpus.place("auto", 0, [], held={}) == Placement((), 1)
    assert gpus.place("auto", 2, [], held={}) == Placement((), 2)
    assert Placement((), 2).env() == {gpus.PLACED_ENV: "1"} and Placement((), 2).gpus_key == "auto"


def test_placement_env_numbers_gpus_as_nvml_does():
    env = Placement((1, 3), 2).env()
    assert env["CUDA_VISIBLE_DEVICES"] == "1,3" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert Placement((1, 3), 2).gpus_key == "1,3"


@pytest.mark.parametrize("key, processes, found, field, words", [
    ("2", 0, 2, "gpus", "GPU 2 does not exist; this machine has GPU 0, 1"),
    ("0,1", 0, 0, "gpus", "no NVIDIA GPU"),
    ("0,1", 3, 2, "processes", "is 3, but the job gets 2 GPU(s)"),
    ("all", 1, 2, "processes", "is 1, but the job gets 2 GPU(s)"),
    ("auto", 4, 2, "processes", "asks for 4 processes, one per GPU, but this machine has 2"),
])
def test_impossible_requests_are_refused_naming_the_key(key, processes, found, field, words):
    with pytest.raises(SpecError) as info:
        gpus.check_request(key, processes, machine(*[0.0] * found))
    assert info.value.key == field and words in str(info.value)


def test_possible_requests_pass():
    for key, processes in (("auto", 0), ("auto", 2), ("all", 0), ("0,1", 2), ("1", 0)):
        gpus.check_request(key, processes, machine(0.0, 0.0))
    gpus.check_request("auto", 2, [])  # several CPU processes (gloo)


def test_a_hand_started_job_takes_the_roomiest_gpus_with_a_warning_when_none_is_free():
    busy = machine(70.0, 10.0, 50.0)
    placement, warning = gpus.place_now("auto", 2, busy)
    assert placement == Placement((1, 2), 2)
    assert warning.startswith("starting on GPU 1,2 anyway") and "GPU 0 has 70.0" in warning
    placement, warning = gpus.place_now("0", 0, busy)
    assert placement == Placement((0,), 1) and "GPU 0 has 70.0" in warning
    assert gpus.place_now("auto", 0, machine(0.0)) == (Placement((0,), 1), None)


def test_the_start_anyway_warning_is_the_wait_reason_with_the_chosen_gpus_said_by_its_own_template():
    """The same words the wait reason had, "waiting" turned into where the job starts anyway
    (gpu_anyway / gpu_anyway_for), so the studio can translate it by its template."""
    busy = machine(70.0, 10.0, 50.0)
    reasons = ("GPU 0 has 70.0 of 80.0 GiB in use by other processes; GPU 1 has 10.0 of 80.0 GiB in use by other "
               "processes; GPU 2 has 50.0 of 80.0 GiB in use by other processes")
    waiting = gpus.place("auto", 2, busy, held={})
    assert waiting.reason == f"waiting for 2 free GPUs (0 free now): {reasons}"
    assert (waiting.need, waiting.gpu_reasons) == ("2 free GPUs (0 free now)", reasons)
    assert gpus.place_now("auto", 2, busy)[1] == f"starting on GPU 1,2 anyway for 2 free GPUs (0 free now): {reasons}"
    assert gpus.place_now("auto", 0, busy)[1] == f"starting on GPU 1 anyway for a free GPU: {reasons}"
    listed = "GPU 0 has 70.0 of 80.0 GiB in use by other processes; GPU 2 has 50.0 of 80.0 GiB in use by other processes"
    assert gpus.place("0,2", 0, busy, held={}).reason == f"waiting: {listed}"
    assert gpus.place_now("0,2", 0, busy)[1] == f"starting on GPU 0,2 anyway: {listed}"


def test_inventory_names_our_jobs_on_each_gpu():
    listed = gpus.inventory({1: ["job A", "job B"]}, machine=machine(0.0, 20.0))
    assert [g.busy_by_jobs for g in listed] == [(), ("job A", "job B")]
    assert listed[1].used_gb == 20.0
    assert listed[1].label() == "GPU 1 · NVIDIA H200 · 60.0 of 80.0 GiB free · used by job A, job B"


def test_global_batch_is_per_process_batch_times_accumulation_times_processes():
    assert gpus.global_batch(2, 4, 2) == 16 and gpus.global_batch(2, 4, 0) == 8


def test_the_runner_runs_jobs_on_disjoint_gpus_together_and_queues_the_third(tmp_path, tiny_model, monkeypatch):
    """Two made-up GPUs (the jobs themselves train on the CPU): jobs on GPU 0 and GPU 1 run at
    once, each with its GPU in CUDA_VISIBLE_DEVICES and config.yaml; a third job for GPU 0 waits,
    saying why, and starts when GPU 0 is free."""
    import psutil

    from jobs.queue.runner import Runner
    from jobs.spec import JobSpec
    monkeypatch.setattr(gpus, "read_gpus", lambda: machine(0.3, 0.3))

    def spec(gpu, steps):
        return JobSpec.from_dict({"model": str(tiny_model), "max_steps": steps, "save_steps": 0,
                                  "max_seq_length": 48, "gpus": gpu})
    runner = Runner(tmp_path)
    first, second = runner.submit(spec("0", 100000)), runner.submit(spec("1", 100000))
    third = runner.submit(spec("0", 2))
    assert [runner.get(j.id).state for j in (first, second, third)] == ["running", "running", "queued"]
    assert runner.get(third.id).reason == f"waiting: GPU 0 is in use by job '{first.name}'"
    assert psutil.Process(second.pid).environ()["CUDA_VISIBLE_DEVICES"] == "1"
    placed = yaml.safe_load((tmp_path / "jobs" / second.id / "config.yaml").read_text())
    assert (placed["gpus"], placed["processes"]) == ("1", 1)
    assert [g.busy_by_jobs for g in runner.gpu_inventory()] == [(first.name,), (second.name,)]
    runner.cancel(first.id)
    wait_for(lambda: runner.get(third.id).state == "done", timeout=300)
    assert runner.get(second.id).state == "running"
    runner.cancel(second.id)
    wait_for(lambda: runner.get(second.id).finished, timeout=120)


def test_the_start_preview_shows_torchrun_for_several_processes(tmp_path, monkeypatch):
    from jobs.queue.runner import Runner
    from jobs.spec import JobSpec
    monkeypatch.setattr(gpus, "read_gpus", lambda: machine(0.0, 0.0))
    runner = Runner(tmp_path)
    _, argv = runner.preview_command(JobSpec(gpus="all"))
    assert argv[1:3] == ["-m", "jobs.launch"] and argv[argv.index("--nproc-per-node") + 1] == "2"
    assert runner.preview_command(JobSpec(gpus="1"))[1][1:3] == ["-m", "jobs.train"]


def test_preflight_refuses_gpus_this_machine_cannot_give(tiny_model, monkeypatch):
    """The studio's Start (jobs/checks/preflight.py) lists an impossible GPU request with the other
    problems, naming the key; a busy GPU is no problem there (the job waits in the queue)."""
    from jobs.checks.preflight import run_preflight
    from jobs.spec import JobSpec
    monkeypatch.setattr(gpus, "read_gpus", lambda: machine(60.0))
    for key, processes, field in (("0,1", 0, "gpus"), ("auto", 2, "processes")):
        spec = JobSpec.from_dict({"model": str(tiny_model), "gpus": key, "processes": processes})
        report = run_preflight(spec, log=lambda line: None)
        assert [p.key for p in report.problems] == [field], report.problems
    assert run_preflight(JobSpec.from_dict({"model": str(tiny_model), "gpus": "0"}), log=lambda line: None).ok
