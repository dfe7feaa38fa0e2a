"""Preference tuning: DPO, ORPO, SimPO and KTO as methods of the shared loop.

Data: jobs/data/pairs.py (units of two sequences: chosen + rejected, or a KTO completion + its
mismatched KL pair), batched by PairPlan (the SFT BatchPlan's packing and length grouping; a
packed row is 2 x max_seq_length long, so a whole unit always fits one row). Log-probs:
preference_forward.py (one forward, fused log-probs, no logits). Losses: preference_losses.py.
The loss of a micro-batch is the sum of its units' losses / the global batch's units (per pair).

Reference policy (DPO, KTO): the base model with the adapter off, at every step, or with
`precompute_reference: true` once over the training units before the first step, kept per unit
on the device (TRL's precompute_ref_log_probs)."""
from __future__ import annotations

import math

import torch

from jobs.data import shared_prefix
from jobs.data.packing import passes_of, resolve_packing
from jobs.data.pairs import PairPlan, load_units
from jobs.models.fit_shape import _Shape
from jobs.train import evaluate
from jobs.train.methods import preference_losses as losses
from jobs.train.methods.base import Method
from jobs.train.methods.logprobs import report_op
from jobs.train.methods.preference_forward import reference_sums, sequence_sums, unwrap
from kernels.checkpoint import checkpointing_paused
from kernels.checkpoint_rows import backward_rows, declined
from kernels.arch import text_config

# the reference pass before the policy forward (PreferenceMethod.unit_terms); False: after it, as until
# 2026-12-04 (bench/bench_fp8.py SWITCHES "policyfirst" measures that order on the product path)
REFERENCE_FIRST = True
# KTO's training batches can carry their halves apart, the KL completions then running in a forward without
# grad (KTO.policy_sums): less GPU work and a lower peak, but one more forward's launches. It pays where the
# step waits on the GPU and costs where it waits on the host, so it is chosen by the size of a layer
# (kto_halves_for). Measured on an H100 (bench/results/job.jsonl): the 1B (61M weights a layer), host-bound,
# 0.262 / 0.240 s a step with the halves against 0.193 / 0.182 without (session 56); the 8B (218M a layer),
# GPU-bound, 0.527 s with against 0.584 without (session 59). None decides per model; True / False force it
# (bench/bench_fp8.py SWITCHES "ktohalves" / "ktowhole" for an A/B).
KTO_HALVES: bool | None = None
HALVES_MIN_LAYER_WEIGHTS = 150e6   # between the two measured sizes
# Where a packed batch holds each prompt once, KTO's KL completions can ride along in the completions' forward
# instead: packed last, they skip every checkpointed layer's recompute and backward (kernels/checkpoint_rows.py)
# and their prompts run once for both answers. Measured on an H100 within the peer's peak (bench/results/
# job.jsonl, session 65): the 8B 6,498 pair tokens/s riding against 5,967 with the halves (+8.9 %, the same
# losses to 4 digits); the 1B, host-bound, 19,145 against 20,874 whole (-8 %: its profile's aten::mm took 41
# against 24 ms of host time a step, the recompute's GEMMs on a row count that changes every step). So it
# rides where the halves would run. None: so; True: whenever the batch allows (bench SWITCHES "ktoride");
# False: never ("ktonoride").
KTO_RIDING: bool | None = None


def kto_kl_mode_for(model_config, can_ride: bool) -> tuple[str, str]:
    """("riding", "halves" or "whole": how KTO's KL completions run, the log's line saying why)."""
    halves, line = kto_halves_for(model_config)
    if can_ride and KTO_HALVES is None and (KTO_RIDING or (KTO_RIDING is None and halves)):
        why = "forced" if KTO_RIDING else f"{_layer_weights(model_config) / 1e6:.0f}M weights a layer: GPU-bound"
        return "riding", ("kto: KL completions ride along the completions' forward, each prompt once; checkpointed "
                          f"layers recompute and backpropagate the completions alone ({why})")
    return ("halves" if halves else "whole"), line


def _layer_weights(model_config) -> float:
    shape = _Shape.of(model_config)
    return shape.linear_weights() / shape.layers


def kto_halves_for(model_config) -> tuple[bool, str]:
    """(whether KTO's KL completions run in their own forward without grad, the log's line saying why)."""
    if KTO_HALVES is not None:
        how = "in a forward without grad" if KTO_HALVES else "trained in one forward with the answers"
        return KTO_HALVES, f"kto: KL completions {how} (forced)"
    weights = _layer_weights(model_config)
    if weights >= HALVES_MIN_LAYER_WEIGHTS:
        return True, (f"kto: KL completions in a forward without grad ({weights / 1e6:.0f}M weights a layer: "
                      "the step waits on the GPU, so the backward they skip is worth the extra forward)")
    return False, (f"kto: KL completions trained in one forward with the answers ({weights / 1e6:.0f}M weights a "
                   "layer: the step waits on the host, where one more forward costs more than it saves)")


PAIR_METRICS = ("chosen_reward", "rejected_reward", "reward_margin", "reward_accuracy")


class PreferenceMethod(Method):
    name = "preference"
    metric_names = PAIR_METRICS
    uses_reference = True

    def __init__(self, trainer):
        super().__init__(trainer)
        self.reference: torch.Tensor | None = None   # [units, 2] precomputed sums
        self.pass_units: int | None = None           # units a forward within max_gpu_memory_gb (None: all)
        self.shared: tuple[int, int] | None = None   # padded units hold their prompt once (PairPlan)
        self.layout: tuple | None = None             # (packed, its line, shared, its line): _layout

    # ---- data -----------------------------------------------------------------------
    def load_data(self) -> tuple[list, list]:
        t, spec = self.trainer, self.spec
        units = load_units(spec, t.tokenizer, t.data_dir, log=t.log)
        train, held = evaluate.split_holdout(units, spec.eval_fraction, spec.seed)
        if spec.eval_dataset:
            held = load_units(spec, t.tokenizer, t.data_dir, key="eval_dataset", log=t.log)
        t.log(f"{spec.method}: {len(train)} {'examples' if spec.method == 'kto' else 'pairs'} to train on")
        return train, held

    def plan_batches(self):
        t, spec = self.trainer, self.spec
        row = 2 * spec.max_seq_length
        _, line, self.shared, shared_line = self._layout()
        t.log(line)
        if t.packed:
            from kernels.packed_attention import use_packed_attention
            t.log("  " + use_packed_attention(t.model))
        self.pass_units = self.plan_pass_units()
        t.log(shared_line)
        ranks = dict(rank=t.dist.rank, world=t.dist.world_size, pad_id=t.tokenizer.pad_token_id,
                     pass_units=self.pass_units, shared=self.shared)
        size = spec.batch_size * t.dist.world_size
        mode = self.kl_mode()
        plan = PairPlan(t.examples, size, row, t.packed, spec.seed, accumulation=spec.gradient_accumulation_steps,
                        kto_kl=mode, reference_given=mode == "halves" and spec.precompute_reference, **ranks)
        eval_plan = (PairPlan(t.eval_examples, size, row, t.packed, spec.seed, shuffle=False, **ranks)
                     if t.eval_examples else None)
        report_op(t, "chosen + rejected in one forward, label rows only")
        return plan, eval_plan

    def kl_mode(self) -> str:
        """How training batches hold KTO's KL completions (jobs/data/pairs.py PairPlan `kto_kl`; KTO decides)."""
        return "whole"

    def _layout(self) -> tuple:
        """(packed, the log's packing line, _shared_prompts' pair), decided once: the memory plan
        (jobs/train/engine_setup.py accelerate, KTO's fit_sizes) reads them before plan_batches logs them."""
        if self.layout is None:
            t, spec = self.trainer, self.spec
            lengths = [len(u.input_ids) for u in t.examples]
            t.packed, line = resolve_packing(spec.packing, t.device.type, lengths, 2 * spec.max_seq_length, None,
                                             spec.seed)
            self.layout = (t.packed, line, *self._shared_prompts())
        return self.layout

    def _shared_prompts(self) -> tuple[tuple[int, int] | None, str]:
        """((hidden, MLP size) when micro-batches hold each unit's prompt once (PairPlan: packed always,
        padded where that costs fewer FLOPs), else None; the log's line saying which (jobs/data/shared_prefix.py))."""
        t = self.trainer
        text = text_config(t.model.config)
        if t.packed:
            reason = shared_prefix.packed_reason(t.device.type, t.dtype, text)
            how = "packed: the prompt, then each answer, whose attention reaches back to it"
        else:
            reason = shared_prefix.unshared_reason(t.device.type, text)
            how = "the prompt, then both sequences' answers in one row under a 4-D mask"
        if reason:
            return None, f"{self.spec.method} prompts: once per sequence ({reason})"
        unit = "pair" if self.spec.method != "kto" else "example"
        return shared_prefix.model_size(text), f"{self.spec.method} prompts: once per {unit} ({how})"

    # ---- reference ------------------------------------------------------------------
    def before_training(self) -> None:
        t = self.trainer
        if not (self.uses_reference and self.spec.precompute_reference):
            return
        plan = PairPlan(t.examples, self.spec.batch_size, 2 * self.spec.max_seq_length, t.packed, self.spec.seed,
                        pad_id=t.tokenizer.pad_token_id, shuffle=False, pass_units=self.pass_units,
                        shared=self.shared)
        size = max(u.index for u in t.examples) + 1
        self.reference = torch.zeros(size, 2, dtype=torch.float32, device=t.device)
        for part in (part for batch in plan.all_batches() for part in passes_of(batch)):
            kwargs = part.to(t.device)
            sums, _ = reference_sums(t.model, kwargs, self.spec.fused_kernels)
            self.reference[kwargs["pref_units"]] = sums.view(-1, 2).float()
        t.log(f"reference log-probs: precomputed for {len(t.examples)} units (adapter off)")

    def _reference(self, model, batch: dict, training: bool) -> torch.Tensor:
        """[P, 2] reference sums of the batch's units."""
        if self.reference is not None and training:
            return self.reference[batch["pref_units"]]
        return reference_sums(model, batch, self.spec.fused_kernels)[0].view(-1, 2)

    # ---- the step -------------------------------------------------------------------
    def unit_terms(self, model, batch: dict, training: bool = True):
        """(loss per unit [P], metric sums [len(metric_names)]). The reference pass runs first, as TRL's
        DPOTrainer computes ref log-probs before the policy forward: run after it, its forward's
        transient (a layer's gate/up over every token) came on top of the policy's kept activations,
        1.1 GiB over the fit check's prediction for 5 packed rows of 5,408 tokens on the 1B shape
        (H200, 2026-12-04, bench/NOTES.md); before it, it peaks beside the weights alone."""
        first = self.uses_reference and REFERENCE_FIRST
        ref = self._reference(model, batch, training) if first else None
        sums, counts = self.policy_sums(model, batch)
        sums, counts = sums.view(-1, 2), counts.view(-1, 2).clamp(min=1)
        if self.uses_reference and not first:
            ref = self._reference(model, batch, training)
        loss, chosen, rejected = self.objective(sums, counts, ref, batch)
        valid = batch["pref_valid"]
        return loss * valid, self.metric_sums(chosen, rejected, valid, batch)

    def policy_sums(self, model, batch: dict) -> tuple:
        """(log-prob sums [2P], answer tokens [2P]) of every sequence under the policy: one forward."""
        return sequence_sums(model, batch, self.spec.fused_kernels)

    def objective(self, sums, counts, ref, batch):
        raise NotImplementedError

    def metric_sums(self, chosen, rejected, valid, batch) -> torch.Tensor:
        margin = chosen - rejected
        return torch.stack([(chosen * valid).sum(), (rejected * valid).sum(), (margin * valid).sum(),
                            ((margin > 0).float() * valid).sum()])

    def loss(self, model, batch: dict, count: torch.Tensor):
        per_unit, metrics = self.unit_terms(model, batch)
        return per_unit.sum() / count, metrics

    # ---- evaluation -----------------------------------------------------------------
    def evaluate(self, model, plan, device) -> dict:
        """eval_loss (the mean loss per unit) and the same metrics as the steps, as eval_<name>."""
        total, sums, units = 0.0, torch.zeros(len(self.metric_names)), 0
        model.eval()
        with torch.no_grad():
            for batch in (part for whole in plan.all_batches() for part in passes_of(whole)):
                per_unit, metrics = self.unit_terms(model, batch.to(device), training=False)
                total += float(per_unit.sum())
                sums += metrics.float().cpu()
                units += batch.label_tokens
        model.train()
        means = self.step_fields([float(v) / max(1, units) for v in sums])
        loss = total / units if units else math.nan
        return {"eval_loss": loss, "eval_tokens": units, **{f"eval_{k}": v for k, v in means.items()}}


class DPO(PreferenceMethod):
    name = "dpo"

    def objective(self, sums, counts, ref, batch):
        return losses.dpo_loss(sums[:, 0], sums[:, 1], ref[:, 0], ref[:, 1], self.spec.beta)


class ORPO(PreferenceMethod):
    name = "orpo"
    uses_reference = False

    def objective(self, sums, counts, ref, batch):
        means = sums / counts
        return losses.orpo_loss(means[:, 0], means[:, 1], self.spec.orpo_lambda)


class SimPO(PreferenceMethod):
    name = "simpo"
    uses_reference = False

    def objective(self, sums, counts, ref, batch):
        means = sums / counts
        return losses.simpo_loss(means[:, 0], means[:, 1], self.spec.beta, self.spec.simpo_gamma)


class KTO(PreferenceMethod):
    """Unpaired: chosen_reward is the mean reward of desirable examples, rejected_reward of
    undesirable ones, reward_accuracy the share whose reward has the label's sign."""
    name = "kto"
    metric_names = PAIR_METRICS + ("kto_kl", "desirable_share")

    def __init__(self, trainer):
        super().__init__(trainer)
        self.completions: tuple[int, ...] | None = None   # fit_sizes', counted once
        self.mode: str | None = None                       # kto_kl_mode_for, decided (and logged) once
        self.declined_said = 0                             # kernels/checkpoint_rows.py reasons logged

    def kl_mode(self) -> str:
        if self.mode is None:
            packed, _, shared, _ = self._layout()   # the memory plan asks before plan_batches sets the layout
            # a cut recompute draws other dropout masks than its forward did: riding is exact without dropout
            config = self.trainer.model.config
            dropout = self.spec.lora_dropout or getattr(text_config(config), "attention_dropout", 0.0)
            can_ride = packed and shared is not None and not dropout
            self.mode, line = kto_kl_mode_for(config, can_ride)
            self.trainer.log(line)
        return self.mode

    def fit_sizes(self) -> dict:
        """What a pass with grad of this job's batches holds: the completion tokens of k units, for k up to
        a micro-batch's (jobs/data/pairs.py PairPlan.completion_bounds), over the micro-batches the job
        will train, read from its units grouped as the training plan groups them; the memory plan sizes
        that pass by them (jobs/models/fit_kto.py). Nothing when the KL completions train in the same
        forward (not the halves): whole units, as planned without them."""
        if self.kl_mode() != "halves":
            return {}
        if self.completions is None:
            t, spec = self.trainer, self.spec
            packed, _, shared, _ = self._layout()
            accumulation, world = spec.gradient_accumulation_steps, t.dist.world_size
            plan = PairPlan(t.examples, spec.batch_size * world, 2 * spec.max_seq_length, packed, spec.seed,
                            pad_id=t.tokenizer.pad_token_id, accumulation=accumulation, world=world, shared=shared)
            # the micro-batches the loop trains (a resume trains fewer)
            self.completions = plan.completion_bounds(spec.optimizer_steps(plan.per_epoch) * accumulation)[
                :spec.batch_size]
        return {"kto_completions": self.completions}

    def policy_sums(self, model, batch: dict) -> tuple:
        """A riding batch (jobs/data/pairs.py collate_units_riding): one forward, whose checkpointed layers
        recompute and backpropagate the completions alone (kernels/checkpoint_rows.py). A training batch's
        halves apart (jobs/data/pairs.py KTOBatch): the KL completions in a forward
        without grad (in training mode, as they ran before, with no layer checkpointed: nothing is
        recomputed from it), then the completions with grad. Each half fills its own sequences' slots,
        so the sums add up to the one forward's; the KL completions' tokens skip backward and keep no
        activations (on the 1B KTO row about half of a step's answer tokens)."""
        riding = batch.get("kto_rows")
        if riding is not None and torch.is_grad_enabled():
            with backward_rows(unwrap(model), riding):
                sums = sequence_sums(model, batch, self.spec.fused_kernels)
            self._say_declined()
            return sums
        halves = batch.get("kto_halves")
        if not halves or not torch.is_grad_enabled():
            return super().policy_sums(model, batch)
        completions, kl_completions = halves
        with torch.no_grad(), checkpointing_paused(unwrap(model)):
            kl_sums, kl_counts = sequence_sums(unwrap(model), kl_completions, self.spec.fused_kernels)
        sums, counts = sequence_sums(model, completions, self.spec.fused_kernels)
        return sums + kl_sums, counts + kl_counts

    def _say_declined(self) -> None:
        """Each reason a layer recomputed every token (still exact, only slower), once in the log."""
        reasons = declined()
        for reason in reasons[self.declined_said:]:
            self.trainer.log(f"note: a layer recomputed its KL completions too ({reason})")
        self.declined_said = len(reasons)

    def objective(self, sums, counts, ref, batch):
        kl = losses.kto_kl(sums[:, 1], ref[:, 1], batch["pref_valid"])
        self._kl = kl
        spec = self.spec
        return losses.kto_loss(sums[:, 0], ref[:, 0], batch["pref_label"], kl, spec.beta,
                               spec.kto_desirable_weight, spec.kto_undesirable_weight)

    def metric_sums(self, chosen, rejected, valid, batch) -> torch.Tensor:
        good = batch["pref_label"] * valid
        bad = (1 - batch["pref_label"]) * valid
        right = ((chosen > 0).float() * good + (rejected < 0).float() * bad).sum()
        return torch.stack([(chosen * good).sum(), (rejected * bad).sum(), torch.zeros_like(right), right,
                            self._kl * valid.sum(), good.sum()])

    def step_fields(self, metrics: list[float]) -> dict:
        chosen_sum, rejected_sum, _, accuracy, kl, share = metrics
        chosen = chosen_sum / share if share > 0 else 0.0
        rejected = rejected_sum / (1 - share) if share < 1 else 0.0
        return {"chosen_reward": chosen, "rejected_reward": rejected, "reward_margin": chosen - rejected,
                "reward_accuracy": accuracy, "kto_kl": kl}
