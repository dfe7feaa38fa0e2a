"""Rows that hold a shared prefix once: a trunk (a prompt) and its branches (the answers that follow
it) in one padded row, under a 4-D mask that lets each branch see the trunk and, causally, itself
only; position ids continue from the trunk in every branch. Every branch token then sees exactly
what it sees in a row of trunk + that branch alone, and the trunk's forward and backward run once
for all its branches, its gradient the sum of theirs: the Shared-Prefix Forward of Prefix Grouper
(Liu et al. 2025, arXiv 2506.05433), done with a mask instead of a split attention.

Used off the GPU's packed path: GRPO's prompt and its group of completions (jobs/train/methods/
grpo_data.py), a preference unit's prompt and its two answers (jobs/data/pairs.py). Packed passes share
a prefix through the varlen kernel instead (its keys gathered per answer, kernels/packed_attention.py),
where `packed_reason` finds no reason against it. `pays` says whether such rows cost fewer FLOPs
than a row per branch: sdpa with a mask computes a row's whole square, so one wide row of long
branches can cost more than the prompts it saves."""
from __future__ import annotations

import bisect

import torch


def unshared_reason(device_type: str, text_config) -> str | None:
    """Why a job's padded passes cannot hold a shared prefix once, or None when they can (packed
    passes: `packed_reason`). On the GPU a dense [T, T] mask over a step's thousands of tokens would
    cost more than the prompts it saves. A 4-D mask also replaces the model's own, so models with
    sliding-window layers and eager attention (which adds a float mask; ours is boolean) keep one
    prompt per sequence."""
    if device_type == "cuda":
        return "padded rows on the GPU: a shared prompt needs a [T, T] mask there"
    if _sliding(text_config):
        return "this model has sliding-window attention, which a 4-D mask would replace"
    attention = getattr(text_config, "_attn_implementation", None)
    if attention != "sdpa":
        return f"attention {attention!r}: a shared prompt needs sdpa's boolean mask"
    return None


def packed_reason(device_type: str, dtype: torch.dtype, text_config) -> str | None:
    """Why packed passes cannot hold a shared prefix once on this device and dtype (the varlen kernel
    must take keys apart from queries, causality aligned bottom right: kernels/ops/varlen_attention.py
    keys_apart_reason, checked once), or None when they can (kernels/packed_attention.py `kv_index`)."""
    from kernels.ops.varlen_attention import keys_apart_reason
    head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // text_config.num_attention_heads
    return keys_apart_reason(device_type, dtype, head_dim)


class PackedDocuments:
    """A packed sequence whose query documents may read keys apart from their own tokens (packed rows
    holding a prefix once, kernels/packed_attention.py `kv_index`): `document` appends tokens as a
    query document whose keys are `behind` (flat indices, e.g. its prefix's) then its own; `tensors`
    gives the model's inputs for `rows` rows of equal length (the caller fills each row to it)."""

    def __init__(self):
        self.ids: list[int] = []
        self.positions: list[int] = []
        self.bounds, self.keys, self.key_bounds = [0], [], [0]

    def document(self, tokens: list[int], first_position: int = 0, behind: list[int] = ()) -> list[int]:
        """Append `tokens` (positions from `first_position`); returns their flat indices."""
        start = len(self.ids)
        own = list(range(start, start + len(tokens)))
        self.ids += tokens
        self.positions += range(first_position, first_position + len(tokens))
        self.bounds.append(len(self.ids))
        self.keys += [*behind, *own]
        self.key_bounds.append(len(self.keys))
        return own

    def longest(self, documents: int | None = None, keys: bool = False) -> int:
        """The longest of the first `documents` query documents (all: None), or of their key spans."""
        bounds = (self.key_bounds if keys else self.bounds)[:None if documents is None else documents + 1]
        return max((y - x for x, y in zip(bounds, bounds[1:])), default=0)

    def leading(self, tokens: int) -> tuple[int, int, int, int]:
        """The first `tokens` flat tokens, cut anywhere (within a document too: it keeps its first tokens,
        and its keys, all it reads behind plus those, as bottom-right causal attention needs): how many
        query documents they touch, their `kv_index` entries, the longest query document and key span."""
        documents = bisect.bisect_left(self.bounds, tokens)
        trimmed = self.bounds[documents] - tokens   # the last document's tokens past the cut
        keys = self.key_bounds[documents] - trimmed
        longest_query = max(self.longest(documents - 1), tokens - self.bounds[documents - 1])
        longest_keys = max(self.longest(documents - 1, keys=True), keys - self.key_bounds[documents - 1])
        return documents, keys, longest_query, longest_keys

    def tensors(self, rows: int = 1) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
        """(input_ids, position_ids [rows, T / rows], cu_seq_lens_q/k, kv_index; max_length_q/k)."""
        return ({"input_ids": torch.tensor(self.ids, dtype=torch.long).view(rows, -1),
                 "position_ids": torch.tensor(self.positions, dtype=torch.long).view(rows, -1),
                 "cu_seq_lens_q": torch.tensor(self.bounds, dtype=torch.int32),
                 "cu_seq_lens_k": torch.tensor(self.key_bounds, dtype=torch.int32),
                 "kv_index": torch.tensor(self.keys, dtype=torch.long)},
                {"max_length_q": self.longest(), "max_length_k": self.longest(keys=True)})


def _sliding(text_config) -> bool:
    types = getattr(text_config, "layer_types", None)
    if types:
        return any("sliding" in str(kind) for kind in types)
    sliding = getattr(text_config, "use_sliding_window", True) is not False
    return bool(getattr(text_config, "sliding_window", None)) and sliding


def model_size(text_config) -> tuple[int, int]:
    """(hidden size, MLP size) of a decoder, what `pays` weighs rows by (4 x hidden without an MLP size)."""
    return text_config.hidden_size, getattr(text_config, "intermediate_size", None) or 4 * text_config.hidden_size


def branch_rows(trunks: list[list[int]], branches: list[list[list[int]]],
                pad_id: int) -> tuple[dict[str, torch.Tensor], list[list[int]]]:
    """Row r = trunks[r] then each of branches[r], right-padded to the longest row. Returns
    ({input_ids, position_ids [R, W], attention_mask [R, 1, W, W] bool (True: may attend)},
    starts[r][j]: where branch j of row r begins). A padding query attends to itself only: a row
    of sdpa with no key allowed is NaN, and NaN * 0 would still reach the gradients."""
    width = max(len(t) + sum(map(len, b)) for t, b in zip(trunks, branches))
    ids = torch.full((len(trunks), width), pad_id, dtype=torch.long)
    positions = torch.zeros_like(ids)
    allowed = torch.eye(width, dtype=torch.bool).repeat(len(trunks), 1, 1)
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    starts = []
    for r, (trunk, row_branches) in enumerate(zip(trunks, branches)):
        n = len(trunk)
        ids[r, :n], positions[r, :n] = torch.tensor(trunk, dtype=torch.long), torch.arange(n)
        allowed[r, :n, :n] = causal[:n, :n]
        start, row_starts = n, []
        for branch in row_branches:
            k, end = len(branch), start + len(branch)
            if k:
                ids[r, start:end] = torch.tensor(branch, dtype=torch.long)
                positions[r, start:end] = torch.arange(n, n + k)
                allowed[r, start:end, :n] = True
                allowed[r, start:end, start:end] = causal[:k, :k]
            row_starts.append(start)
            start = end
        starts.append(row_starts)
    return {"input_ids": ids, "position_ids": positions, "attention_mask": allowed.unsqueeze(1)}, starts


def pays(shared_rows: int, shared_width: int, rows: int, width: int, hidden: int, ffn: int) -> bool:
    """Whether `shared_rows` rows of `shared_width` cost fewer FLOPs than `rows` rows of `width`, by a
    layer's work over every position of padded rows (padding is computed too): per position the
    projections and the MLP, 2 (4 h^2 + 3 h f); per query-key pair of a row 4 h (a masked sdpa
    computes the whole square). At h 576, f 1536 the square dominates past ~3,500 positions a row."""
    def cost(count: int, size: int) -> float:
        return count * size * (2 * (4 * hidden * hidden + 3 * hidden * ffn) + 4 * hidden * size)

    return cost(shared_rows, shared_width) < cost(rows, width)


def common_prefix(a: list[int], b: list[int]) -> int:
    """The length of the longest common prefix of two token lists."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
