"""jobs/train/graph_steps.py: which jobs get a captured step (and the reason for the others), the optimizer
made capturable (also after a resume), checkpoints that resume into either kind of run, and the
step function's plumbing. The capture itself needs a GPU: bench/device.sh jobgraph runs jobs
with and without it and compares their losses step by step (bench/results/job.jsonl)."""
from __future__ import annotations

import pytest
import torch

from jobs.train.checkpoints import _plain_lr
from jobs.train.graph_steps import SWITCH, GraphedSteps, graph_off_reason, make_capturable
from jobs.data.packing import Batch
from jobs.spec import JobSpec

CUDA = torch.device("cuda")


def _spec(**overrides):
    return JobSpec.from_dict({"fused_kernels": True, **overrides})


@pytest.mark.parametrize("spec, device, packed, world, recomputes, reason", [
    (_spec(), torch.device("cpu"), True, 1, False, "the job runs on cpu"),
    (JobSpec.from_dict({"fused_kernels": False}), CUDA, True, 1, False, "fused_kernels is off"),
    (_spec(), CUDA, True, 2, False, "several processes"),
    (_spec(), CUDA, False, 1, False, "packing is off"),
    (_spec(load_in_4bit=True), CUDA, True, 1, False, "QLoRA"),
    (_spec(), CUDA, True, 1, True, "activation checkpointing is on"),
    (_spec(), CUDA, True, 1, False, None),
])
def test_which_jobs_are_captured_and_why_not(spec, device, packed, world, recomputes, reason, monkeypatch):
    monkeypatch.setenv(SWITCH, "1")
    got = graph_off_reason(spec, device, packed, world, recomputes)
    assert got == reason if reason is None else reason in got


def test_without_the_switch_no_job_is_captured_and_the_log_says_how(monkeypatch):
    monkeypatch.delenv(SWITCH, raising=False)
    assert f"{SWITCH}=1 captures it" in graph_off_reason(_spec(), CUDA, True, 1, False)
    monkeypatch.setenv(SWITCH, "0")
    assert "not switched on" in graph_off_reason(_spec(), CUDA, True, 1, False)


def _stepped_adamw():
    param = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.AdamW([param], lr=0.01)
    param.sum().backward()
    optimizer.step()
    return param, optimizer


def test_make_capturable_moves_the_lr_and_step_counts_to_the_device_tensors():
    param, optimizer = _stepped_adamw()
    make_capturable(optimizer, torch.device("cpu"))
    group = optimizer.param_groups[0]
    assert group["capturable"] is True and torch.is_tensor(group["lr"]) and float(group["lr"]) == pytest.approx(0.01)
    assert torch.is_tensor(optimizer.state[param]["step"]) and float(optimizer.state[param]["step"]) == 1
    lr = group["lr"]
    make_capturable(optimizer, torch.device("cpu"))          # idempotent: the same LR tensor
    assert group["lr"] is lr
    torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5)
    assert group["lr"] is lr and float(lr) == pytest.approx(0.005)   # filled in place: a replay reads it


def test_a_checkpoint_of_a_captured_run_resumes_into_an_eager_one():
    _, captured = _stepped_adamw()
    make_capturable(captured, torch.device("cpu"))
    scheduler = torch.optim.lr_scheduler.LambdaLR(captured, lambda step: 0.5)
    saved_opt, saved_sched = _plain_lr(captured.state_dict()), _plain_lr(scheduler.state_dict())
    assert isinstance(saved_opt["param_groups"][0]["lr"], float)
    assert all(isinstance(lr, float) for lr in saved_sched["_last_lr"])
    assert torch.is_tensor(captured.param_groups[0]["lr"])   # the live optimizer is untouched
    _, eager = _stepped_adamw()
    eager.load_state_dict(saved_opt)
    assert eager.param_groups[0]["lr"] == pytest.approx(0.005)


def test_the_step_function_hands_each_micro_batch_its_own_arguments():
    seen = []
    param = torch.nn.Parameter(torch.ones(2))
    param.grad = torch.ones(2)
    optimizer = torch.optim.SGD([param], lr=0.1)
    steps = GraphedSteps(lambda micro, count: seen.append((micro, count)) or (count, count), optimizer, print)
    batches = [Batch({"input_ids": torch.full((1, 3), i)}, {"max_length_q": 3 + i}) for i in range(2)]
    inputs = GraphedSteps.inputs(batches, torch.tensor(5.0), None)
    assert sorted(inputs) == ["0/input_ids", "0/max_length_q", "1/input_ids", "1/max_length_q", "count"]
    steps._function(2)(inputs)
    (micro, count), = seen
    assert param.grad is None and float(count) == 5
    assert [int(m["input_ids"][0, 0]) for m in micro] == [0, 1] and [m["max_length_q"] for m in micro] == [3, 4]
