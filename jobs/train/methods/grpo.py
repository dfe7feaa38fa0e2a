"""GRPO (Group Relative Policy Optimization, Shao et al. 2024) with verifiable rewards.

Per optimizer step (the loop's `prepare_step` hook, before any device step): every micro-batch of
prompts gets `num_generations` completions sampled from the current policy (jobs/train/rollout.py),
scored by the job's rewards (jobs/train/rewards/), turned into group advantages. Then the loop
runs its usual forward/backward per micro-batch: `loss` runs the policy over prompt + completion
(packed: the micro-batch's sequences back to back in one row, grpo_data.rollout_tensors_packed;
off the GPU each prompt once with its group, rollout_tensors_shared; `grpo_packing` and
`grpo_prefix_sharing` choose), takes the last hidden states of the completion positions only and
hands them with the LM head's weight to the fused log-probs op (kernels/ops/fused_linear_logprobs.py:
no [tokens x vocab] logits), and the clipped GRPO loss of jobs/train/methods/grpo_loss.py. The
reference of the KL term is the same model with the adapter off (no second copy), run only when
beta > 0.

Step events carry reward_mean, reward_std, reward/<name>, completion_length, zero_std_groups
(the share of groups whose rewards are all equal: they train nothing), rollout_s (the seconds of
the step spent sampling and scoring) and kl (beta > 0); a few
completions per step go to completions.jsonl in the job folder."""
from __future__ import annotations

import json
import time
from collections import deque

import torch

from jobs.data import shared_prefix
from jobs.data.prompts import encode_prompts, load_prompt_rows, render
from jobs.io.layout import JobLayout
from jobs.models import fit, fit_policy, fit_rollout
from jobs.models.adapter_switch import reference_pass
from jobs.train.methods import grpo_loss
from jobs.train import decode, rng_state
from jobs.train.methods.base import Method, StepCancelled, budgeted
from jobs.train.methods.grpo_data import (PromptPlan, RolloutBatch, rollout_tensors, rollout_tensors_packed,
                                         rollout_tensors_packed_shared, rollout_tensors_shared, sharing_pays)
from jobs.train.methods.logprobs import logprobs_op, report_op
from jobs.train.rewards.score import RewardSet
from jobs.train.sharding import model_world
from jobs.train.rollout import sample_completions
from kernels import arch
from kernels.loss_patch import find_causal_lm
from kernels.packed_attention import use_packed_attention

SAMPLES_PER_STEP = 4   # completions written to completions.jsonl each step
MODEL_KEYS = ("input_ids", "attention_mask", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "kv_index",
              "max_length_q", "max_length_k")   # what the policy forward takes of a batch (padded or packed)


class GroupRelativePolicyOptimization(Method):
    name = "grpo"
    capturable = False   # the step's shapes change with every sampling
    samples_each_step = True

    def __init__(self, trainer):
        super().__init__(trainer)
        self.metric_names = ("kl",) if self.spec.beta > 0 else ()
        self.pending_fields: deque = deque()
        self.rewards = RewardSet.for_spec(self.spec, log=trainer.log, data_dir=trainer.data_dir)
        self.packed = False
        self.shared: tuple[int, int] | None = None   # (hidden, MLP size) when passes may hold each prompt once
        self.policy_rows: int | None = None
        self.decided = False   # packed and shared, decided once (_decide_packing)
        self.longest_prompt: int | None = None   # tokens, read once by load_data

    # ---- data -----------------------------------------------------------------------
    def load_data(self):
        t, spec = self.trainer, self.spec
        rows = load_prompt_rows(spec, t.data_dir, log=t.log)
        rows = encode_prompts(t.tokenizer, rows, spec.max_seq_length)
        self.longest_prompt = max((len(row.input_ids) for row in rows), default=None)   # for fit_sizes
        t.log(f"grpo: {len(rows)} prompts, {spec.num_generations} completions each of at most "
              f"{spec.max_completion_length} tokens; rewards {spec.rewards or ', '.join(self._weights())}")
        return rows, []

    def _weights(self) -> list[str]:
        return [f"{n}:{self.rewards.weights[n]:g}" for n in self.rewards.names]

    def plan_batches(self):
        t = self.trainer
        # the plan's units are prompts (never packed); t.packed (the start event's `packing`) says
        # whether the policy pass packs the sampled sequences
        self._decide_packing()
        if self.packed:
            t.log("  " + use_packed_attention(t.model))   # the sampler's 4-D masks still reach sdpa
        self.policy_rows = self._policy_rows()
        report_op(t, "completion tokens only, no full logits")
        return PromptPlan(t.examples, self.spec.batch_size, self.spec.seed, t.dist.rank, t.dist.world_size), None

    def _decide_packing(self) -> None:
        """Whether policy passes pack, and hold each prompt once (logged once): the memory plan, made
        before plan_batches (jobs/train/engine_setup.py accelerate), sizes the passes by it (fit_sizes)."""
        t = self.trainer
        if self.decided:
            return
        self.decided = True
        text = arch.text_config(t.model.config)
        self.packed, line = grpo_packing(self.spec.packing, t.device.type, text)
        t.packed = self.packed
        t.log(line)
        apart = shared_prefix.packed_reason(t.device.type, t.dtype, text) if self.packed else None
        share, line = grpo_prefix_sharing(self.packed, t.device.type, text, apart)
        self.shared = shared_prefix.model_size(text) if share else None
        t.log(line)

    def fit_sizes(self) -> dict:
        """The dataset's longest encoded prompt (never above max_seq_length) and whether the policy
        passes hold each prompt once: what a pass holds (jobs/models/fit_policy.py)."""
        self._decide_packing()
        return {"prompt_len": self.longest_prompt,
                "prompts_once": self.shared is not None and self.packed}

    def batch_tokens(self) -> int:
        """The policy step's tokens as the memory plan counts them (its prompts: fit_sizes)."""
        rows = self.spec.batch_size * self.spec.num_generations
        sizes = self.fit_sizes()
        return fit_policy.policy_view(self.spec, rows, sizes["prompt_len"], sizes["prompts_once"]).batch_tokens()

    def _policy_rows(self) -> int | None:
        """Completions a policy pass trains on within max_gpu_memory_gb (jobs/models/fit.py
        grpo_policy_rows, the same split the checkpointing plan was sized for); None: all at once."""
        t, spec = self.trainer, self.spec
        if not budgeted(t.device, spec):
            return None
        rows = fit.grpo_policy_rows(spec, t.model.config, trainable=t.trainable, world=model_world(t),
                                    **self.fit_sizes())
        total = spec.batch_size * spec.num_generations
        if rows < total:
            t.log(f"grpo policy step: {total} completions in passes of up to {rows}, to stay within "
                  f"max_gpu_memory_gb {spec.max_gpu_memory_gb:g} (no checkpointing plan fits them in one)")
        return rows

    def loss_units(self, batch) -> int:
        return batch.label_tokens

    # ---- sampling and scoring (host side, once per optimizer step) ---------------------
    def prepare_step(self, group: list) -> list:
        spec, t = self.spec, self.trainer
        stats = {"rewards": [], "each": {n: [] for n in self.rewards.names}, "lengths": [], "flat": []}
        began = time.perf_counter()   # sampling and scoring wait for the GPU: host time is their time
        before = rng_state.capture(t.device)
        trained = []
        for x, batch in group:
            prompts = [row.input_ids for row in batch.rows]
            completions = sample_completions(t.model, t.tokenizer, prompts, spec.num_generations,
                                             spec.max_completion_length, spec.temperature, spec.top_p, t.device,
                                             log=t.log, should_stop=self._stop_check(),
                                             rows_per_pass=self._rows_per_pass(prompts),
                                             peers=t.dist if t.sharded else None)   # FSDP: ranks in step
            if completions is None:   # cancelled mid-rollout: as if this step never began
                rng_state.restore(before, t.device)
                raise StepCancelled
            totals = self._score(batch, completions, stats)
            advantages, flat = grpo_loss.group_advantages(torch.tensor(totals), spec.num_generations,
                                                          scale=spec.loss_type != "dr_grpo")
            trained += [(x, piece) for piece in self._policy_batches(batch, prompts, completions, advantages)]
            stats["lengths"] += [len(c) for c in completions]
            stats["flat"] += flat.tolist()
        if stats.get("samples"):
            self._write_samples(*stats["samples"])   # only once the whole rollout is done
        fields = self._fields(stats)
        fields["rollout_s"] = round(time.perf_counter() - began, 3)
        self.pending_fields.append(fields)
        return trained

    def _policy_batches(self, batch, prompts: list[list[int]], completions: list[list[int]],
                        advantages: torch.Tensor) -> list:
        """The sampled micro-batch as the policy step trains it: whole, or in passes of at most
        `policy_rows` completions within max_gpu_memory_gb (jobs/models/fit.py grpo_policy_rows)."""
        repeated = [p for p in prompts for _ in range(self.spec.num_generations)]
        part = self.policy_rows or len(completions)
        pieces = []
        for start in range(0, len(completions), part):
            piece = batch if part >= len(completions) else RolloutBatch(rows=batch.rows)
            window = slice(start, start + part)
            self._policy_tensors(piece, repeated[window], completions[window], advantages[window])
            pieces.append(piece)
        return pieces

    def _policy_tensors(self, batch, prompts: list[list[int]], completions: list[list[int]],
                        advantages: torch.Tensor) -> None:
        """The policy pass's tensors for these completions (`prompts`: one per completion)."""
        t = self.trainer
        pad_id = t.tokenizer.pad_token_id if t.tokenizer.pad_token_id is not None else t.tokenizer.eos_token_id
        if self.packed:   # each prompt once when sharing (its tokens counted once: the tokens the pass runs)
            pack = rollout_tensors_packed_shared if self.shared else rollout_tensors_packed
            batch.tensors, batch.ints = pack(prompts, completions, 1)
            batch.real_tokens = batch.tensors["input_ids"].numel()
        elif self.shared and self._sharing_pays(prompts, completions):
            batch.tensors, batch.real_tokens = rollout_tensors_shared(prompts, completions, 1, pad_id)
        else:
            batch.tensors = rollout_tensors(prompts, completions, 1, pad_id)
            batch.real_tokens = int(batch.tensors["attention_mask"].sum())
        batch.tensors["advantages"] = advantages
        batch.label_tokens = grpo_loss.units([len(c) for c in completions], self.spec.loss_type)

    def _sharing_pays(self, prompts: list[list[int]], completions: list[list[int]]) -> bool:
        if sharing_pays(prompts, completions, 1, *self.shared):
            return True
        decode.log_once(self.trainer.log, "grpo prompts: once per completion for passes whose shared rows would "
                                          "cost more (attention over a prompt and all its long completions)")
        return False

    def _rows_per_pass(self, prompts: list[list[int]]) -> int | None:
        """Completions one sampling pass may hold within max_gpu_memory_gb (jobs/models/fit_rollout.py;
        None: all at once, as without a budget or off the GPU)."""
        t, spec = self.trainer, self.spec
        if not budgeted(t.device, spec):
            return None
        rows, per_row = fit.rollout_rows(spec, t.model.config, trainable=t.trainable,
                                         prompt_len=max(len(p) for p in prompts),
                                         allocated=torch.cuda.memory_allocated(t.device), world=model_world(t))
        if t.sharded:   # every rank the same number of passes (jobs/train/rollout.py)
            rows = min(t.dist.gather_objects(rows))
        total = len(prompts) * spec.num_generations
        if rows < total:
            decode.log_once(t.log, fit_rollout.passes_line(total, rows, spec.max_gpu_memory_gb, per_row))
        return rows

    def _score(self, batch, completions: list[list[int]], stats: dict) -> list[float]:
        spec, tok = self.spec, self.trainer.tokenizer
        G = spec.num_generations
        rows = [row for row in batch.rows for _ in range(G)]
        texts = tok.batch_decode(completions, skip_special_tokens=True)
        shown = [t if isinstance(r.prompt, str) else [{"role": "assistant", "content": t}] for t, r in zip(texts, rows)]
        columns = {k: [r.columns.get(k) for r in rows] for k in {k for r in rows for k in r.columns}}
        totals, each = self.rewards.score([r.prompt for r in rows], shown, columns, [len(c) for c in completions],
                                          spec.max_completion_length)
        stats["rewards"] += totals
        for name, values in each.items():
            stats["each"][name] += values
        if self.trainer.dist.is_main and not stats.get("samples"):
            stats["samples"] = (rows, texts, totals, each)
        return totals

    def _stop_check(self):
        """What the sampler asks at its host checks: has the job been cancelled? One process only:
        with several, every rank must reach the step's collectives (the stop is agreed before the
        rollout instead, jobs/train/loop.py)."""
        t = self.trainer
        return (lambda: t.stop_requested) if t.dist.world_size == 1 else None

    def _write_samples(self, rows, texts, totals, each) -> None:
        step = self.trainer.step + 1
        with JobLayout(self.trainer.job_dir).completions.open("a", encoding="utf-8") as fh:
            for i in range(min(SAMPLES_PER_STEP, len(texts))):
                record = {"step": step, "prompt": render(self.trainer.tokenizer, rows[i].prompt)[-400:],
                          "completion": texts[i], "reward": round(totals[i], 4),
                          "rewards": {n: round(v[i], 4) for n, v in each.items()}}
                fh.write(json.dumps(record, ensure_ascii=False) + "\n")

    def _fields(self, stats: dict) -> dict:
        """The step event's reward fields over every rank's completions (one host all-reduce)."""
        rewards, names = stats["rewards"], list(stats["each"])
        sums = self.trainer.dist.all_reduce_sum(
            sum(rewards), sum(r * r for r in rewards), len(rewards), sum(stats["lengths"]), sum(stats["flat"]),
            len(stats["flat"]), *[sum(stats["each"][n]) for n in names])
        total, squares, n, lengths, flat, groups, *each = sums
        mean = total / max(1.0, n)
        std = max(0.0, squares / max(1.0, n) - mean * mean) ** 0.5
        fields = {"reward_mean": round(mean, 4), "reward_std": round(std, 4),
                  "completion_length": round(lengths / max(1.0, n), 2),
                  "zero_std_groups": round(flat / max(1.0, groups), 4)}
        for name, value in zip(names, each):
            fields[f"reward/{name}"] = round(value / max(1.0, n), 4)
        return fields

    # ---- the step ---------------------------------------------------------------------
    def loss(self, model, batch: dict, count: torch.Tensor):
        spec, peft = self.spec, self.trainer.model
        logprobs = logprobs_op(spec.fused_kernels)   # the PyTorch reference when fused_kernels is off
        lm = find_causal_lm(peft)
        inputs = {k: batch[k] for k in MODEL_KEYS if k in batch}
        ref = None
        if spec.beta > 0:
            with reference_pass(peft):   # eval mode too: no checkpointing of a forward without backward
                hidden = _completion_hidden(peft, lm, inputs, batch["gather"])
                ref = logprobs(hidden, labels=batch["labels"], **_head(lm, spec))
        hidden = _completion_hidden(model, lm, inputs, batch["gather"])
        logp = logprobs(hidden, labels=batch["labels"], **_head(lm, spec))
        loss, kl = grpo_loss.grpo_loss(
            logp, batch["seq_index"], batch["lengths"], batch["advantages"].to(logp.device), count, ref_logp=ref,
            beta=spec.beta, eps_low=spec.epsilon, eps_high=spec.epsilon_high or spec.epsilon,
            loss_type=spec.loss_type, max_completion_length=spec.max_completion_length)
        return loss, (kl.view(1) if kl is not None else None)

    def step_fields(self, metrics: list[float]) -> dict:
        fields = self.pending_fields.popleft() if self.pending_fields else {}
        if self.metric_names:
            fields["kl"] = metrics[0]
        return fields

    def evaluate(self, model, plan, device) -> dict:
        return {"eval_loss": float("nan"), "eval_tokens": 0}


def grpo_packing(mode: str, device_type: str, text_config) -> tuple[bool, str]:
    """Whether each micro-batch's prompt + completion sequences go to the policy forward packed
    into one row (no padding to the longest), and the log line; `packing` as for SFT
    (jobs/data/packing.py resolve_packing): auto packs on the GPU unless attention logits are
    soft-capped (the varlen kernel cannot), and keeps padded rows on CPU."""
    if mode == "on":
        return True, "grpo packing: on (each micro-batch's sequences in one row, position ids restarting)"
    if mode == "off":
        return False, "grpo packing: off (prompt + completion rows padded to the longest)"
    if device_type != "cuda":
        return False, "grpo packing: auto -> off on CPU (padded rows; set packing: on to pack)"
    reason = fit_policy.packs_on_gpu(mode, text_config)   # the rule the memory plan follows too
    if reason:
        return False, f"grpo packing: {reason}"
    return True, "grpo packing: auto -> on (each micro-batch's sequences in one row, position ids restarting)"


def grpo_prefix_sharing(packed: bool, device_type: str, text_config, keys_apart: str | None = None) -> tuple[bool, str]:
    """Whether policy passes hold each prompt once for its group, and the log line: packed passes
    (grpo_data.rollout_tensors_packed_shared) unless the varlen kernel cannot take keys apart from
    queries (`keys_apart`, the reason); padded ones (rollout_tensors_shared) as
    jobs/data/shared_prefix.py `unshared_reason` says."""
    if packed:
        if keys_apart:
            return False, f"grpo prompts: once per completion ({keys_apart})"
        return True, ("grpo prompts: once per group (packed: a prompt then its completions, whose attention "
                      "reaches back to it: the prompt's forward and backward run once)")
    reason = shared_prefix.unshared_reason(device_type, text_config)
    if reason:
        return False, f"grpo prompts: once per completion ({reason})"
    return True, ("grpo prompts: once per group (a prompt and its completions in one row, a 4-D mask "
                  "keeping the completions apart: the prompt's forward and backward run once)")


def _head(lm, spec) -> dict:
    """The LM head's arguments of the log-probs op, read after the forward: under FSDP the head's
    weight is whole only once the root's forward has gathered it (before, it is this rank's shard)."""
    return dict(weight=lm.lm_head.weight, bias=lm.lm_head.bias, temperature=spec.temperature,
                softcap=getattr(arch.text_config(lm.config), "final_logit_softcapping", None))


def _completion_hidden(model, lm, inputs: dict, gather: torch.Tensor) -> torch.Tensor:
    """The final-norm hidden states [N, D] at the positions that predict completion tokens.
    The model runs through `model` (DDP's hooks, the fused LoRA kernels) with logits_to_keep=1,
    so no full logits are made; a forward hook on the decoder (lm.model) catches its output."""
    caught = {}

    def keep(_module, _args, output):
        caught["hidden"] = output[0] if isinstance(output, tuple) else output.last_hidden_state

    handle = lm.model.register_forward_hook(keep)
    try:
        model(**inputs, logits_to_keep=1, use_cache=False)
    finally:
        handle.remove()
    hidden = caught["hidden"]
    return hidden.reshape(-1, hidden.shape[-1]).index_select(0, gather.to(hidden.device))
