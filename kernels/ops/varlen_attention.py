"""Causal attention over packed documents: every token attends only to earlier tokens of its own
document (block-diagonal causal), given the documents' cumulative lengths `cu_seqlens`. With
`causal=False` every token sees its whole document (block-diagonal bidirectional): a vision tower's
images and windows (kernels/vision_attention.py).

Kernel: not ours. On CUDA (fp16/bf16, head_dim <= 256) it is FlashAttention-2's varlen kernel as
PyTorch ships it, `torch.nn.attention.varlen.varlen_attn` (torch >= 2.9; forward and backward,
GQA with fewer key/value heads handled inside the kernel), or `flash_attn.flash_attn_varlen_func`
where that package is installed. No [T, T] mask is ever built: the kernel skips the blocks
between documents, so attention costs sum(len_i^2) instead of T^2 (the cu_seqlens convention of
FlashAttention and of transformers' `DataCollatorWithFlattening`).

Reference (CPU, fp32, Gemma-2's logit soft-cap, attention dropout, or no varlen kernel): each
document on its own, plain math (q k^T * scale, optional soft-cap, causal and sliding-window mask,
fp32 softmax, @ v). It is exact, so packed training on CPU gives the same loss and gradients as
the examples run one by one; it loops over documents in Python, so it is slow on a GPU.

Layout: q [T, Hq, D], k/v [T, Hk, D] (T = all tokens of the batch, rows flattened), cu_seqlens
int32 [docs + 1] with cu_seqlens[-1] == T; output [T, Hq, D]. Sliding window W (Mistral, Qwen2,
Gemma 2/3 local layers): a query sees at most the W most recent keys including itself
(transformers' `sliding_window_overlay`: q - kv < W), i.e. FlashAttention's window (W - 1, 0).

Keys apart from queries (`cu_seqlens_k`, `max_seqlen_k`): document i's queries are
q[cu_seqlens[i]:cu_seqlens[i+1]] and its keys k[cu_seqlens_k[i]:cu_seqlens_k[i+1]]. When a document
has more keys than queries, causality is aligned to the bottom right, FlashAttention-2's convention
(>= 2.1, and the kernel torch's varlen_attn runs): with n queries over m keys, query j sees keys up to
j + m - n. So the queries of an answer whose keys are its prompt's followed by its own see the whole
prompt and their own past: the split attention of a shared prompt (kernels/packed_attention.py).

Dispatch: on torch's varlen path the kernel is called through the aten ops `varlen_attn` wraps
(`aten._flash_attention_forward`/`_backward`, the same calls with the same arguments) from an
`autograd.Function` of ours: `varlen_attn` is a `torch.library.custom_op`, whose Python dispatch
cost ~160 us of host time a call under cProfile (9.3 ms a KTO 1B step, 58 calls), on steps that
wait on the host (bench/NOTES.md). If this torch's private ops refuse those arguments, the first
call says why (`direct_off_reason`) and every call goes through `varlen_attn`;
`FUSETUNE_VARLEN_VIA=varlen_attn` forces that path (the A/B in bench/check_varlen.py).
"""
from __future__ import annotations

import functools
import inspect
import os

import torch

MAX_FLASH_HEAD_DIM = 256


@functools.lru_cache(maxsize=1)
def _torch_varlen():
    """torch's varlen_attn and whether it takes window_size (2.10+) or is_causal (2.9)."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None, None
    params = inspect.signature(varlen_attn).parameters
    return varlen_attn, ("window_size" if "window_size" in params else "is_causal")


@functools.lru_cache(maxsize=1)
def _varlen_takes_enable_gqa() -> bool:
    """torch 2.13's varlen_attn refuses fewer kv heads than query heads unless told `enable_gqa`."""
    return "enable_gqa" in inspect.signature(_torch_varlen()[0]).parameters


# the direct aten path (module doc): on unless the environment asks for varlen_attn or a call refused it
_direct = {"on": os.environ.get("FUSETUNE_VARLEN_VIA", "") != "varlen_attn", "proven": False, "off_reason": None}


def direct_off_reason() -> str | None:
    """Why calls go through torch's varlen_attn instead of the aten ops directly (None: they don't)."""
    if not _direct["on"]:
        return _direct["off_reason"] or "FUSETUNE_VARLEN_VIA=varlen_attn"
    return None


class _FlashVarlen(torch.autograd.Function):
    """FlashAttention-2 varlen forward and backward: what torch's `_varlen_attn` custom op and its
    registered backward run (torch/nn/attention/varlen.py), without the custom op's dispatch. With no
    dropout the kernel's rng outputs are never read; they go back to the backward as the forward gave them."""

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, max_q: int, max_k: int, scale: float, left: int, right: int):
        causal = left == -1 and right == 0
        out, lse, seed, offset, _ = torch.ops.aten._flash_attention_forward(
            q, k, v, cu_q, cu_k, max_q, max_k, 0.0, causal, False,
            scale=scale, window_size_left=left, window_size_right=right)
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, seed, offset)
        ctx.args = (max_q, max_k, causal, scale, left, right)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, lse, cu_q, cu_k, seed, offset = ctx.saved_tensors
        max_q, max_k, causal, scale, left, right = ctx.args
        dq, dk, dv = torch.ops.aten._flash_attention_backward(
            grad, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, 0.0, causal, seed, offset,
            scale=scale, window_size_left=left, window_size_right=right)
        return dq, dk, dv, None, None, None, None, None, None, None


def _direct_or_none(q, k, v, cu: tuple, longest: tuple, scale: float, left: int, right: int):
    """The direct call, or None once it has refused this torch's arguments (said by direct_off_reason).
    A refusal after calls have worked is a real error, raised as it is."""
    try:
        out = _FlashVarlen.apply(q, k, v, *cu, *longest, scale, left, right)
    except torch.OutOfMemoryError:
        raise
    except (TypeError, RuntimeError) as exc:
        if _direct["proven"]:
            raise
        _direct.update(on=False, off_reason=f"aten._flash_attention_forward refused: {str(exc).splitlines()[0][:200]}")
        return None
    _direct["proven"] = True
    return out


@functools.lru_cache(maxsize=1)
def _flash_attn_varlen():
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:
        return None
    return flash_attn_varlen_func


def kernel_unavailable_reason(q: torch.Tensor, softcap: float | None = None, dropout: float = 0.0) -> str | None:
    """Why the varlen kernel cannot run these inputs (None when it can)."""
    if not q.is_cuda:
        return "tensors are not on CUDA"
    if q.dtype not in (torch.float16, torch.bfloat16):
        return f"FlashAttention needs fp16/bf16, got {q.dtype}"
    if q.shape[-1] > MAX_FLASH_HEAD_DIM:
        return f"head_dim {q.shape[-1]} > {MAX_FLASH_HEAD_DIM}"
    if softcap:
        return "attention logit soft-capping is not supported by torch's varlen kernel"
    if dropout:
        return "attention dropout is not supported by torch's varlen kernel"
    if _torch_varlen()[0] is None and _flash_attn_varlen() is None:
        return "neither torch.nn.attention.varlen (torch >= 2.9) nor flash_attn is available"
    return None


def _window(sliding_window: int | None, length: int) -> int | None:
    """The sliding window when it actually restricts a document of `length` tokens."""
    return sliding_window if sliding_window and sliding_window < length else None


_expand_kv_heads: list[bool] = [False]   # set once if a kernel build refuses fewer kv heads than q heads


def _kernel(q, k, v, cu: tuple, longest: tuple, scale: float, sliding_window: int | None, causal: bool = True):
    """The varlen kernel; GQA inputs go in as they are (FlashAttention-2 reads shared kv heads),
    unless this build refused them once: then k/v are expanded to the query heads first. `cu`,
    `longest`: (queries', keys') cumulative lengths and longest document."""
    groups = q.shape[1] // k.shape[1]
    if groups > 1 and _expand_kv_heads[0]:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    try:
        return _launch(q, k, v, cu, longest, scale, sliding_window, causal)
    except RuntimeError:
        if groups == 1 or _expand_kv_heads[0]:
            raise
        _expand_kv_heads[0] = True
        return _kernel(q, k, v, cu, longest, scale, sliding_window, causal)


def _launch(q, k, v, cu: tuple, longest: tuple, scale: float, sliding_window: int | None, causal: bool):
    varlen_attn, style = _torch_varlen()
    left = sliding_window - 1 if sliding_window else -1
    right = 0 if causal else -1     # FlashAttention's window: (-1, -1) is no window at all
    if varlen_attn is not None:
        if style == "window_size":
            out = _direct_or_none(q, k, v, cu, longest, scale, left, right) if _direct["on"] else None
            if out is not None:
                return out
            gqa = {"enable_gqa": True} if q.shape[1] != k.shape[1] and _varlen_takes_enable_gqa() else {}
            return varlen_attn(q, k, v, *cu, *longest, scale=scale, window_size=(left, right), **gqa)
        if sliding_window is None:  # torch 2.9: no window or scale arguments
            if abs(scale - q.shape[-1] ** -0.5) < 1e-12:
                return varlen_attn(q, k, v, *cu, *longest, is_causal=causal)
    flash = _flash_attn_varlen()
    if flash is None:
        return varlen_attention_reference(q, k, v, cu[0], scale, sliding_window, causal=causal, cu_seqlens_k=cu[1])
    return flash(q, k, v, *cu, *longest, softmax_scale=scale, causal=causal, window_size=(left, right))


def _document_attention(q, k, v, scale: float, window: int | None, softcap: float | None, dropout: float,
                        causal: bool = True):
    """One document: q [n, Hq, D], k/v [m, Hk, D] (m >= n; causal aligned bottom right, module doc)
    -> [n, Hq, D], in fp32 math (fp64 stays fp64)."""
    n, m, heads = q.shape[0], k.shape[0], q.shape[1]
    groups = heads // k.shape[1]
    k = k.repeat_interleave(groups, dim=1)
    v = v.repeat_interleave(groups, dim=1)
    math = torch.promote_types(q.dtype, torch.float32)
    scores = torch.einsum("qhd,khd->hqk", q.to(math), k.to(math)) * scale
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    position = torch.arange(m, device=q.device)
    distance = position[m - n:, None] - position[None, :]
    allowed = distance >= 0 if causal else torch.ones_like(distance, dtype=torch.bool)
    if window:
        allowed &= distance < window
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if dropout:
        probs = torch.nn.functional.dropout(probs, p=dropout)
    return torch.einsum("hqk,khd->qhd", probs, v.to(math)).to(q.dtype)


def varlen_attention_reference(q, k, v, cu_seqlens, scale: float, sliding_window: int | None = None,
                               softcap: float | None = None, dropout: float = 0.0, causal: bool = True,
                               cu_seqlens_k=None) -> torch.Tensor:
    """Each document separately (exact; see the module doc)."""
    bounds = cu_seqlens.tolist()
    keys = bounds if cu_seqlens_k is None else cu_seqlens_k.tolist()
    pieces = []
    for start, end, k_start, k_end in zip(bounds[:-1], bounds[1:], keys[:-1], keys[1:]):
        if end > start:
            window = _window(sliding_window, k_end - k_start)
            pieces.append(_document_attention(q[start:end], k[k_start:k_end], v[k_start:k_end], scale, window,
                                              softcap, dropout, causal))
    return torch.cat(pieces, dim=0)


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                     max_seqlen: int, scale: float | None = None, sliding_window: int | None = None,
                     softcap: float | None = None, dropout: float = 0.0, causal: bool = True,
                     cu_seqlens_k: torch.Tensor | None = None, max_seqlen_k: int | None = None) -> torch.Tensor:
    """Block-diagonal causal attention of packed documents (module doc). `max_seqlen` is the
    longest document (a host int, so no device sync is needed to launch the kernel). `causal=False`:
    each token sees its whole document (no sliding window then). `cu_seqlens_k`/`max_seqlen_k`: the
    documents' keys when they are not the queries' tokens (module doc), at least as many as queries."""
    if not causal and sliding_window:
        raise ValueError("varlen_attention: a sliding window applies to causal attention only")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"varlen_attention: {q.shape[1]} query heads are not a multiple of {k.shape[1]} kv heads")
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    longest_k = int(max_seqlen if max_seqlen_k is None else max_seqlen_k)
    window = _window(sliding_window, longest_k)
    if kernel_unavailable_reason(q, softcap, dropout) is None:
        # no Tensor.to call where the lengths are int32 already (twice per attention call: host time)
        cu = cu_seqlens if cu_seqlens.dtype == torch.int32 else cu_seqlens.to(torch.int32)
        cu_k = cu if cu_seqlens_k is None else (
            cu_seqlens_k if cu_seqlens_k.dtype == torch.int32 else cu_seqlens_k.to(torch.int32))
        return _kernel(q, k, v, (cu, cu_k), (int(max_seqlen), longest_k), scale, window, causal)
    return varlen_attention_reference(q, k, v, cu_seqlens, scale, window, softcap, dropout, causal, cu_seqlens_k)


@functools.lru_cache(maxsize=8)
def keys_apart_reason(device: str, dtype: torch.dtype, head_dim: int = 64) -> str | None:
    """Why documents whose keys are apart from their queries (`cu_seqlens_k`) cannot run here, or None.
    Checked once per device and dtype on a tiny input against the reference, since the sharing built on
    it (kernels/packed_attention.py) is exact only if the kernel aligns causality bottom right."""
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(n, 2, head_dim, generator=generator) for n in (7, 11, 11))
    cu_q, cu_k = torch.tensor([0, 3, 7], dtype=torch.int32), torch.tensor([0, 3, 11], dtype=torch.int32)
    want = varlen_attention_reference(q, k, v, cu_q, head_dim ** -0.5, cu_seqlens_k=cu_k)
    try:
        got = varlen_attention(*(x.to(device, dtype) for x in (q, k, v)), cu_q.to(device), 4,
                               cu_seqlens_k=cu_k.to(device), max_seqlen_k=8).float().cpu()
    except RuntimeError as exc:   # a kernel build without separate key lengths
        return f"the varlen kernel refused keys apart from queries ({str(exc).splitlines()[0][:160]})"
    error = (got - want).abs().max().item()
    if error > (1e-4 if dtype in (torch.float32, torch.float64) else 3e-2):
        return f"the varlen kernel's causality is not aligned bottom right here (max error {error:.3g})"
    return None

