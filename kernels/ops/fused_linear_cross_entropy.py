"""Fused linear + cross-entropy: the LM-head loss without ever holding the N x V logits.

The rows are processed in chunks sized so that one chunk of logits is at most `CHUNK_BYTES`
(256 MB: about 1000 rows of a 128K vocabulary in bf16). Per chunk:

1. logits = hidden_chunk @ W^T (+ bias): one torch GEMM in the model dtype, into a reused buffer;
2. one Triton program per row computes, in fp32, the log-sum-exp with the online softmax
   (Milakov & Gimelshein 2018), the row's loss `lse - z_label`, and overwrites the logits with
   the gradient `(softmax - onehot) * scale` (times `1 - tanh^2` under soft-capping);
3. grad_hidden_chunk = dlogits @ W (torch GEMM straight into the output rows), and
   grad_W += dlogits^T @ hidden_chunk only when the LM head is trainable (with LoRA it is frozen:
   that GEMM, a third of the work, is skipped).

So the gradients are computed during the forward (the idea of Liger-Kernel's
`fused_linear_cross_entropy`, https://github.com/linkedin/Liger-Kernel) and the backward only
scales them by grad_output. Cut-cross-entropy (Wijmans et al. 2024, apple/ml-cross-entropy) goes
further and never writes logits to global memory at all; chunking keeps our GEMMs on cuBLAS. Peak extra memory is one logits chunk plus the [N, H] gradient,
against HF's N x V logits in bf16 and again in fp32 (for Llama-3 at 4096 tokens: 256 MB vs 3 GB).

Gemma 2 final-logit soft-capping: z = c * tanh(x / c), dz/dx = 1 - (z / c)^2.
Reduction: sum over label tokens / num_items when num_items is given (transformers'
`ForCausalLMLoss` with `num_items_in_batch`: correct under gradient accumulation), else the mean over
non-ignored tokens. Both scales are computed on the device: no host synchronisation.

Rows without a label (a chat's prompt, padding, a packed row's document ends) add nothing to the loss
or its gradient, yet cost their logits GEMMs like any other row: with `SKIP_UNLABELED_ROWS` only the
labelled rows are gathered, chunk by chunk, into the GEMMs (the other rows' gradient is zero). Their
indices take one host synchronisation (a nonzero), so a step being captured into a CUDA graph, where
that is not allowed, keeps every row. Off Triton the same holds: `label_rows_cross_entropy` runs the
PyTorch reference on the labelled rows alone (CPU jobs' loss, kernels/loss_patch.py).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels.ops._launch import triton_runs_on

CHUNK_BYTES = 256 * 1024 * 1024
SKIP_UNLABELED_ROWS = True   # the bench switch allrows turns it off for an A/B


@triton.jit
def _softcap(x, cap):
    # tanh through exp (tl has no tanh on every Triton version), clamped: tanh(+-15) is +-1 in fp32
    y = tl.minimum(tl.maximum(x / cap, -15.0), 15.0)
    return cap * (1.0 - 2.0 / (tl.exp(2.0 * y) + 1.0))


@triton.jit
def _cross_entropy_rows_kernel(
    logits_ptr, stride_row, labels_ptr, loss_ptr, scale_ptr, n_vocab, ignore_index, cap,
    HAS_SOFTCAP: tl.constexpr, COMPUTE_GRAD: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    row_ptr = logits_ptr + row.to(tl.int64) * stride_row
    label = tl.load(labels_ptr + row).to(tl.int32)
    cols = tl.arange(0, BLOCK)
    if label == ignore_index:
        tl.store(loss_ptr + row, 0.0)
        if COMPUTE_GRAD:
            for start in range(0, n_vocab, BLOCK):
                zeros = tl.zeros([BLOCK], dtype=tl.float32)
                tl.store(row_ptr + start + cols, zeros.to(logits_ptr.dtype.element_ty),
                         mask=start + cols < n_vocab)
    else:
        scale = tl.load(scale_ptr)
        running_max = -float("inf")
        running_sum = 0.0
        for start in range(0, n_vocab, BLOCK):
            mask = start + cols < n_vocab
            z = tl.load(row_ptr + start + cols, mask=mask, other=-float("inf")).to(tl.float32)
            if HAS_SOFTCAP:
                z = tl.where(mask, _softcap(z, cap), -float("inf"))  # the cap maps -inf to -cap
            new_max = tl.maximum(running_max, tl.max(z, axis=0))
            running_sum = running_sum * tl.exp(running_max - new_max) + tl.sum(tl.exp(z - new_max), axis=0)
            running_max = new_max
        lse = running_max + tl.log(running_sum)
        # a label outside [0, V) (a tokenizer/model mismatch) gives a nan loss, not a wild read
        z_label = tl.load(row_ptr + label, mask=(label >= 0) & (label < n_vocab), other=float("nan"))
        z_label = z_label.to(tl.float32)
        if HAS_SOFTCAP:
            z_label = _softcap(z_label, cap)
        tl.store(loss_ptr + row, (lse - z_label) * scale)
        if COMPUTE_GRAD:
            for start in range(0, n_vocab, BLOCK):
                mask = start + cols < n_vocab
                z = tl.load(row_ptr + start + cols, mask=mask, other=0.0).to(tl.float32)
                if HAS_SOFTCAP:
                    z = _softcap(z, cap)
                grad = tl.exp(z - lse) - tl.where(start + cols == label, 1.0, 0.0)
                if HAS_SOFTCAP:
                    grad = grad * (1.0 - (z / cap) * (z / cap))
                tl.store(row_ptr + start + cols, (grad * scale).to(logits_ptr.dtype.element_ty), mask=mask)


def _row_launch(n_vocab: int) -> tuple[int, int]:
    block = min(triton.next_power_of_2(n_vocab), 8192)
    return block, (16 if block >= 8192 else 8 if block >= 2048 else 4)


def _loss_scale(labels: torch.Tensor, ignore_index: int, num_items) -> torch.Tensor:
    """1 / (number of label tokens) as a device tensor: no .item(), no host sync."""
    if num_items is None:
        count = (labels != ignore_index).sum()
    else:
        count = torch.as_tensor(num_items, device=labels.device)
    return (1.0 / count.to(torch.float32)).reshape(1)


def _chunk_rows(n_rows: int, n_vocab: int, elem_size: int) -> int:
    return max(1, min(n_rows, CHUNK_BYTES // (n_vocab * elem_size)))


def _labelled_rows(labels: torch.Tensor, ignore_index: int) -> torch.Tensor | None:
    """The indices of the rows with a label, or None to run every row (all labelled, the switch off,
    or a CUDA graph being captured: the nonzero waits for the device)."""
    if not SKIP_UNLABELED_ROWS or (labels.is_cuda and torch.cuda.is_current_stream_capturing()):
        return None
    rows = (labels != ignore_index).nonzero().squeeze(1)
    return None if rows.numel() == labels.numel() else rows


def _flce_forward(hidden, weight, labels, bias, ignore_index, softcap, num_items, need_dh, need_dw):
    n_vocab = weight.shape[0]
    scale = _loss_scale(labels, ignore_index, num_items)
    picked = _labelled_rows(labels, ignore_index)
    n_rows = hidden.shape[0] if picked is None else picked.numel()
    loss_rows = torch.zeros(max(n_rows, 1), dtype=torch.float32, device=hidden.device)
    # unpicked rows get no gradient: zeros, written where they are skipped
    grad_hidden = (torch.empty_like if picked is None else torch.zeros_like)(hidden) if need_dh else None
    grad_weight = torch.zeros_like(weight) if need_dw else None
    grad_bias = torch.zeros_like(bias) if (need_dw and bias is not None) else None
    rows = _chunk_rows(max(n_rows, 1), n_vocab, hidden.element_size())
    buffer = torch.empty(rows, n_vocab, dtype=hidden.dtype, device=hidden.device)
    block, warps = _row_launch(n_vocab)
    for start in range(0, n_rows, rows):
        end = min(start + rows, n_rows)
        index = None if picked is None else picked[start:end]
        chunk = hidden[start:end] if index is None else hidden.index_select(0, index)
        chunk_labels = labels[start:end] if index is None else labels.index_select(0, index)
        logits = buffer[: end - start]
        if bias is None:
            torch.mm(chunk, weight.t(), out=logits)
        else:
            torch.addmm(bias, chunk, weight.t(), out=logits)
        _cross_entropy_rows_kernel[(end - start,)](
            logits, logits.stride(0), chunk_labels, loss_rows[start:end], scale, n_vocab,
            ignore_index, float(softcap or 0.0), HAS_SOFTCAP=softcap is not None,
            COMPUTE_GRAD=need_dh or need_dw, BLOCK=block, num_warps=warps,
        )
        if need_dh and index is None:
            torch.mm(logits, weight, out=grad_hidden[start:end])
        elif need_dh:
            grad_hidden.index_copy_(0, index, torch.mm(logits, weight))
        if need_dw:
            grad_weight.addmm_(logits.t(), chunk)
            if grad_bias is not None:
                grad_bias.add_(logits.sum(dim=0))
    return loss_rows.sum(), grad_hidden, grad_weight, grad_bias


class _FusedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, bias, ignore_index, softcap, num_items):
        need_dh, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        loss, ctx.grad_hidden, ctx.grad_weight, ctx.grad_bias = _flce_forward(
            hidden, weight, labels, bias, ignore_index, softcap, num_items, need_dh, need_dw)
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        # the gradients were computed in forward; scale them in place (no host sync: multiply
        # always) and drop the node's references, so the [N, H] buffer is not held until the whole
        # graph is freed (34 MB at the 8B peak) and no second copy is made
        if ctx.grad_hidden is None and ctx.grad_weight is None and any(ctx.needs_input_grad[:2]):
            raise RuntimeError("fused linear cross-entropy backward ran twice on one graph "
                               "(retain_graph=True); use backend='torch' for that")
        grads = (ctx.grad_hidden, ctx.grad_weight, ctx.grad_bias)
        ctx.grad_hidden = ctx.grad_weight = ctx.grad_bias = None
        dh, dw, db = (None if g is None else g.mul_(grad_output.to(g.dtype)) for g in grads)
        return dh, dw, None, db, None, None, None


def fused_linear_cross_entropy_reference(hidden, weight, labels, ignore_index=-100, softcap=None,
                                         num_items=None, bias=None):
    """PyTorch reference (materialises the logits): what transformers' ForCausalLMLoss computes."""
    logits = F.linear(hidden, weight, bias).float()
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    if num_items is None:
        return F.cross_entropy(logits, labels, ignore_index=ignore_index)
    total = F.cross_entropy(logits, labels, ignore_index=ignore_index, reduction="sum")
    return total / torch.as_tensor(num_items, device=total.device)


def label_rows_cross_entropy(hidden, weight, labels, ignore_index=-100, softcap=None, num_items=None, bias=None):
    """The PyTorch reference over the labelled rows only: the same loss and gradients (an ignored row adds
    nothing to either), without the unlabelled rows' logits. On a CPU chat job, where the prompt and the
    padding are most rows, that is most of the LM head's work (the built-in identity run: 5 % of a step).
    With no labelled row at all every row runs, as the reference does."""
    picked = _labelled_rows(labels, ignore_index)
    if picked is not None and picked.numel():
        hidden, labels = hidden.index_select(0, picked), labels.index_select(0, picked)
    return fused_linear_cross_entropy_reference(hidden, weight, labels, ignore_index, softcap, num_items, bias)


def fused_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                               ignore_index: int = -100, softcap: float | None = None,
                               num_items=None, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Cross-entropy of `hidden @ weight.T (+ bias)` against `labels`, chunked, fp32 scalar loss.

    hidden [N, H], weight [V, H], labels [N] (already shifted; `ignore_index` rows count zero).
    `num_items` (int or tensor): divide the summed loss by it; None: mean over label tokens.
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"expected hidden [N, H] and weight [V, H], got {tuple(hidden.shape)} and "
                         f"{tuple(weight.shape)}")
    if labels.shape != hidden.shape[:1]:
        raise ValueError(f"labels must be [N]={hidden.shape[0]}, got {tuple(labels.shape)}")
    if not triton_runs_on(hidden):
        return label_rows_cross_entropy(hidden, weight, labels, ignore_index, softcap, num_items, bias)
    hidden = hidden.to(weight.dtype).contiguous()
    return _FusedLinearCrossEntropy.apply(hidden, weight, labels.contiguous(), bias, ignore_index,
                                          softcap, num_items)
