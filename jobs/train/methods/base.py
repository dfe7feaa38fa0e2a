"""What a training method gives the shared loop (jobs/train/loop.py).

The idea is torchtune's: one readable recipe, with the objective as a component beside it. A
method builds its examples and batch plans, computes the loss of one micro-batch (already divided
by the global batch's normalisation count, so gradient accumulation and data parallel give the
update of one large batch), and names the extra numbers a step event carries. Everything else
(optimizer, LR schedule, accumulation, clipping, DDP, checkpoints, cancel, events) is the loop's."""
from __future__ import annotations

import torch

from jobs.data.packing import passes_of
from jobs.messages import say
from jobs.models.errors import ModelError
from jobs.train.sharding import model_world


class StepCancelled(Exception):
    """Raised by a method's `prepare_step` when the job was cancelled while it prepared the step (a
    GRPO rollout stopped midway): nothing of the step was trained or logged, and the random state is
    as before the step, so the loop stops at the last step and a resume samples that step afresh."""


class Method:
    """Base class: subclasses fill in the data, the loss and their metrics."""

    name = "base"
    # may the loop capture this method's step as one CUDA graph (jobs/train/graph_steps.py)?
    capturable = False
    # extra per-step numbers: each micro-batch returns their sums; the step event carries
    # sum / the step's normalisation count (a mean over pairs, tokens, ... like the loss)
    metric_names: tuple[str, ...] = ()
    # does prepare_step sample from the policy (GRPO's rollout)? Then the loop honours a stop before
    # the sampling starts, and trains a step once it is sampled: a cancel costs no rollout that is
    # thrown away, and whatever a rollout logged (completions.jsonl) belongs to a trained step; with
    # one process a stop during the rollout ends it at its next host check (StepCancelled)
    samples_each_step = False

    def __init__(self, trainer):
        self.trainer = trainer
        self.spec = trainer.spec

    def for_model(self, config) -> "Method":
        """The method to run on the model of `config` (its transformers config): this one, or for a
        vision-language model a variant that reads images (SFT's: methods/vision_sft.py)."""
        if getattr(config, "vision_config", None) is not None:
            raise ModelError(say("method_text_only", method=self.name))
        return self

    # ---- data -----------------------------------------------------------------------
    def load_data(self) -> tuple[list, list]:
        """(train examples, eval examples), each with `input_ids` (its length is used for packing)."""
        raise NotImplementedError

    def plan_batches(self):
        """(train plan, eval plan or None): objects with `batch_at`, `per_epoch`, `all_batches`, and
        `epoch_batches(epoch)` and `lengths`, which a checkpoint fingerprints (jobs/train/rng_state.py);
        jobs/data/packing.py BatchPlan is the SFT one."""
        raise NotImplementedError

    def batch_tokens(self) -> int:
        """Tokens one micro-batch may hold at most (the checkpointing policy sizes itself by it; the
        fit check reads the same JobSpec.batch_tokens)."""
        return self.spec.batch_tokens()

    def fit_sizes(self) -> dict:
        """What the memory plan knows of this job beyond its JobSpec, as jobs/models/fit.py keyword
        arguments (GRPO: its longest prompt, and whether its passes hold each prompt once). None here."""
        return {}

    def loss_units(self, batch) -> int:
        """What this micro-batch's loss is normalised over (answer tokens for SFT, pairs for DPO)."""
        return batch.label_tokens

    def prepare_step(self, group: list) -> list:
        """Host work on one optimizer step's micro-batches [(epoch, batch)] before their device
        step, e.g. GRPO's sampling and rewards; may fill each batch's tensors and counts (the
        loop reads loss_units and real_tokens after it) and may return more micro-batches than it
        was given (GRPO's policy passes within a memory budget). Default: a micro-batch cut into
        passes within the budget (pass_units) trains pass by pass; the loop's count normalises the
        loss over the whole step's units, so the gradients add up to the whole's."""
        return [(x, part) for x, batch in group for part in passes_of(batch)]

    def plan_pass_units(self) -> int | None:
        """Units (packed rows, pairs or examples) one forward + backward of a micro-batch takes within
        max_gpu_memory_gb (jobs/models/fit.py pass_units, the split the checkpointing plan was sized
        for), the plan's `pass_units`; None: the whole micro-batch, as without a budget or off the GPU.
        For the methods whose batches jobs/models/fit_passes.py may cut (preference, text SFT)."""
        t, spec = self.trainer, self.spec
        if not budgeted(t.device, spec):
            return None
        from jobs.models import fit
        from jobs.models.fit_passes import unit_name
        part = fit.pass_units(spec, t.model.config, trainable=t.trainable, world=model_world(t), **self.fit_sizes())
        if part >= spec.batch_size:
            return None
        t.log(f"{spec.method}: each micro-batch of {spec.batch_size} {unit_name(spec, t.packed, spec.batch_size)} "
              f"trains in passes of up to {part}, to stay within max_gpu_memory_gb {spec.max_gpu_memory_gb:g}")
        return part

    def before_training(self) -> None:
        """Once after the model and plans exist, before the first step (e.g. reference log-probs)."""

    # ---- the step -------------------------------------------------------------------
    def loss(self, model, batch: dict, count: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(loss of the micro-batch divided by `count`, metric sums [len(metric_names)] or None).
        Device work only: no host sync, so steps can queue ahead of the GPU."""
        raise NotImplementedError

    def after_backward(self, micro_batches: list[dict]) -> None:
        """After the optimizer step's backward, before clipping and the step: nothing by default."""

    def step_fields(self, metrics: list[float]) -> dict:
        """The step event's extra fields from the step's metric means (in metric_names order)."""
        return {name: value for name, value in zip(self.metric_names, metrics)}

    # ---- evaluation -----------------------------------------------------------------
    def evaluate(self, model, plan, device) -> dict:
        """Fields of the eval event: at least eval_loss and eval_tokens (the count it averaged)."""
        raise NotImplementedError


def budgeted(device, spec) -> bool:
    """Whether a micro-batch may train in passes (preference and SFT rows, GRPO's sampling and policy
    step): on a GPU with max_gpu_memory_gb."""
    return device.type == "cuda" and spec.max_gpu_memory_gb > 0
