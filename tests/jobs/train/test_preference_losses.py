"""Preference losses on a tiny Llama, fp32, against plain PyTorch on full logits.

The references below are written from the papers (and TRL's trainers) with the model's own
logits, log_softmax and a gather, so they share nothing with the method but the batch's token ids.
At the first step the adapter's B is 0, so policy = reference and DPO's loss is ln 2 exactly."""
import json
import math

import pytest
import torch
import torch.nn.functional as F

from jobs.data.pairs import collate_units
from jobs.io.events import EventWriter
from jobs.spec import JobSpec
from jobs.train.loop import Trainer

PAIRS = [{"prompt": f"What is {i} plus {i}?", "chosen": f"{2 * i}.",
          "rejected": "Let me think about it for a long time" + " first" * (i % 3)} for i in range(7)]


def write_rows(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def kto_rows():
    return [{"prompt": r["prompt"], "completion": r["chosen"] if i % 2 else r["rejected"], "label": bool(i % 2)}
            for i, r in enumerate(PAIRS)]


def prepared(tmp_path, tiny_model, method, rows=None, **overrides):
    data = write_rows(tmp_path / "rows.jsonl", rows or (kto_rows() if method == "kto" else PAIRS))
    spec = JobSpec.from_dict({"model": str(tiny_model), "dataset": str(data), "method": method,
                              "output_dir": str(tmp_path / "job"), "max_seq_length": 48, "batch_size": 4,
                              "dtype": "fp32", "seed": 3, **overrides})
    trainer = Trainer(spec, tmp_path / "job", EventWriter(tmp_path / "job"), log=lambda line: None)
    trainer.prepare()
    return trainer


def full_logit_sums(model, batch):
    """Summed log p(answer) of each row of a padded batch from the model's full logits."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
    labels = batch["labels"][:, 1:]
    logp = torch.log_softmax(logits[:, :-1], dim=-1)
    keep = labels != -100
    picked = logp.gather(2, torch.where(keep, labels, 0).unsqueeze(2)).squeeze(2) * keep
    return picked.sum(1).view(-1, 2), keep.sum(1).view(-1, 2).float()


def reference_loss(method, model, batch, spec):
    """The plain-PyTorch loss per unit (mean over the batch's units)."""
    sums, counts = full_logit_sums(model, batch)
    if method in ("dpo", "kto"):
        with torch.no_grad(), model.disable_adapter():
            ref, _ = full_logit_sums(model, batch)
    if method == "dpo":   # Rafailov et al. 2023, eq. 7
        return -F.logsigmoid(spec.beta * ((sums[:, 0] - ref[:, 0]) - (sums[:, 1] - ref[:, 1]))).mean()
    means = sums / counts
    if method == "simpo":   # Meng et al. 2024, eq. 6
        return -F.logsigmoid(spec.beta * (means[:, 0] - means[:, 1]) - spec.simpo_gamma).mean()
    if method == "orpo":   # Hong et al. 2024, eq. 6-7: L_SFT + lambda * L_OR
        odds = lambda p: torch.log(torch.exp(p) / (1 - torch.exp(p)))
        return (-means[:, 0] - spec.orpo_lambda * F.logsigmoid(odds(means[:, 0]) - odds(means[:, 1]))).mean()
    # KTO (Ethayarajh et al. 2024; TRL kto_loss): z0 from the mismatched second sequences
    z0 = (sums[:, 1] - ref[:, 1]).mean().clamp(min=0).detach()
    ratio, good = sums[:, 0] - ref[:, 0], batch["pref_label"]
    return (good * spec.kto_desirable_weight * (1 - torch.sigmoid(spec.beta * (ratio - z0)))
            + (1 - good) * spec.kto_undesirable_weight * (1 - torch.sigmoid(spec.beta * (z0 - ratio)))).mean()


def first_batch(trainer):
    return collate_units(trainer.examples[:4], trainer.tokenizer.pad_token_id).to(trainer.device)


def lora_grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad and p.grad is not None}


def nudge_b(model, seed=0):
    """Move the adapter off B = 0, so policy != reference and every term of the loss is exercised."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)


def check_parity(trainer, method, rtol=1e-5):
    model, batch = trainer.model, first_batch(trainer)
    count = torch.tensor(4.0)
    model.zero_grad()
    ours, _ = trainer.method.loss(model, batch, count)
    ours.backward()
    got = lora_grads(model)
    model.zero_grad()
    want_loss = reference_loss(method, model, batch, trainer.spec)
    want_loss.backward()
    want = lora_grads(model)
    assert float(ours.detach()) == pytest.approx(float(want_loss), rel=rtol, abs=1e-7)
    assert got.keys() == want.keys() and got
    for name in want:
        scale = want[name].abs().max().clamp(min=1e-12)
        assert float((got[name] - want[name]).abs().max() / scale) < rtol * 10, name
    return float(ours)


def test_dpo_at_the_first_step_is_ln2_and_its_gradient_matches_full_logits(tmp_path, tiny_model):
    trainer = prepared(tmp_path, tiny_model, "dpo", fused_kernels=True)
    loss = check_parity(trainer, "dpo")
    assert loss == pytest.approx(math.log(2), abs=1e-6)


@pytest.mark.parametrize("method", ["dpo", "orpo", "simpo", "kto"])
def test_each_loss_matches_its_pytorch_reference_off_the_start(tmp_path, tiny_model, method):
    trainer = prepared(tmp_path, tiny_model, method, fused_kernels=True, beta=0.5)
    # every layer trains, checkpoints included: the step's guard reads the PeftModel's own flag, and
    # from_pretrained left the base under it in eval mode (ORPO/SimPO have no reference pass to reset it)
    assert all(m.training for m in trainer.model.modules())
    nudge_b(trainer.model)
    check_parity(trainer, method)


def test_packed_and_padded_batches_give_the_same_loss(tmp_path, tiny_model):
    trainer = prepared(tmp_path, tiny_model, "dpo", packing="on")
    nudge_b(trainer.model)
    units, pad = trainer.examples[:4], trainer.tokenizer.pad_token_id
    padded = collate_units(units, pad).to(trainer.device)
    packed = collate_units(units, pad, [[0, 1], [2, 3]], 4 * trainer.spec.max_seq_length).to(trainer.device)
    count = torch.tensor(4.0)
    a, ma = trainer.method.loss(trainer.model, padded, count)
    b, mb = trainer.method.loss(trainer.model, packed, count)
    assert float(a) == pytest.approx(float(b), rel=1e-5)
    assert torch.allclose(ma, mb, rtol=1e-4, atol=1e-5)


def test_precomputed_reference_equals_the_per_step_one(tmp_path, tiny_model):
    trainer = prepared(tmp_path, tiny_model, "dpo", precompute_reference=True)
    batch = first_batch(trainer)
    kept = trainer.method._reference(trainer.model, batch, training=True)
    fresh = trainer.method._reference(trainer.model, batch, training=False)
    assert torch.allclose(kept, fresh, rtol=1e-5, atol=1e-5)
