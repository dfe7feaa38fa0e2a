"""A packed preference micro-batch within max_gpu_memory_gb may train in passes of fewer rows
(jobs/models/fit_passes.py, jobs/data/pairs.py Passes): the trainer plans them after counting the
LoRA parameters, logs the split, and the passes give the whole micro-batch's loss and gradients
(the step's count covers every pair). The split is for GPUs only, so here the GPU guard is opened and
the plan's arithmetic replaced by a spy (the arithmetic: tests/jobs/models/test_preference_budget.py).
And a micro-batch with each unit's prompt once (padded, or packed) gives the two-rows-a-unit batch's loss
and gradients."""
import json

import pytest
import torch

from jobs.data.packing import Batch, Passes
from jobs.data.pairs import PairPlan, collate_units
from jobs.io.events import EventWriter
from jobs.models import fit
from jobs.spec import JobSpec
from jobs.train import engine_setup
from jobs.train.loop import Trainer
from jobs.train.methods import base, preference
from tests.jobs.train.passes_check import assert_passes_give_the_whole, loss_and_grads, trainer_in_passes
from tests.jobs.train.method_jobs import PAIRS


def test_a_micro_batch_in_passes_gives_the_whole_ones_loss_and_gradients(tmp_path, tiny_model, monkeypatch):
    data = tmp_path / "pairs.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in PAIRS) + "\n")
    job = tmp_path / "job"
    spec = JobSpec.from_dict({"model": str(tiny_model), "output_dir": str(job), "method": "dpo", "dataset": str(data),
                              "packing": "on", "batch_size": 4, "max_seq_length": 32, "dtype": "fp32",
                              "max_steps": 1, "save_steps": 0, "max_gpu_memory_gb": 8.0})
    trainer, seen, lines = trainer_in_passes(spec, job, monkeypatch)
    assert seen["trainable"] == trainer.trainable > 0 and trainer.plan.pass_units == 1
    assert any("dpo: each micro-batch of 4 packed rows trains in passes of up to 1" in line for line in lines)

    epoch, batch = trainer.plan.batch_at(0)
    parts = trainer.method.prepare_step([(epoch, batch)])
    assert isinstance(batch, Passes) and len(parts) == len(batch.parts) > 1
    monkeypatch.setattr(Batch, "pinned", lambda self: self)   # no pinned memory without CUDA
    assert isinstance(batch.pinned(), Passes) and len(batch.pinned().parts) == len(parts)   # the Prefetcher's copy
    whole_plan = PairPlan(trainer.examples, 4, 64, True, spec.seed, pad_id=trainer.tokenizer.pad_token_id,
                          shared=trainer.plan.shared)   # packed with each prompt once, as the job's plan
    whole = whole_plan.batch_at(0)[1]
    assert sum(p.label_tokens for _, p in parts) == whole.label_tokens == batch.label_tokens
    assert sum(p.real_tokens for _, p in parts) == whole.real_tokens
    assert_passes_give_the_whole(trainer, whole, [p for _, p in parts])


@pytest.mark.parametrize("packing", ["off", "on"])
@pytest.mark.parametrize("method", ["dpo", "kto", "kto-halves"])
def test_units_with_their_prompt_once_give_the_padded_loss_and_gradients(tmp_path, tiny_model, method, packing,
                                                                        monkeypatch):
    """Off the GPU a padded micro-batch holds each unit's prompt once (jobs/data/shared_prefix.py): one
    row per unit, both answers after the prompt under a 4-D mask; packed, a row holds each unit's prompt
    then its answers, whose attention keys are gathered behind it (jobs/data/pairs.py
    collate_units_packed_shared). Loss and LoRA gradients equal the two-rows-a-unit batch's (fp32), the
    reference pass included; KTO's mismatched second sequence too, in one forward with grad, and with
    KTO_HALVES (the bench's switch) on its completions alone after a forward without grad over the KL
    completions (pairs.py KTOBatch)."""
    halves = method == "kto-halves"
    method = "kto" if halves else method
    monkeypatch.setattr(preference, "KTO_HALVES", halves)
    rows = PAIRS if method == "dpo" else [{"prompt": r["prompt"], "completion": r[k], "label": k == "chosen"}
                                          for r in PAIRS for k in ("chosen", "rejected")]
    data = tmp_path / "rows.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    job = tmp_path / "job"
    spec = JobSpec.from_dict({"model": str(tiny_model), "output_dir": str(job), "method": method, "dataset": str(data),
                              "packing": packing, "batch_size": 4, "max_seq_length": 32, "dtype": "fp32",
                              "max_steps": 1, "save_steps": 0})
    lines = []
    trainer = Trainer(spec, job, EventWriter(job), log=lines.append)
    trainer.prepare()
    how = "packed: the prompt, then each answer" if packing == "on" else "4-D mask"
    assert any(f"{method} prompts: once per" in line and how in line for line in lines), lines
    shared = trainer.plan.batch_at(0)[1]
    group = trainer.plan.epoch_batches(0)[0]
    units = [trainer.examples[i] for i in ([k for r in group for k in trainer.plan.rows[r]] if packing == "on" else group)]
    if packing == "on":
        assert "kv_index" in shared.tensors and shared.tensors["input_ids"].shape == (4, 64)
    else:
        assert shared.tensors["attention_mask"].dim() == 4 and shared.tensors["input_ids"].shape[0] == 4
    plain = collate_units(units, trainer.tokenizer.pad_token_id)
    assert plain.tensors["input_ids"].shape[0] == 2 * len(units) and shared.real_tokens < plain.real_tokens
    count = torch.tensor(float(len(units)))
    forwards = []   # (tokens, grad enabled) of each policy forward
    sums = preference.sequence_sums

    def spy(model, batch, fused):
        forwards.append((batch["input_ids"].numel(), torch.is_grad_enabled()))
        return sums(model, batch, fused)
    monkeypatch.setattr(preference, "sequence_sums", spy)
    want = loss_and_grads(trainer, [plain], count)
    forwards.clear()   # the shared batch's alone
    got = loss_and_grads(trainer, [shared], count)
    if halves:
        completions, kl = shared.halves
        assert [h.real_tokens for h in shared.halves] == [sum(len(getattr(u, k).input_ids) for u in units)
                                                          for k in ("first", "second")]
        assert forwards == [(kl.tensors["input_ids"].numel(), False),
                            (completions.tensors["input_ids"].numel(), True)]
    elif method == "kto":
        assert forwards == [(shared.tensors["input_ids"].numel(), True)]
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-7)
    assert want[1] and want[1].keys() == got[1].keys()
    for name, grad in want[1].items():
        assert (got[1][name] - grad).norm() <= 5e-5 * max(grad.norm(), 1e-12), name


@pytest.mark.parametrize("offload, bucket", [(False, 1), (True, 5)])
def test_kto_kl_completions_riding_along_skip_the_recompute_and_give_the_same_loss_and_gradients(
        tmp_path, tiny_model, monkeypatch, offload, bucket):
    """Packed with each prompt once, KTO's KL completions ride along at the end of the row
    (jobs/data/pairs.py collate_units_riding): the first layer checkpointed (its input kept on the device,
    or by the offloader) recomputes the completions alone in backward, the second keeps its activations;
    the loss and LoRA gradients equal the whole units' (fp32, the fused engine), also where the recomputed
    part is rounded up to a multiple of `bucket` tokens (into a KL completion). The memory plan asks the
    method how it will run before plan_batches does (on a GPU within max_gpu_memory_gb): it gets an answer,
    whole units, and not an error that would drop the budget (engine_setup.budget_plan's fallback)."""
    from kernels import checkpoint, checkpoint_rows
    spec, job = kto_job(tmp_path, tiny_model, batch_size=4, fused_kernels=True)
    monkeypatch.setattr(preference, "KTO_RIDING", True)   # the bench's switch: a layer this small would not ride
    monkeypatch.setattr(checkpoint_rows, "BUCKET", bucket)
    lines, sizes = [], []
    # on a GPU within max_gpu_memory_gb the memory plan asks the method first, before plan_batches
    monkeypatch.setattr(engine_setup, "budget_plan", lambda self: sizes.append(self.method.fit_sizes()))
    trainer = Trainer(spec, job, EventWriter(job), log=lines.append)
    trainer.prepare()
    assert any("KL completions ride along" in line and "(forced)" in line for line in lines), lines
    assert trainer.plan.kto_kl == "riding" and sizes == [{}]   # the memory plan: whole units
    layers = checkpoint.decoder_layers(trainer.model)
    checkpoint._set_policy(layers, [True, False], offload, torch.device("cpu"))
    riding = trainer.plan.batch_at(0)[1]
    rows = riding.ints["kto_rows"]
    whole = PairPlan(trainer.examples, 4, 64, True, spec.seed, pad_id=trainer.tokenizer.pad_token_id,
                     shared=trainer.plan.shared).batch_at(0)[1]
    total = riding.tensors["input_ids"].numel()
    assert riding.tensors["input_ids"].shape == (1, whole.tensors["input_ids"].numel()) and rows.tokens < total
    within = rows.tokens not in riding.tensors["cu_seq_lens_q"].tolist()
    assert rows.tokens % bucket == 0 and within == (bucket > 1)   # bucket 5 cuts this batch within a document
    seen = []   # (recomputing, tokens) of every call of the first layer's attention
    layers[0].self_attn.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append((checkpoint.recomputing(), kwargs["hidden_states"].shape[1])),
        with_kwargs=True)
    count = torch.tensor(float(whole.label_tokens))
    want = loss_and_grads(trainer, [whole], count)
    seen.clear()
    got = loss_and_grads(trainer, [riding], count)
    assert seen == [(False, total), (False, total), (True, rows.tokens)]   # the reference, the policy, the recompute
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-7)
    assert want[1] and want[1].keys() == got[1].keys()
    for name, grad in want[1].items():
        assert (got[1][name] - grad).norm() <= 5e-5 * max(grad.norm(), 1e-12), name


def kto_job(tmp_path, tiny_model, **extra):
    rows = [{"prompt": r["prompt"], "completion": r[k], "label": k == "chosen"}
            for r in PAIRS for k in ("chosen", "rejected")]
    data = tmp_path / "kto.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    job = tmp_path / "job"
    values = {"model": str(tiny_model), "output_dir": str(job), "method": "kto", "dataset": str(data), "packing": "on",
              "batch_size": 2, "max_seq_length": 32, "dtype": "fp32", "max_steps": 3, "save_steps": 0, **extra}
    return JobSpec.from_dict(values), job


def test_kto_sizes_its_passes_by_the_completions_its_batches_hold(tmp_path, tiny_model, monkeypatch):
    """The trainer hands the memory plan the completion tokens its passes with grad may hold, read from
    the training plan's own micro-batches (jobs/models/fit_kto.py), before the plan cuts them."""
    spec, job = kto_job(tmp_path, tiny_model, max_gpu_memory_gb=8.0, gradient_accumulation_steps=2)
    monkeypatch.setattr(preference, "KTO_HALVES", True)   # the bench's switch; off, whole units are planned
    seen = {}

    def pass_units(spec, model_config, trainable=None, fused=None, world=1, kto_completions=None):
        seen["completions"] = kto_completions
        return spec.batch_size
    monkeypatch.setattr(base, "budgeted", lambda device, spec: True)
    monkeypatch.setattr(fit, "pass_units", pass_units)
    trainer = Trainer(spec, job, EventWriter(job), log=lambda line: None)
    trainer.prepare()
    bounds = trainer.plan.completion_bounds(3 * 2)   # max_steps x accumulation micro-batches
    assert seen["completions"] == bounds == trainer.method.fit_sizes()["kto_completions"] and len(bounds) == 2
    whole = max(trainer.plan.batch_at(i)[1].halves[0].real_tokens for i in range(6))
    assert sum(bounds) == whole < 2 * 2 * 32   # the largest micro-batch's completions, under its 2 whole rows


def test_kto_with_the_reference_precomputed_copies_no_whole_batch_and_trains_the_same(tmp_path, tiny_model,
                                                                                      monkeypatch):
    """precompute_reference: the step looks the reference sums up and runs the policy on the halves, so
    the training batch carries only its units' indices, labels and validity beside them; its loss and
    gradients are the full batch's."""
    spec, job = kto_job(tmp_path, tiny_model, precompute_reference=True)
    monkeypatch.setattr(preference, "KTO_HALVES", True)
    trainer = Trainer(spec, job, EventWriter(job), log=lambda line: None)
    trainer.prepare()
    lean = trainer.plan.batch_at(0)[1]
    full_plan = PairPlan(trainer.examples, 2, 64, True, spec.seed, pad_id=trainer.tokenizer.pad_token_id,
                         kto_kl="halves", shared=trainer.plan.shared)
    full = full_plan.batch_at(0)[1]
    assert set(lean.tensors) == {"pref_units", "pref_label", "pref_valid"} and "input_ids" in full.tensors
    count = torch.tensor(float(lean.label_tokens))
    (a, grads_a), (b, grads_b) = loss_and_grads(trainer, [lean], count), loss_and_grads(trainer, [full], count)
    assert a.equal(b) and grads_a.keys() == grads_b.keys() and all(grads_a[n].equal(grads_b[n]) for n in grads_a)


def test_kto_runs_its_kl_completions_without_grad_only_where_a_layer_is_large(monkeypatch):
    """The halves, and riding along (where a packed batch holds each prompt once), pay where the step waits on
    the GPU (the 8B, 218M weights a layer) and cost where it waits on the host (the 1B, 61M): measured on an
    H100 (bench/results/job.jsonl); the bench's switches force."""
    from transformers import LlamaConfig
    one_b = LlamaConfig(hidden_size=2048, intermediate_size=8192, num_attention_heads=32, num_key_value_heads=8)
    eight_b = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8)
    (small, small_why), (large, large_why) = preference.kto_halves_for(one_b), preference.kto_halves_for(eight_b)
    assert (small, large) == (False, True)
    assert "61M weights a layer" in small_why and "218M weights a layer" in large_why
    # packed with each prompt once, the large layer's KL completions ride along instead (measured the same way)
    assert [preference.kto_kl_mode_for(c, True)[0] for c in (one_b, eight_b)] == ["whole", "riding"]
    assert preference.kto_kl_mode_for(eight_b, False)[0] == "halves"
    monkeypatch.setattr(preference, "KTO_HALVES", True)
    assert preference.kto_halves_for(one_b) == (True, "kto: KL completions in a forward without grad (forced)")
    assert preference.kto_kl_mode_for(eight_b, True)[0] == "halves"
