"""GRPO within max_gpu_memory_gb plans its policy passes while the trainer is built (plan_batches),
from the LoRA parameter count: on the H200 (2026-12-03) the first budgeted job failed there with
"'Trainer' object has no attribute 'trainable'", which the CPU suite never reached because the split
is for GPUs only. Here the GPU guard is opened and the plan's arithmetic replaced by a spy, so the
order of the trainer's set-up is what is tested (the arithmetic: tests/jobs/models/test_fit.py)."""
from jobs.models import fit
from jobs.train.methods import grpo
from tests.jobs.train.method_jobs import grpo_trainer


def test_the_policy_passes_are_planned_with_the_trainable_parameter_count(tmp_path, tiny_model, monkeypatch):
    seen = {}

    def policy_rows(spec, model_config, trainable=None, fused=None, world=1, prompt_len=None, prompts_once=None):
        seen.update(trainable=trainable, prompt_len=prompt_len, prompts_once=prompts_once)
        return 1
    monkeypatch.setattr(grpo, "budgeted", lambda device, spec: True)
    monkeypatch.setattr(fit, "grpo_policy_rows", policy_rows)
    trainer = grpo_trainer(tmp_path, tiny_model, max_gpu_memory_gb=8.0)
    trainer.prepare()
    assert seen["trainable"] == trainer.trainable == sum(p.numel() for p in trainer.params) > 0
    assert trainer.method.policy_rows == 1
    # what a pass holds, as the job knows it (jobs/models/fit_policy.py): the data's longest prompt,
    # and on this CPU a prompt per completion (padded rows never pack here)
    longest = max(len(row.input_ids) for row in trainer.examples)
    assert seen["prompt_len"] == longest <= trainer.spec.max_seq_length and seen["prompts_once"] is False
    assert trainer.method.batch_tokens() == trainer.spec.batch_size * trainer.spec.num_generations * (
        longest + trainer.spec.max_completion_length)


def test_the_split_is_for_gpus_with_a_budget_only():
    import torch
    from types import SimpleNamespace
    assert grpo.budgeted(torch.device("cuda"), SimpleNamespace(max_gpu_memory_gb=8.0))
    assert not grpo.budgeted(torch.device("cuda"), SimpleNamespace(max_gpu_memory_gb=0.0))
    assert not grpo.budgeted(torch.device("cpu"), SimpleNamespace(max_gpu_memory_gb=8.0))
