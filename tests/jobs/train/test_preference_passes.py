"""A packed preference micro-batch within max_gpu_memory_gb may train in passes of fewer rows
(jobs/models/fit_passes.py, jobs/data/pairs.py Passes): the trainer plans them after counting the
LoRA parameters, logs the split, and the passes give the whole micro-batch's loss and gradients
(the step's count covers every pair). The split is for GPUs only, so here the GPU guard is opened and
the plan's arithmetic replaced by a spy (the arithmetic: tests/jobs/models/test_preference_budget.py)."""
import json

import torch

from jobs.data.packing import Batch
from jobs.data.pairs import PairPlan, Passes
from jobs.io.events import EventWriter
from jobs.models import fit
from jobs.spec import JobSpec
from jobs.train.loop import Trainer
from jobs.train.methods import preference
from tests.jobs.train.test_preference_job import PAIRS


def test_a_micro_batch_in_passes_gives_the_whole_ones_loss_and_gradients(tmp_path, tiny_model, monkeypatch):
    data = tmp_path / "pairs.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in PAIRS) + "\n")
    job = tmp_path / "job"
    spec = JobSpec.from_dict({"model": str(tiny_model), "output_dir": str(job), "method": "dpo", "dataset": str(data),
                              "packing": "on", "batch_size": 4, "max_seq_length": 32, "dtype": "fp32",
                              "max_steps": 1, "save_steps": 0, "max_gpu_memory_gb": 8.0})
    seen, lines = {}, []

    def pass_units(spec, model_config, trainable=None, fused=None):
        seen["trainable"] = trainable
        return 1
    monkeypatch.setattr(preference, "budgeted", lambda device, spec: True)
    monkeypatch.setattr(fit, "preference_pass_units", pass_units)
    trainer = Trainer(spec, job, EventWriter(job), log=lines.append)
    trainer.prepare()
    assert seen["trainable"] == trainer.trainable > 0 and trainer.plan.pass_units == 1
    assert any("dpo: each micro-batch of 4 packed rows trains in passes of up to 1" in line for line in lines)

    epoch, batch = trainer.plan.batch_at(0)
    parts = trainer.method.prepare_step([(epoch, batch)])
    assert isinstance(batch, Passes) and len(parts) == len(batch.parts) > 1
    monkeypatch.setattr(Batch, "pinned", lambda self: self)   # no pinned memory without CUDA
    assert isinstance(batch.pinned(), Passes) and len(batch.pinned().parts) == len(parts)   # the Prefetcher's copy
    whole_plan = PairPlan(trainer.examples, 4, 64, True, spec.seed, pad_id=trainer.tokenizer.pad_token_id)
    whole = whole_plan.batch_at(0)[1]
    assert sum(p.label_tokens for _, p in parts) == whole.label_tokens == batch.label_tokens
    assert sum(p.real_tokens for _, p in parts) == whole.real_tokens

    model, count = trainer.model, torch.tensor(float(whole.label_tokens))
    model.train()

    def run(batches):
        model.zero_grad(set_to_none=True)
        total = 0.0
        for piece in batches:
            loss, _ = trainer.method.loss(model, piece.to("cpu"), count)
            loss.backward()
            total += loss.detach()
        return total, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    one, split = run([whole]), run([p for _, p in parts])
    torch.testing.assert_close(split[0], one[0], rtol=1e-5, atol=1e-7)
    assert one[1] and one[1].keys() == split[1].keys()
    for name, grad in one[1].items():
        assert (split[1][name] - grad).norm() <= 1e-5 * max(grad.norm(), 1e-12), name
