"""What the passes tests share (test_preference_passes.py, test_sft_passes.py): a trainer whose micro-batch
trains a unit a pass on the CPU, and the loss and gradients of a list of batches run as the loop's step
runs them."""
import torch

from jobs.io.events import EventWriter
from jobs.models import fit
from jobs.train.loop import Trainer
from jobs.train.methods import base


def trainer_in_passes(spec, job, monkeypatch) -> tuple[Trainer, dict, list[str]]:
    """The job's trainer, prepared with its micro-batches cut a unit a pass: the GPU guard opened and the
    plan's arithmetic replaced by a spy that records the LoRA count it is given (the arithmetic:
    tests/jobs/models). Returns (trainer, what the spy saw, the log lines)."""
    seen, lines = {}, []

    def pass_units(spec, model_config, trainable=None, fused=None, world=1):
        seen["trainable"] = trainable
        return 1
    monkeypatch.setattr(base, "budgeted", lambda device, spec: True)
    monkeypatch.setattr(fit, "pass_units", pass_units)
    trainer = Trainer(spec, job, EventWriter(job), log=lines.append)
    trainer.prepare()
    return trainer, seen, lines


def loss_and_grads(trainer, batches, count: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """The summed loss of `batches` (each divided by `count`, as the loop's step divides) and the
    gradients they leave, by parameter name."""
    model = trainer.model
    model.train()
    model.zero_grad(set_to_none=True)
    total = 0.0
    for piece in batches:
        loss, _ = trainer.method.loss(model, piece.to("cpu"), count)
        loss.backward()
        total += loss.detach()
    return total, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_passes_give_the_whole(trainer, whole, parts) -> None:
    """The passes' loss and gradients equal the whole micro-batch's (fp32), normalised over its units."""
    count = torch.tensor(float(whole.label_tokens))
    one, split = loss_and_grads(trainer, [whole], count), loss_and_grads(trainer, parts, count)
    torch.testing.assert_close(split[0], one[0], rtol=1e-5, atol=1e-7)
    assert one[1] and one[1].keys() == split[1].keys()
    for name, grad in one[1].items():
        assert (split[1][name] - grad).norm() <= 1e-5 * max(grad.norm(), 1e-12), name
