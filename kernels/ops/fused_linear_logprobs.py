"""Fused linear + log-probs: per-token log p(label) of the LM head without the N x V logits.

token_logp[t] = log softmax(z_t)[label_t], z_t = cap(hidden_t @ W^T + b) / T (cap: Gemma 2's soft-cap
c * tanh(x / c), applied before the sampling temperature T, as HF's model then GRPO's temperature do).
Ignored rows (label == ignore_index) give 0. The per-token form is what every preference method
needs: DPO / ORPO / SimPO / KTO sum or average it per sequence (`sequence_logps`), and GRPO takes the
per-token ratio exp(logp - logp_old).

The rows run in chunks whose logits take at most `CHUNK_BYTES` (the chunking of
fused_linear_cross_entropy.py, whose row kernel design this one follows). Per chunk: one torch GEMM
for the logits into a reused buffer, one Triton program per row (online log-sum-exp, Milakov &
Gimelshein 2018, in fp32), which overwrites the logits with d logp / d logits =
(onehot - softmax) / T (times 1 - (cap / c)^2 under soft-capping), then one GEMM G_chunk = that @ W.

Frozen LM head (LoRA; the default): G, the unscaled row gradient d token_logp_t / d hidden_t, is
computed in the forward and backward only scales row t by grad_output[t] (Liger-Kernel's
fused-linear trick, https://github.com/linkedin/Liger-Kernel; TRL's `trl/kernels/chunked_logprob.py`
does the same for a frozen head). Two vocabulary-sized GEMMs in all, no recompute.
Memory: G is N x D in the hidden dtype, as large as the hidden states themselves (9600 tokens x
4096 in bf16: 79 MB), plus one logits chunk (<= 256 MB) during the forward; against N x V logits
in fp32 for the plain path (9600 x 128256: 4.9 GB, and again for their gradient).

Trainable head (`weight.requires_grad` or a trainable bias): the forward keeps only the row
log-sum-exp (N fp32) and the backward recomputes each chunk's logits, writes
grad_output[t] * d logp / d logits over them, and accumulates dH, dW (and db): three GEMMs, no G.

Ignored rows still go through the logits GEMM (dropping them here would need a host sync for the
count); a caller that knows its label rows can pass `hidden[mask]` (H200 numbers: docs/kernels.md).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels.ops._launch import triton_runs_on
from kernels.ops.fused_linear_cross_entropy import _chunk_rows, _row_launch, _softcap

CHUNK_BYTES = 256 * 1024 * 1024


@triton.jit
def _logprob_rows_kernel(
    logits_ptr, stride_row, labels_ptr, logp_ptr, lse_ptr, grad_out_ptr, n_vocab, ignore_index,
    cap, inv_t, HAS_SOFTCAP: tl.constexpr, LSE_GIVEN: tl.constexpr, WRITE_GRAD: tl.constexpr,
    HAS_GRAD_OUT: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    row_ptr = logits_ptr + row.to(tl.int64) * stride_row
    label = tl.load(labels_ptr + row).to(tl.int32)
    cols = tl.arange(0, BLOCK)
    if label == ignore_index:
        if not LSE_GIVEN:
            tl.store(logp_ptr + row, 0.0)
            tl.store(lse_ptr + row, 0.0)
        if WRITE_GRAD:
            for start in range(0, n_vocab, BLOCK):
                zeros = tl.zeros([BLOCK], dtype=tl.float32)
                tl.store(row_ptr + start + cols, zeros.to(logits_ptr.dtype.element_ty),
                         mask=start + cols < n_vocab)
    else:
        if LSE_GIVEN:
            lse = tl.load(lse_ptr + row)
        else:
            running_max = -float("inf")
            running_sum = 0.0
            for start in range(0, n_vocab, BLOCK):
                mask = start + cols < n_vocab
                z = tl.load(row_ptr + start + cols, mask=mask, other=0.0).to(tl.float32)
                if HAS_SOFTCAP:
                    z = _softcap(z, cap)
                z = tl.where(mask, z * inv_t, -float("inf"))
                new_max = tl.maximum(running_max, tl.max(z, axis=0))
                running_sum = running_sum * tl.exp(running_max - new_max) + tl.sum(tl.exp(z - new_max), axis=0)
                running_max = new_max
            lse = running_max + tl.log(running_sum)
            # a label outside [0, V) (a tokenizer/model mismatch) gives nan, not a wild read
            z_label = tl.load(row_ptr + label, mask=(label >= 0) & (label < n_vocab), other=float("nan"))
            z_label = z_label.to(tl.float32)
            if HAS_SOFTCAP:
                z_label = _softcap(z_label, cap)
            tl.store(logp_ptr + row, z_label * inv_t - lse)
            tl.store(lse_ptr + row, lse)
        if WRITE_GRAD:
            scale = inv_t
            if HAS_GRAD_OUT:
                scale = scale * tl.load(grad_out_ptr + row).to(tl.float32)
            for start in range(0, n_vocab, BLOCK):
                mask = start + cols < n_vocab
                z = tl.load(row_ptr + start + cols, mask=mask, other=0.0).to(tl.float32)
                if HAS_SOFTCAP:
                    z = _softcap(z, cap)
                grad = tl.where(start + cols == label, 1.0, 0.0) - tl.exp(z * inv_t - lse)
                if HAS_SOFTCAP:
                    grad = grad * (1.0 - (z / cap) * (z / cap))
                tl.store(row_ptr + start + cols, (grad * scale).to(logits_ptr.dtype.element_ty), mask=mask)


def _chunk_logits(chunk, weight, bias, out):
    if bias is None:
        return torch.mm(chunk, weight.t(), out=out)
    return torch.addmm(bias, chunk, weight.t(), out=out)


def _launch_rows(logits, labels, logp, lse, grad_out, opts, lse_given, write_grad):
    block, warps = _row_launch(logits.shape[1])
    softcap, temperature, ignore_index = opts
    _logprob_rows_kernel[(logits.shape[0],)](
        # unused pointers get `lse` as a stand-in (the constexpr flags keep them untouched)
        logits, logits.stride(0), labels, lse if logp is None else logp, lse,
        lse if grad_out is None else grad_out,
        logits.shape[1], ignore_index, float(softcap or 0.0), 1.0 / temperature,
        HAS_SOFTCAP=softcap is not None, LSE_GIVEN=lse_given, WRITE_GRAD=write_grad,
        HAS_GRAD_OUT=grad_out is not None, BLOCK=block, num_warps=warps,
    )


def _forward_chunks(hidden, weight, labels, bias, opts, want_row_grad):
    """(token_logp [N] fp32, lse [N] fp32, G [N, D] or None): G only when `want_row_grad`."""
    n_rows, n_vocab = hidden.shape[0], weight.shape[0]
    logp = torch.empty(n_rows, dtype=torch.float32, device=hidden.device)
    lse = torch.empty(n_rows, dtype=torch.float32, device=hidden.device)
    row_grad = torch.empty_like(hidden) if want_row_grad else None
    rows = _chunk_rows(n_rows, n_vocab, hidden.element_size())
    buffer = torch.empty(rows, n_vocab, dtype=hidden.dtype, device=hidden.device)
    for start in range(0, n_rows, rows):
        end = min(start + rows, n_rows)
        logits = _chunk_logits(hidden[start:end], weight, bias, buffer[: end - start])
        _launch_rows(logits, labels[start:end], logp[start:end], lse[start:end], None, opts,
                     lse_given=False, write_grad=want_row_grad)
        if want_row_grad:
            torch.mm(logits, weight, out=row_grad[start:end])
    return logp, lse, row_grad


def _recompute_backward(hidden, weight, labels, bias, lse, grad_out, opts, need):
    """dH, dW, db by recomputing each chunk's logits (the trainable-head path)."""
    need_dh, need_dw, need_db = need
    n_rows, n_vocab = hidden.shape[0], weight.shape[0]
    grad_hidden = torch.empty_like(hidden) if need_dh else None
    # dW accumulates in the weight dtype as in the CE op (an fp32 accumulator would need an fp32
    # copy of each chunk's V x D product); db is only V long, so it accumulates in fp32
    grad_weight = torch.zeros_like(weight) if need_dw else None
    grad_bias = torch.zeros(n_vocab, dtype=torch.float32, device=weight.device) if need_db else None
    rows = _chunk_rows(n_rows, n_vocab, hidden.element_size())
    buffer = torch.empty(rows, n_vocab, dtype=hidden.dtype, device=hidden.device)
    grad_out = grad_out.to(torch.float32).contiguous()
    for start in range(0, n_rows, rows):
        end = min(start + rows, n_rows)
        chunk = hidden[start:end]
        logits = _chunk_logits(chunk, weight, bias, buffer[: end - start])
        _launch_rows(logits, labels[start:end], None, lse[start:end], grad_out[start:end], opts,
                     lse_given=True, write_grad=True)
        if need_dh:
            torch.mm(logits, weight, out=grad_hidden[start:end])
        if need_dw:
            grad_weight.addmm_(logits.t(), chunk)
        if need_db:
            grad_bias.add_(logits.sum(dim=0, dtype=torch.float32))
    return grad_hidden, grad_weight, None if grad_bias is None else grad_bias.to(bias.dtype)


class _FusedLinearLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, bias, softcap, temperature, ignore_index):
        need_dh, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        need_db = bias is not None and ctx.needs_input_grad[3]
        ctx.opts = (softcap, temperature, ignore_index)
        ctx.recompute = need_dw or need_db
        logp, lse, ctx.row_grad = _forward_chunks(hidden, weight, labels, bias, ctx.opts,
                                                  want_row_grad=need_dh and not ctx.recompute)
        if ctx.recompute:
            ctx.save_for_backward(hidden, weight, labels, bias, lse)
        return logp

    @staticmethod
    def backward(ctx, grad_out):
        if ctx.recompute:
            hidden, weight, labels, bias, lse = ctx.saved_tensors
            need = (ctx.needs_input_grad[0], ctx.needs_input_grad[1],
                    bias is not None and ctx.needs_input_grad[3])
            dh, dw, db = _recompute_backward(hidden, weight, labels, bias, lse, grad_out, ctx.opts, need)
            return dh, dw, None, db, None, None, None
        if ctx.row_grad is None:
            if ctx.needs_input_grad[0]:
                raise RuntimeError("fused linear log-probs backward ran twice on one graph "
                                   "(retain_graph=True); call fused_linear_logprobs_reference for that")
            return None, None, None, None, None, None, None
        # scale G in place by grad_output per row and drop the node's reference (as the CE op does):
        # no second N x D buffer, and G is not held until the whole graph is freed
        row_grad, ctx.row_grad = ctx.row_grad, None
        # (g stays fp32 inside the multiply: one rounding to the hidden dtype, not two)
        return row_grad.mul_(grad_out[:, None]), None, None, None, None, None, None


def fused_linear_logprobs_reference(hidden, weight, labels, bias=None, softcap=None, temperature=1.0,
                                    ignore_index=-100):
    """PyTorch reference: the full fp32 logits, log_softmax, gather (what TRL's
    `selective_log_softmax` computes), 0 where the label is ignored."""
    logits = F.linear(hidden, weight, bias).float()
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    logp = torch.log_softmax(logits / temperature, dim=-1)
    keep = labels != ignore_index
    picked = logp.gather(1, torch.where(keep, labels, 0).unsqueeze(1)).squeeze(1)
    return torch.where(keep, picked, torch.zeros_like(picked))


def kernel_unavailable_reason(hidden: torch.Tensor) -> str | None:
    """Why the Triton path cannot run on these inputs (None when it can)."""
    if not triton_runs_on(hidden):
        return "tensors are not on CUDA (and TRITON_INTERPRET is not 1): the PyTorch reference runs"
    return None


def _check_inputs(hidden, weight, labels, bias, temperature):
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"expected hidden [N, D] and weight [V, D], got {tuple(hidden.shape)} and "
                         f"{tuple(weight.shape)}")
    if labels.shape != hidden.shape[:1]:
        raise ValueError(f"labels must be [N]={hidden.shape[0]}, got {tuple(labels.shape)}")
    if bias is not None and bias.shape != weight.shape[:1]:
        raise ValueError(f"bias must be [V]={weight.shape[0]}, got {tuple(bias.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


def fused_linear_logprobs(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                          bias: torch.Tensor | None = None, softcap: float | None = None,
                          temperature: float = 1.0, ignore_index: int = -100) -> torch.Tensor:
    """token_logp [N] fp32: log softmax(cap(hidden @ weight.T + bias) / temperature)[labels], chunked.

    hidden [N, D], weight [V, D], labels [N] (already shifted; `ignore_index` rows give 0).
    Differentiable in hidden, and in weight / bias when they require grad (module doc).
    """
    _check_inputs(hidden, weight, labels, bias, temperature)
    if kernel_unavailable_reason(hidden) is not None:
        return fused_linear_logprobs_reference(hidden, weight, labels, bias, softcap, temperature,
                                               ignore_index)
    hidden = hidden.to(weight.dtype).contiguous()
    return _FusedLinearLogprobs.apply(hidden, weight, labels.contiguous(), bias, softcap,
                                      float(temperature), ignore_index)


def sequence_logps(token_logp: torch.Tensor, seq_index: torch.Tensor, num_seqs: int,
                   mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum [S], count [S]) of the per-token log-probs of each sequence, on the device (no host sync).

    seq_index [N]: the sequence each token belongs to (0..num_seqs-1; a negative index drops the
    token). mask [N] (optional): tokens to count, e.g. `labels != -100`; without it every token
    with a valid index counts. DPO / ORPO use the sum, SimPO / IPO-style length-normalised losses
    sum / count.
    """
    keep = seq_index >= 0
    if mask is not None:
        keep = keep & mask.bool()
    index = torch.where(keep, seq_index, 0).long()
    weights = keep.to(token_logp.dtype)
    sums = token_logp.new_zeros(num_seqs).index_add(0, index, token_logp * weights)
    counts = token_logp.new_zeros(num_seqs).index_add(0, index, weights)
    return sums, counts
