"""A cancel of a GRPO job (in-process, on the tiny Llama): it takes effect before the next rollout,
so no sampling is wasted and completions.jsonl holds only steps that trained; a stop that arrives
while a step samples ends the rollout at the sampler's next host check (every decode.CHECK_EVERY
tokens), the step leaves nothing behind, and a resume samples it as the unbroken run did; a rollout
too short to reach a check lets its step train, then stops before the next. The subprocess cancel
(SIGTERM from the runner) is tests/jobs/queue/test_runner.py."""
import json

import pytest

from jobs.train.loop import Cancelled
from jobs.train.methods import grpo
from tests.jobs.train.method_jobs import grpo_trainer


def rollouts_counted(monkeypatch, on_call=lambda calls: None) -> list:
    """Counts GRPO's sampling calls; `on_call(count)` runs inside each one, before it samples."""
    calls, sample = [], grpo.sample_completions

    def counted(*args, **kwargs):
        calls.append(1)
        on_call(len(calls))
        return sample(*args, **kwargs)
    monkeypatch.setattr(grpo, "sample_completions", counted)
    return calls


def completion_steps(trainer) -> set[int]:
    lines = (trainer.job_dir / "completions.jsonl").read_text().splitlines()
    return {json.loads(line)["step"] for line in lines}


def test_a_stop_between_steps_samples_nothing_more(tmp_path, tiny_model, monkeypatch):
    holder = {}

    def stop_after_step_2(event):
        if event["type"] == "step" and event["step"] == 2:
            holder["trainer"].stop_requested = True   # as the SIGTERM handler of jobs/train/cli.py does
    trainer = holder["trainer"] = grpo_trainer(tmp_path, tiny_model, sinks=[stop_after_step_2])
    calls = rollouts_counted(monkeypatch)
    with pytest.raises(Cancelled, match=r"^cancelled by the user at step 2/50; adapter saved to"):
        trainer.run()
    assert len(calls) == 2   # no third rollout
    assert completion_steps(trainer) == {1, 2}
    assert (trainer.job_dir / "checkpoints" / "step-2" / "optim.pt").is_file()


def test_a_stop_during_a_rollout_trains_that_step_then_stops_before_the_next(tmp_path, tiny_model, monkeypatch):
    trainer = grpo_trainer(tmp_path, tiny_model)

    def stop_in_third(count):
        if count == 3:
            trainer.stop_requested = True
    calls = rollouts_counted(monkeypatch, stop_in_third)
    with pytest.raises(Cancelled, match=r"^cancelled by the user at step 3/50; adapter saved to"):
        trainer.run()
    assert len(calls) == 3
    assert completion_steps(trainer) == {1, 2, 3}   # step 3's completions: it trained
    assert (trainer.job_dir / "checkpoints" / "step-3" / "optim.pt").is_file()


def completions_of(trainer, step: int) -> list[str]:
    lines = (trainer.job_dir / "completions.jsonl").read_text().splitlines()
    return [r["completion"] for r in map(json.loads, lines) if r["step"] == step]


def test_a_stop_during_a_long_rollout_ends_it_and_a_resume_samples_that_step_as_the_unbroken_run(
        tmp_path, tiny_model, monkeypatch):
    """Completions of 40 tokens pass the sampler's host checks (8, 16, ...): a stop raised inside the
    third rollout ends it there. Step 2 is the last step; nothing of step 3 is written; the random
    state saved is the one before step 3, so the resumed run's step 3 equals the unbroken run's."""
    unbroken = grpo_trainer(tmp_path, tiny_model, name="unbroken", max_steps=3, max_completion_length=40)
    unbroken.run()
    trainer = grpo_trainer(tmp_path, tiny_model, name="cancelled", max_steps=3, max_completion_length=40)

    def stop_in_third(count):
        if count == 3:
            trainer.stop_requested = True
    calls = rollouts_counted(monkeypatch, stop_in_third)
    with pytest.raises(Cancelled, match=r"^cancelled by the user at step 2/3; adapter saved to"):
        trainer.run()
    assert len(calls) == 3 and completion_steps(trainer) == {1, 2}
    checkpoint = trainer.job_dir / "checkpoints" / "step-2"
    assert (checkpoint / "optim.pt").is_file()
    monkeypatch.undo()
    resumed = grpo_trainer(tmp_path, tiny_model, name="cancelled", max_steps=3, max_completion_length=40,
                           resume_from=str(checkpoint))
    resumed.run()
    assert completions_of(resumed, 3) == completions_of(unbroken, 3)
