"""The runner starts real `python -m jobs.train` subprocesses on a tiny model."""
import json
import os
from pathlib import Path

import psutil
import pytest

from jobs.io import paths
from jobs.io.events import summarize
from jobs.queue.runner import Runner, default_name
from jobs.spec import JobSpec, SpecError
from tests.jobs.queue.queue_jobs import small_spec
from tests.waiting import wait_for


def test_bad_spec_starts_nothing(tmp_path, tiny_model):
    runner = Runner(tmp_path)
    with pytest.raises(SpecError) as info:
        runner.submit(JobSpec(model=str(tiny_model), lora_r=0))
    assert info.value.key == "lora_r"
    assert runner.list_jobs() == [] and not list(tmp_path.glob("jobs/*"))


def test_job_runs_to_done_in_its_own_process_group_writing_only_inside_the_data_dir(
        tmp_path, tiny_model, monkeypatch):
    home, tmp, data = tmp_path / "home", tmp_path / "tmp", tmp_path / "data"
    home.mkdir()
    tmp.mkdir()
    monkeypatch.setenv("HOME", str(home))  # anything cached "in ~" or in $TMPDIR would land here
    monkeypatch.setenv("TMPDIR", str(tmp))
    for name in (*paths.CACHE_VARS, "HF_HUB_CACHE", "FUSETUNE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME"):
        monkeypatch.delenv(name, raising=False)
    runner = Runner(data)
    record = runner.submit(small_spec(tiny_model))
    assert record.state == "running" and record.pid
    assert os.getpgid(record.pid) == record.pid  # its own group, so cancel reaches every child
    assert psutil.Process(record.pid).cmdline()[1:] == ["-m", "jobs.train", f"{record.job_dir}/config.yaml",
                                                        "--data-dir", str(data)]
    done = wait_for(lambda: (r := runner.get(record.id)).finished and r)
    assert done.state == "done", done.reason
    log = (Path(done.job_dir) / "train.log").read_text()
    assert log.count("step 6/6") == 1 and log.count("done:") == 1  # the runner's redirect, not also a tee
    assert (Path(done.job_dir) / "adapter" / "adapter_model.safetensors").is_file()
    assert list(home.rglob("*")) == [] and list(tmp.rglob("*")) == []
    loose = [p for p in data.rglob("*") if p.stat().st_mode & 0o077]
    assert loose == [], loose  # files 0600, folders 0700


def test_default_names_say_model_dataset_and_bot(tmp_path, tiny_model):
    assert default_name(JobSpec(bot_name="Ada")) == "smollm2-135m-instruct · identity · Ada"
    assert default_name(JobSpec(model=str(tiny_model), dataset="org/chat-set")) == "tiny-llama · chat-set"
    runner = Runner(tmp_path, python=str(tmp_path / "absent"))
    assert runner.submit(JobSpec(name="  My run ")).name == "My run"
    assert runner.submit(JobSpec(bot_name="Ada")).spec["name"] == "smollm2-135m-instruct · identity · Ada"


def test_second_job_queues_until_the_first_finishes(tmp_path, tiny_model):
    runner = Runner(tmp_path)
    first = runner.submit(small_spec(tiny_model))
    second = runner.submit(small_spec(tiny_model))
    assert second.state == "queued"
    runner.start_monitor(interval_s=0.5)
    try:
        wait_for(lambda: runner.store.get(second.id).state == "done")
        assert runner.store.get(first.id).state == "done"
        assert runner.store.get(second.id).started_at >= runner.store.get(first.id).finished_at
    finally:
        runner.shutdown()


def test_cancel_saves_the_adapter_and_leaves_no_process(tmp_path, tiny_model):
    runner = Runner(tmp_path)
    record = runner.submit(small_spec(tiny_model, max_steps=100000, save_steps=0))
    wait_for(lambda: summarize(record.job_dir).steps)
    runner.cancel(record.id)
    final = wait_for(lambda: (r := runner.get(record.id)).finished and r, timeout=90)
    assert final.state == "cancelled"
    assert "adapter saved" in final.reason
    assert (Path(record.job_dir) / "adapter" / "adapter_model.safetensors").is_file()
    assert not psutil.pid_exists(record.pid) or psutil.Process(record.pid).status() == psutil.STATUS_ZOMBIE
    with pytest.raises(ProcessLookupError):
        os.killpg(record.pid, 0)  # nothing left in the job's process group


def test_cancel_of_a_running_grpo_job_keeps_its_log_checkpoint_and_adapter(tmp_path, tiny_model):
    """As for SFT (above, and the data-parallel cancel in tests/jobs/train/test_distributed.py): a GRPO
    step samples and scores before it trains, and a cancel still ends the job at a step boundary, with a
    resumable checkpoint of its last step, its adapter, its log, and a reason that names the step."""
    runner = Runner(tmp_path)
    record = runner.submit(small_spec(tiny_model, method="grpo", dataset="builtin:arithmetic", max_steps=100000,
                                 batch_size=2, num_generations=2, max_completion_length=8))
    wait_for(lambda: len(summarize(record.job_dir).steps) >= 2)
    runner.cancel(record.id)
    final = wait_for(lambda: (r := runner.get(record.id)).finished and r, timeout=90)
    summary = summarize(record.job_dir)
    step = summary.steps[-1]["step"]
    assert final.state == "cancelled" and summary.final["kind"] == "killed", final.reason
    assert final.reason.startswith(f"cancelled by the user at step {step}/100000; adapter saved to"), final.reason
    job = Path(record.job_dir)
    assert (job / "checkpoints" / f"step-{step}" / "optim.pt").is_file()
    assert (job / "adapter" / "adapter_model.safetensors").is_file()
    log = (job / "train.log").read_text()
    assert "received SIGTERM: stopping after this step" in log and f"step {step}/100000" in log
    # the cancel took effect before another rollout: nothing of an untrained step was logged (a resume
    # would log that step again)
    sampled = [json.loads(line)["step"] for line in (job / "completions.jsonl").read_text().splitlines()]
    assert sampled and max(sampled) <= step, (max(sampled), step)
    with pytest.raises(ProcessLookupError):
        os.killpg(record.pid, 0)  # nothing left in the job's process group


def test_cancel_of_a_queued_job_never_starts_it(tmp_path, tiny_model):
    runner = Runner(tmp_path)
    first = runner.submit(small_spec(tiny_model, max_steps=100000))
    queued = runner.submit(small_spec(tiny_model))
    runner.cancel(queued.id)
    assert runner.get(queued.id).state == "cancelled"
    runner.cancel(first.id)
    wait_for(lambda: runner.get(first.id).finished, timeout=120)
    assert runner.get(queued.id).pid is None


def test_a_new_runner_reattaches_to_a_running_job(tmp_path, tiny_model):
    first = Runner(tmp_path)
    record = first.submit(small_spec(tiny_model, max_steps=100000))
    wait_for(lambda: summarize(record.job_dir).steps)
    second = Runner(tmp_path)  # as after an app restart: the job is not its child
    assert second.get(record.id).state == "running"
    second.cancel(record.id)
    final = wait_for(lambda: (r := second.get(record.id)).finished and r, timeout=90)
    assert final.state == "cancelled"


def test_a_failing_job_is_failed_with_its_reason(tmp_path, tiny_model):
    data = tmp_path / "bad.jsonl"
    data.write_text('{"instruction": "hi", "output": "ok"}\n{"instruction": "x"}\n')
    runner = Runner(tmp_path)
    record = runner.submit(small_spec(tiny_model, dataset=str(data)))
    final = wait_for(lambda: (r := runner.get(record.id)).finished and r)
    assert final.state == "failed"
    assert "row 2" in final.reason and "output" in final.reason
    assert summarize(record.job_dir).final["kind"] == "data"
