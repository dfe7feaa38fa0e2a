"""Packed batches through transformers' own attention seam, without cross-talk and without a mask.

A packed row holds several examples back to back; its `position_ids` restart at 0 for each one (so
RoPE sees every example from position 0) and the batch carries FlashAttention's varlen arguments,
`cu_seq_lens_q/k` (int32 cumulative lengths over all rows flattened) and `max_length_q/k` (host
ints), the names transformers' `FlashAttentionKwargs` and `DataCollatorWithFlattening` use. Every
model in the patch table forwards those kwargs from `model(...)` down to the attention interface
(transformers 5.17 and 5.24), and so does our patched attention (`kernels/patch.py`).

`use_packed_attention(model)` registers one attention function under the name "fusetune_packed" in
transformers' `AttentionInterface` and switches the model's config to it. It registers NO mask
function, on purpose: for an implementation without one, transformers' `create_causal_mask`
returns None at once. Registered under sdpa's mask (or any other), it would first look for packed
`position_ids` (`find_packed_sequence_indices`, which ends in a host-side `.all()`: one device
sync per forward) and then build a dense [batch, 1, T, T] block-diagonal mask. So while this
implementation is on, the model takes packed or unpadded batches only: a 2-D padding mask is not
seen (a 4-D mask passed by the caller is still honoured). The trainer turns it on only for
packed jobs, where every batch (training and evaluation) is packed, and turns it off afterwards.

The attention function: a caller's 4-D mask, or a KV-cache step (keys longer than queries), goes
to transformers' sdpa (eager for Gemma-2's soft-cap); everything else to
`kernels.ops.varlen_attention` over the documents given by `cu_seq_lens_q` (when absent, the
documents are read from packed `position_ids` as transformers does, once per forward, at the cost
of one host sync; unpacked rows are one document each). When the given documents are exactly
the rows (`whole_rows`: fixed-length unpacked batches, e.g. BASELINES.md's and a captured step's,
kernels/step_graph.py), plain causal sdpa runs instead: the same result, and on the H200 cuDNN's
kernel is ~9 ms a step faster than the varlen one on the 8B shape (bench/results/lora.jsonl).

Shared prompts (`kv_index`, GRPO's packed policy pass, jobs/train/methods/grpo_data.py): a prompt is
packed ONCE, followed by its answers, each answer a query document of its own. `kv_index` gathers each
document's keys from the flattened tokens: a prompt's own, and for an answer its prompt's then its own,
with `cu_seq_lens_k`/`max_length_k` bounding them; the varlen kernel's bottom-right causality
(kernels/ops/varlen_attention.py) then lets an answer see its whole prompt and its own past, exactly
what it sees packed behind its own copy of the prompt. The prompt's projections, MLP and norms run once
for the group and its keys' gradients add up over the answers through the gather: the Shared-Prefix
Forward of Prefix Grouper (Liu et al. 2025, arXiv 2506.05433) on the varlen kernel, where the CPU's
padded rows use a 4-D mask (jobs/data/shared_prefix.py).
"""
from __future__ import annotations

import importlib
from contextlib import contextmanager

import torch

from kernels.ops.varlen_attention import kernel_unavailable_reason, varlen_attention
from kernels.arch import base_model, text_config

NAME = "fusetune_packed"
PREVIOUS_ATTR = "_fusetune_previous_attn_implementation"


def _registered() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, packed_attention_forward)


def decode_step_attention(query, key, value, attention_mask, scaling):
    """One query token per row against a KV cache whose heads are grouped (GQA): the G query heads
    that share a KV head become G query rows of that head, so sdpa reads each cached K/V once.
    transformers' sdpa path expands K/V to every query head first (`repeat_kv`: a copy of the whole
    cache G times, per layer and decode step; on the H200 that copy was 5.2 of 9.2 ms a step for
    the 1B shape at batch 64, bench/profile_decode.py). Exact: a decode query row has no causal
    structure among the folded rows, and the row's mask [B, 1, 1, S] broadcasts over them.
    query [B, Hq, 1, D], key/value [B, Hk, S, D] -> [B, 1, Hq, D]."""
    batch, heads, _, dim = query.shape
    folded = query.reshape(batch, key.shape[1], heads // key.shape[1], dim)
    out = torch.nn.functional.scaled_dot_product_attention(folded, key, value, attn_mask=attention_mask,
                                                           scale=scaling)
    return out.reshape(batch, heads, 1, dim).transpose(1, 2).contiguous()


def _foldable(query, key, attention_mask, dropout, softcap) -> bool:
    heads, kv_heads = query.shape[1], key.shape[1]
    return (query.shape[2] == 1 and kv_heads < heads and heads % kv_heads == 0 and not dropout and not softcap
            and attention_mask is not None and attention_mask.dim() == 4 and attention_mask.shape[1] == 1
            and attention_mask.shape[2] == 1 and attention_mask.shape[3] == key.shape[2])


def _masked_attention(module, query, key, value, attention_mask, dropout, scaling, sliding_window,
                      softcap, **kwargs):
    """transformers' own attention for a caller's 4-D mask and for cached decoding (a decode step
    of a GQA model folds its query heads instead: `decode_step_attention`)."""
    if _foldable(query, key, attention_mask, dropout, softcap):
        return decode_step_attention(query, key, value, attention_mask, scaling), None
    if softcap:
        if attention_mask is not None and attention_mask.dtype == torch.bool:
            attention_mask = torch.zeros(attention_mask.shape, dtype=query.dtype, device=query.device) \
                .masked_fill(~attention_mask, torch.finfo(query.dtype).min)
        eager = importlib.import_module(type(module).__module__).eager_attention_forward
        return eager(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                     sliding_window=sliding_window, softcap=softcap, **kwargs)
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                  scaling=scaling, **kwargs)


_last_derived: list = [None, None]   # (position_ids tensor, its documents): every layer gets the same tensor


def _from_position_ids(position_ids: torch.Tensor, batch: int, length: int):
    if _last_derived[0] is position_ids:
        return _last_derived[1]
    from transformers.masking_utils import find_packed_sequence_indices

    ids = position_ids.expand(batch, -1)
    packed = find_packed_sequence_indices(ids)
    derived = None
    if packed is not None:
        starts = torch.ones_like(ids, dtype=torch.bool)
        starts[:, 1:] = packed[:, 1:] != packed[:, :-1]
        begin = torch.nonzero(starts.reshape(-1)).flatten()
        cu = torch.cat([begin, begin.new_tensor([batch * length])]).to(torch.int32)
        derived = (cu, int((cu[1:] - cu[:-1]).max()))
    _last_derived[:] = [position_ids, derived]
    return derived


def documents(batch: int, length: int, device, cu_seqlens=None, max_length=None, position_ids=None):
    """(cu_seqlens int32 over the flattened rows, longest document) for this call."""
    if cu_seqlens is not None:
        return cu_seqlens, int(max_length) if max_length is not None else length
    derived = _from_position_ids(position_ids, batch, length) if position_ids is not None else None
    if derived is not None:
        return derived
    return torch.arange(0, (batch + 1) * length, length, dtype=torch.int32, device=device), length


def whole_rows(cu_seqlens, max_length, batch: int, length: int) -> bool:
    """True when the documents given are exactly the rows, read from shapes and host ints only (no
    sync): batch + 1 boundaries over batch * length tokens with no document longer than a row
    force every document to be one whole row."""
    return (cu_seqlens is not None and max_length is not None and int(max_length) == length
            and cu_seqlens.numel() == batch + 1)


def _causal_rows(query, key, value, scaling):
    """Plain causal attention over whole rows: sdpa without a mask (cuDNN or Flash on the GPU, no
    [T, T] mask built), returned as [B, L, Hq, D] like the varlen path."""
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, is_causal=True, scale=scaling, enable_gqa=key.shape[1] != query.shape[1])
    return out.transpose(1, 2)


def packed_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                             scaling: float | None = None, sliding_window: int | None = None,
                             softcap: float | None = None, **kwargs):
    """transformers attention-interface function; query [B, Hq, L, D], key/value [B, Hk, L, D];
    returns ([B, L, Hq, D], None)."""
    batch, heads, length, dim = query.shape
    if attention_mask is not None or key.shape[2] != length:
        return _masked_attention(module, query, key, value, attention_mask, dropout, scaling, sliding_window,
                                 softcap, **kwargs)
    shared = kwargs.get("kv_index")
    if (shared is None and whole_rows(kwargs.get("cu_seq_lens_q"), kwargs.get("max_length_q"), batch, length)
            and not (dropout or softcap or sliding_window)):
        return _causal_rows(query, key, value, scaling), None
    cu, longest = documents(batch, length, query.device, kwargs.get("cu_seq_lens_q"),
                            kwargs.get("max_length_q"), kwargs.get("position_ids"))
    q = query.transpose(1, 2).reshape(batch * length, heads, dim)
    k = key.transpose(1, 2).reshape(batch * length, key.shape[1], dim)
    v = value.transpose(1, 2).reshape(batch * length, value.shape[1], dim)
    keys = {}
    if shared is not None:   # shared prompts: each answer's keys are its prompt's then its own (module doc)
        k, v = k.index_select(0, shared), v.index_select(0, shared)
        keys = {"cu_seqlens_k": kwargs["cu_seq_lens_k"], "max_seqlen_k": kwargs["max_length_k"]}
    out = varlen_attention(q, k, v, cu, longest, scale=scaling, sliding_window=sliding_window,
                           softcap=softcap, dropout=dropout, **keys)
    return out.view(batch, length, heads, dim), None


def packing_kernel_note(model) -> str:
    """One line for the log: which kernel packed batches will use on this model."""
    param = next(model.parameters())
    config = base_model(model).config
    text = text_config(config)
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    probe = torch.empty(1, 1, head_dim, dtype=param.dtype, device=param.device) if param.is_cuda else \
        torch.empty(1, 1, head_dim, dtype=param.dtype)
    reason = kernel_unavailable_reason(probe, getattr(text, "attn_logit_softcapping", None),
                                       getattr(text, "attention_dropout", 0.0) or 0.0)
    if reason is None:
        return "packed attention: FlashAttention varlen kernel (no mask, documents never attend to each other)"
    return f"packed attention: exact per-document attention ({reason})"


def use_packed_attention(model) -> str:
    """Route `model`'s attention through "fusetune_packed" (module doc); returns a log line."""
    _registered()
    config = base_model(model).config
    vision = _vision_attention(config)
    for item in _attention_configs(config):
        if getattr(item, "_attn_implementation", None) != NAME:
            setattr(item, PREVIOUS_ATTR, getattr(item, "_attn_implementation", None))
            item._attn_implementation = NAME
    _keep_vision_attention(config, vision)
    return packing_kernel_note(model)


def _attention_configs(config) -> list:
    """The config and its language model's, whose attention packing switches."""
    return [config] + [getattr(config, name) for name in ("text_config",) if hasattr(config, name)]


def _vision_attention(config) -> str | None:
    sub = getattr(config, "vision_config", None)
    return None if sub is None else getattr(sub, "_attn_implementation", None)


def _keep_vision_attention(config, implementation: str | None) -> None:
    """A config's setter passes its attention to every sub-config; a vision tower's attention is
    bidirectional over one image (not causal documents), so it keeps its own (jobs/data/vision_packing.py)."""
    sub = getattr(config, "vision_config", None)
    if sub is not None and implementation is not None:
        sub._attn_implementation = implementation


def restore_attention(model) -> None:
    """Undo `use_packed_attention` (back to the implementation the config had before)."""
    config = base_model(model).config
    vision = _vision_attention(config)
    for item in _attention_configs(config):
        previous = getattr(item, PREVIOUS_ATTR, None)
        if previous is not None:
            item._attn_implementation = previous
            delattr(item, PREVIOUS_ATTR)
    _keep_vision_attention(config, vision)


@contextmanager
def cached_decoding_attention(model):
    """Within: `model`'s attention is "fusetune_packed" (a decode loop's 4-D masks go to
    `_masked_attention`, so its GQA decode steps fold query heads), switched back after unless it
    was on already (a packed job's own switch is left alone)."""
    config = base_model(model).config
    if getattr(config, "_attn_implementation", None) == NAME:
        yield
        return
    use_packed_attention(model)
    try:
        yield
    finally:
        restore_attention(model)

