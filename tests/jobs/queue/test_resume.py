"""Resume keeps the job: same id, row and folder, from its newest checkpoint, one run of steps in
its events. "Train more steps" starts a new job from a done job's final checkpoint (always written),
whose events continue the first job's curve."""
from pathlib import Path

import pytest

from jobs.io.events import read_events, summarize
from jobs.io.layout import TRAINER_STATE
from jobs.queue.resume import continued_from, newest_checkpoint, resumed_spec
from jobs.queue.runner import Runner, RunnerError
from jobs.queue.store import JobRecord
from jobs.spec import SpecError
from tests.jobs.queue.queue_jobs import small_spec
from tests.waiting import wait_for


def test_a_done_job_trains_more_steps_as_a_new_job_that_continues_its_curve(tmp_path, tiny_model):
    """save_steps 4 of 6: the periodic save stops before the last step, yet the done job keeps its
    final state (step 6), and "train more steps" continues from it in a folder of its own, leaving
    the done job's adapter as it was (issue 40: it used to resume from step 4 and overwrite it)."""
    runner = Runner(tmp_path)
    record = runner.submit(small_spec(tiny_model, save_steps=4))
    done = wait_for(lambda: (r := runner.get(record.id)).finished and r)
    assert done.state == "done", done.reason
    assert newest_checkpoint(done.job_dir)[1] == 6
    adapter = Path(done.job_dir) / "adapter" / "adapter_model.safetensors"
    before = adapter.read_bytes()
    with pytest.raises(RunnerError, match="how many more steps"):
        runner.train_more(record.id, 0)
    again = runner.train_more(record.id, more_steps=3)
    assert again.id != record.id and again.job_dir != done.job_dir and again.name == f"{done.name} +3"
    assert continued_from(again.job_dir) == {"job_id": record.id, "name": done.name,
                                             "job_dir": done.job_dir, "step": 6}
    finished = wait_for(lambda: (r := runner.get(again.id)).finished and r)
    assert finished.state == "done", finished.reason
    summary = summarize(finished.job_dir)
    assert [e["step"] for e in summary.steps] == list(range(1, 10))   # one curve, steps going on
    assert summary.start["resumed_at"] == 6 and summary.final["step"] == 9
    assert finished.spec["max_steps"] == 9 and finished.spec["resume_from"].endswith("step-6")
    assert adapter.read_bytes() == before and runner.get(record.id).state == "done"
    assert newest_checkpoint(finished.job_dir)[1] == 9
    events = [e for e in read_events(finished.job_dir) if e["type"] in ("phase", "start")]
    names = [e.get("phase", "start") for e in events]
    runs = [n for i, n in enumerate(names) if i == 0 or n != names[i - 1]]  # a counted phase repeats
    assert runs == ["preparing data", "tokenizing", "loading model", "start"] * 2, names
    counted = [e for e in events if "total" in e]
    assert all(e["unit"] == "answers" and 0 <= e["done"] <= e["total"] for e in counted)
    assert summary.phase is None
    with pytest.raises(RunnerError, match="not done: resume it"):
        runner.train_more(_failed(runner, tmp_path).id, 3)


def _failed(runner, tmp_path):
    record = runner.store.add("f", "f", tmp_path / "f", {"model": "m"})
    runner.store.update("f", state="failed")
    return record


def test_what_cannot_be_resumed_says_why(tmp_path):
    running = JobRecord(id="a", name="a", state="running", created_at=1.0, job_dir=str(tmp_path / "a"),
                        spec={"model": "m"})
    with pytest.raises(RuntimeError, match="only a cancelled, failed or done job"):
        resumed_spec(running)
    cancelled = JobRecord(id="b", name="b", state="cancelled", created_at=1.0, job_dir=str(tmp_path / "b"),
                          spec={"model": "m"})
    with pytest.raises(RuntimeError, match="saved no checkpoint"):
        resumed_spec(cancelled)
    with pytest.raises(RunnerError, match="there is no job"):
        Runner(tmp_path / "data").resume("nope")


def _cancelled_with_checkpoint(tmp_path, tiny_model, **spec):
    job = tmp_path / "job"
    (job / "checkpoints" / "step-4").mkdir(parents=True)
    (job / "checkpoints" / "step-4" / TRAINER_STATE).write_text("{}")
    data = tmp_path / "rows.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}\n')
    return JobRecord(id="c", name="again", state="cancelled", created_at=1.0, job_dir=str(job),
                     spec={"model": str(tiny_model), "dataset": str(data), **spec})


def test_a_job_resumes_after_the_checkpoint_its_earlier_run_resumed_from_was_deleted(tmp_path, tiny_model):
    gone = tmp_path / "job" / "checkpoints" / "step-2"   # resumed from once, then deleted
    record = _cancelled_with_checkpoint(tmp_path, tiny_model, resume_from=str(gone))
    spec = resumed_spec(record)
    assert spec.resume_from == str(tmp_path / "job" / "checkpoints" / "step-4")


def test_a_resume_still_refuses_what_the_new_run_would_miss(tmp_path, tiny_model):
    record = _cancelled_with_checkpoint(tmp_path, tiny_model)
    (tmp_path / "rows.jsonl").unlink()
    with pytest.raises(SpecError) as info:
        resumed_spec(record)
    assert info.value.key == "dataset"
