"""Backward over a leading slice of a packed batch's tokens: tokens that need a forward but no backward.

KTO's KL completions are such tokens: their log-probs enter only the detached KL estimate (TRL's
KTOTrainer computes them under no_grad). Packed after every token that trains (jobs/data/pairs.py
`collate_units_riding`), they are the tail of the flat token order, and no token before them attends to
them (each is a query document of its own, whose keys are its prompt's and its own). So a checkpointed
layer recomputed over the leading `tokens` alone gives exactly the trained tokens' activations and
gradients; the tail's output gradient is zero (its log-probs are taken without grad,
jobs/train/methods/preference_forward.py), so the layer's input gradient there is zero as well and is
filled in, not computed. The prompt then runs once for both of a unit's answers (what the KL pass on its
own would run again), and the KL answers skip the recompute and the backward of every checkpointed layer.
A layer that keeps its activations runs its backward over every token (zeros over the tail).
The leading part may end within a document (its first tokens then, and the keys they read): the collate
can round it up into the KL completions to a multiple of `BUCKET` tokens, whose gradient is zero as well.

`backward_rows(model, rows)`: within it, each checkpointing decoder layer runs kernels/checkpoint.py's
`kept_input_checkpoint` with its input kept as its policy keeps it (on the device, or in pinned host
memory) and `rows`: the layer's arguments cut to the leading tokens for the recompute. A call whose
arguments cannot be cut (a per-token argument this module does not know, more than one row) runs the
layer's own checkpoint instead, which is exact too (only slower): `declined()` says why.
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import torch

from kernels import checkpoint

# the recomputed tokens are rounded up to a multiple of this (jobs/data/pairs.py). 256 gives the GEMMs a few
# row counts, which cuBLAS has met before, not a new one each step (its host time grew 17 ms a step on the
# host-bound 1B, where the cut follows each batch's own length: bench/NOTES.md, session 65), at up to 255 more
# tokens recomputed. Measured on an H100 (session 67, bench switch "ktobucket"): the 1B riding at 256 ran
# 0.1792 s a step, no faster than unbucketed (0.1774) and 14 % slower than one forward, so 1: the cut as is
BUCKET = 1

_DECLINED: dict[str, None] = {}   # reasons a layer call was not cut, in order, for the log


@dataclass(frozen=True)
class BackwardRows:
    """The leading part of a packed row that trains: its tokens, query documents and attention keys
    (`kv_index` entries), its longest query document and key span, and its label rows."""
    tokens: int
    documents: int
    keys: int
    longest_query: int
    longest_keys: int
    labels: int


def _bounds(value: torch.Tensor, count: int, end: int) -> torch.Tensor:
    """cu_seq_lens cut to `count` documents, the last ending at `end` (within it, when the cut is)."""
    bounds = value[:count + 1].clone()
    bounds[-1] = end   # a fill, not a host-to-device copy: the step does not wait on it
    return bounds


# the packed-attention arguments (kernels/packed_attention.py), cut to the leading documents
_ATTENTION = {
    "cu_seq_lens_q": lambda value, rows: _bounds(value, rows.documents, rows.tokens),
    "cu_seq_lens_k": lambda value, rows: _bounds(value, rows.documents, rows.keys),
    "kv_index": lambda value, rows: value[:rows.keys],
    "max_length_q": lambda value, rows: rows.longest_query,
    "max_length_k": lambda value, rows: rows.longest_keys,
}


def _cut(value, rows: BackwardRows, total: int):
    """A per-token argument cut to the leading tokens: [T] or [B, T, ...] (position ids, RoPE's cos/sin);
    anything else passes unchanged, unless a dimension is T (then ValueError: not known how to cut)."""
    if isinstance(value, (tuple, list)):
        return type(value)(_cut(item, rows, total) for item in value)
    if not torch.is_tensor(value) or total not in value.shape:
        return value
    if value.dim() == 1:
        return value[:rows.tokens]
    if value.shape[1] == total and total not in value.shape[2:]:
        return value[:, :rows.tokens]
    raise ValueError(f"a per-token argument of shape {tuple(value.shape)}")


def cut_layer_call(run_layer, hidden: torch.Tensor, rows: BackwardRows, made: dict | None = None):
    """The layer call `run_layer` (transformers' partial of the layer's forward with its keyword
    arguments) over the leading `rows.tokens` tokens only; ValueError saying why it cannot be cut.
    `made`: the attention arguments cut for earlier layers of the forward (each layer gets the same)."""
    if not isinstance(run_layer, functools.partial):
        raise ValueError("the layer's call is not a functools.partial of its forward")
    if hidden.dim() != 3 or hidden.shape[0] != 1:
        raise ValueError(f"hidden states of shape {tuple(hidden.shape)}, not one packed row")
    total, cut, made = hidden.shape[1], {}, {} if made is None else made
    for name, value in run_layer.keywords.items():
        if name in _ATTENTION:
            if (name, id(value)) not in made:   # the tensor is kept beside its cut: its id stays its own
                made[name, id(value)] = (value, _ATTENTION[name](value, rows))
            cut[name] = made[name, id(value)][1]
        elif name == "attention_mask" and value is not None:
            raise ValueError("an attention mask")
        else:
            try:
                cut[name] = _cut(value, rows, total)
            except ValueError as exc:
                raise ValueError(f"{exc} ({name})") from None
    if "cu_seq_lens_q" not in cut:
        raise ValueError("no packed documents (cu_seq_lens_q)")
    return functools.partial(run_layer.func, *run_layer.args, **cut)


def _rows_checkpoint(rows: BackwardRows, made: dict, policy, index: int, run_layer, hidden, *args):
    try:
        cut = (rows.tokens, cut_layer_call(run_layer, hidden, rows, made))
    except ValueError as exc:
        _DECLINED.setdefault(str(exc))
        return policy(run_layer, hidden, *args)
    keeper, at = checkpoint.input_keeper(policy, index)
    return checkpoint.kept_input_checkpoint(keeper, at, cut, run_layer, hidden, *args)


@contextlib.contextmanager
def backward_rows(model: torch.nn.Module, rows: BackwardRows):
    """Within: `model`'s checkpointing layers recompute and backpropagate the leading `rows` only (module doc)."""
    layers = checkpoint.checkpointing_layers(model)
    policies, made = [layer._gradient_checkpointing_func for layer in layers], {}
    for index, (layer, policy) in enumerate(zip(layers, policies)):
        layer._gradient_checkpointing_func = functools.partial(_rows_checkpoint, rows, made, policy, index)
    try:
        yield
    finally:
        for layer, policy in zip(layers, policies):
            layer._gradient_checkpointing_func = policy


def declined() -> list[str]:
    """Why layer calls ran their own checkpoint instead of the cut one, each reason once."""
    return list(_DECLINED)
