"""GRPO's batches: a plan of prompt micro-batches (what the loop's Prefetcher reads) and the
rollout batch a step trains on once its completions are sampled (jobs/train/methods/grpo.py).

`batch_size` counts prompts; with several processes each micro-batch is `batch_size x world`
prompts and each rank samples its own `batch_size` of them (rank r takes the r-th slice). An
epoch's order is shuffled from the seed; its short last micro-batch is filled from the start of
the epoch, so every rank always has prompts (DDP needs every rank's backward).

A sampled micro-batch trains as padded rows with each prompt once (`rollout_tensors_shared`: a
prompt and its group of completions in one row under a 4-D mask; the default off the GPU), as
padded rows of prompt + completion (`rollout_tensors`: prompts left-padded, completions
right-padded to the longest), or packed (`rollout_tensors_packed`: every prompt + completion back
to back in one row, nothing padded; the default on the GPU), each prompt once there too
(`rollout_tensors_packed_shared`: a prompt then its completions, the completions' attention reaching
back to it through the varlen kernel, kernels/packed_attention.py). grpo.py `grpo_packing`
and `grpo_prefix_sharing` choose."""
from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from jobs.data import shared_prefix


@dataclass
class RolloutBatch:
    """A micro-batch of prompts (`rows`), and after prepare_step its completions' tensors."""

    rows: list
    tensors: dict = field(default_factory=dict)
    ints: dict = field(default_factory=dict)
    real_tokens: int = 0
    label_tokens: int = 0

    def pinned(self) -> "RolloutBatch":
        return self   # the tensors are built after sampling, on the training thread

    def to(self, device) -> dict:
        return {**{k: v.to(device, non_blocking=True) for k, v in self.tensors.items()}, **self.ints}


class PromptPlan:
    def __init__(self, rows: list, batch_size: int, seed: int, rank: int = 0, world: int = 1):
        self.rows, self.batch_size, self.seed, self.rank, self.world = rows, batch_size, seed, rank, world
        self.examples = rows   # resume_position reads plan.examples and plan.packed
        self.packed = False
        self._epoch, self._order = None, []

    @property
    def per_epoch(self) -> int:
        return max(1, -(-len(self.rows) // (self.batch_size * self.world)))

    def _order_of(self, epoch: int) -> list[int]:
        if self._epoch != epoch:
            self._order = list(range(len(self.rows)))
            random.Random(self.seed * 1000 + epoch).shuffle(self._order)
            self._epoch = epoch
        return self._order

    def batch_at(self, micro_index: int) -> tuple[float, RolloutBatch]:
        epoch, index = divmod(micro_index, self.per_epoch)
        order, size = self._order_of(epoch), self.batch_size * self.world
        start = index * size + self.rank * self.batch_size
        mine = [order[(start + i) % len(order)] for i in range(self.batch_size)]
        return epoch + (index + 1) / self.per_epoch, RolloutBatch([self.rows[i] for i in mine])

    def all_batches(self):
        return iter(())

    # what a checkpoint fingerprints to see whether a resume reads the same data in the same order
    # (jobs/train/rng_state.py data_order_digest), as BatchPlan's
    def epoch_batches(self, epoch: int) -> list[list[int]]:
        order, size = self._order_of(epoch), self.batch_size * self.world
        return [order[i:i + size] for i in range(0, len(order), size)]

    @property
    def lengths(self) -> list[int]:
        return [len(repr(row)) for row in self.rows]


def rollout_tensors(prompts: list[list[int]], completions: list[list[int]], group: int, pad_id: int) -> dict:
    """Rows of prompt (left-padded) + completion (right-padded), for the policy forward:
    input_ids, attention_mask, position_ids [S, P + L]; and the completion tokens flat:
    labels [N] (the tokens), seq_index [N] (their completion), lengths [S], and `gather` [N], the
    flat position in [S * (P + L)] of the hidden state that predicts each token."""
    width_p = max(len(p) for p in prompts)
    width_c = max(1, max(len(c) for c in completions))
    S = len(completions)
    ids = torch.full((S, width_p + width_c), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    gather, seq_index, labels = [], [], []
    for s, completion in enumerate(completions):
        prompt = prompts[s // group]
        ids[s, width_p - len(prompt):width_p] = torch.tensor(prompt, dtype=torch.long)
        mask[s, width_p - len(prompt):width_p + len(completion)] = 1
        if completion:
            ids[s, width_p:width_p + len(completion)] = torch.tensor(completion, dtype=torch.long)
        row = s * (width_p + width_c)
        gather += [row + width_p - 1 + t for t in range(len(completion))]
        seq_index += [s] * len(completion)
        labels += completion
    position_ids = (mask.cumsum(1) - 1).clamp(min=0)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": position_ids,
            "labels": torch.tensor(labels, dtype=torch.long), "seq_index": torch.tensor(seq_index, dtype=torch.long),
            "lengths": torch.tensor([len(c) for c in completions], dtype=torch.long),
            "gather": torch.tensor(gather, dtype=torch.long)}


def rollout_tensors_packed(prompts: list[list[int]], completions: list[list[int]], group: int) -> tuple[dict, dict]:
    """The same rows packed into ONE sequence [1, T] (T = the step's real tokens, no padding), as
    SFT packing lays them out (jobs/data/packing.py collate_packed): each prompt + completion is a
    document of its own, position ids restart at 0 for each, and `cu_seq_lens_q/k` (int32) with
    the host int `max_length_q/k` keep attention inside each one (kernels/packed_attention.py).
    labels, seq_index, lengths and gather mean what they mean in `rollout_tensors`.
    Returns (tensors, ints)."""
    ids, positions, bounds, gather, seq_index, labels = [], [], [0], [], [], []
    for s, completion in enumerate(completions):
        prompt = prompts[s // group]
        start, n = len(ids), len(prompt) + len(completion)
        ids += prompt + completion
        positions += range(n)
        bounds.append(start + n)
        gather += [start + len(prompt) - 1 + t for t in range(len(completion))]
        seq_index += [s] * len(completion)
        labels += completion
    cu = torch.tensor(bounds, dtype=torch.int32)
    longest = max(b - a for a, b in zip(bounds, bounds[1:]))
    tensors = {"input_ids": torch.tensor([ids], dtype=torch.long),
               "position_ids": torch.tensor([positions], dtype=torch.long),
               "cu_seq_lens_q": cu, "cu_seq_lens_k": cu,
               "labels": torch.tensor(labels, dtype=torch.long), "seq_index": torch.tensor(seq_index, dtype=torch.long),
               "lengths": torch.tensor([len(c) for c in completions], dtype=torch.long),
               "gather": torch.tensor(gather, dtype=torch.long)}
    return tensors, {"max_length_q": longest, "max_length_k": longest}


def rollout_tensors_shared(prompts: list[list[int]], completions: list[list[int]], group: int,
                           pad_id: int) -> tuple[dict, int]:
    """The same completions with each prompt held ONCE (jobs/data/shared_prefix.py): one row per run
    of completions that share a prompt, [prompt, completion 1, completion 2, ...], under a 4-D mask
    keeping the completions apart. labels, seq_index, lengths and gather mean what they mean in
    `rollout_tensors`; the first token of each completion is predicted by the prompt's last.
    Returns (tensors, the real tokens the pass runs)."""
    runs = _prompt_runs(prompts, completions, group)
    tensors, starts = shared_prefix.branch_rows([p for p, _ in runs], [[completions[s] for s in members]
                                                                       for _, members in runs], pad_id)
    width = tensors["input_ids"].shape[1]
    gather, seq_index, labels, real = [], [], [], 0
    for r, (prompt, members) in enumerate(runs):
        for s, start in zip(members, starts[r]):
            k = len(completions[s])
            gather += [r * width + (len(prompt) - 1 if t == 0 else start + t - 1) for t in range(k)]
            seq_index += [s] * k
            labels += completions[s]
        real += len(prompt) + sum(len(completions[s]) for s in members)
    tensors.update(labels=torch.tensor(labels, dtype=torch.long), seq_index=torch.tensor(seq_index, dtype=torch.long),
                   lengths=torch.tensor([len(c) for c in completions], dtype=torch.long),
                   gather=torch.tensor(gather, dtype=torch.long))
    return tensors, real


def rollout_tensors_packed_shared(prompts: list[list[int]], completions: list[list[int]],
                                  group: int) -> tuple[dict, dict]:
    """The completions packed into ONE sequence [1, T] with each prompt ONCE: per run of completions
    that share a prompt, the prompt then each completion, positions continuing from the prompt in every
    completion. Query documents are the prompt and each completion; `kv_index` lists each document's
    keys (a prompt's own; a completion's prompt then its own) with `cu_seq_lens_k`/`max_length_k`
    bounding them (kernels/packed_attention.py). labels, seq_index, lengths and gather mean what they
    mean in `rollout_tensors`; a completion's first token is predicted by its prompt's last.
    Returns (tensors, ints)."""
    packed, gather, seq_index, labels = shared_prefix.PackedDocuments(), [], [], []
    for prompt, members in _prompt_runs(prompts, completions, group):
        prompt_keys = packed.document(prompt)
        for s in members:
            completion, begin = completions[s], len(packed.ids)
            if completion:   # an empty completion has no token to attend from or to predict
                packed.document(completion, len(prompt), prompt_keys)
            gather += [prompt_keys[-1] if t == 0 else begin + t - 1 for t in range(len(completion))]
            seq_index += [s] * len(completion)
            labels += completion
    tensors, ints = packed.tensors()
    tensors.update(labels=torch.tensor(labels, dtype=torch.long), seq_index=torch.tensor(seq_index, dtype=torch.long),
                   lengths=torch.tensor([len(c) for c in completions], dtype=torch.long),
                   gather=torch.tensor(gather, dtype=torch.long))
    return tensors, ints


def sharing_pays(prompts: list[list[int]], completions: list[list[int]], group: int, hidden: int, ffn: int) -> bool:
    """Whether `rollout_tensors_shared` costs fewer FLOPs than `rollout_tensors` for these completions
    (shared_prefix.pays: long completions in large groups cost more shared)."""
    runs = _prompt_runs(prompts, completions, group)
    shared = max(len(p) + sum(len(completions[s]) for s in members) for p, members in runs)
    padded = max(len(p) for p in prompts) + max(1, max(len(c) for c in completions))
    return shared_prefix.pays(len(runs), shared, len(completions), padded, hidden, ffn)


def _prompt_runs(prompts: list[list[int]], completions: list[list[int]], group: int) -> list[tuple[list, list]]:
    """(prompt, the indices of its completions) for each run of consecutive completions whose prompts
    (`prompts[s // group]`) are equal."""
    runs: list[tuple[list, list]] = []
    for s in range(len(completions)):
        prompt = prompts[s // group]
        if runs and runs[-1][0] == prompt:
            runs[-1][1].append(s)
        else:
            runs.append((prompt, [s]))
    return runs
