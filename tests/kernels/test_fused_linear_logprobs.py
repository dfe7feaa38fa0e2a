"""fused_linear_logprobs vs the materialised-logits PyTorch reference (log_softmax + gather),
forward and backward, the per-sequence helper, and the logprobs benchmark's CPU smoke run."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels.ops import fused_linear_logprobs as fll
from kernels.ops.fused_linear_logprobs import (fused_linear_logprobs, fused_linear_logprobs_reference,
                                               kernel_unavailable_reason, sequence_logps)

ROOT = Path(__file__).resolve().parents[2]
N, D, V = 37, 67, 1031          # N not a multiple of the chunk, V not a power of two, D odd
REL_TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    """16 rows per chunk in fp32 (32 in bf16): 37 rows run as 16 + 16 + 5, the ragged tail included."""
    monkeypatch.setattr(fll, "CHUNK_BYTES", 16 * V * 4)


def _case(dtype=torch.float32, seed=0, train_weight=False, with_bias=False, n=N):
    torch.manual_seed(seed)
    hidden = torch.randn(n, D).to(dtype)
    weight = (torch.randn(V, D) * 0.2).to(dtype).requires_grad_(train_weight)
    bias = (torch.randn(V) * 0.1).to(dtype).requires_grad_(train_weight) if with_bias else None
    labels = torch.randint(0, V, (n,))
    labels[::4] = -100
    return hidden, weight, bias, labels


def _run(fn, hidden, weight, bias, labels, upstream, **kwargs):
    h = hidden.detach().clone().requires_grad_()
    w = weight.detach().clone().requires_grad_(weight.requires_grad)
    b = None if bias is None else bias.detach().clone().requires_grad_(bias.requires_grad)
    logp = fn(h, w, labels, bias=b, **kwargs)
    params = [t for t in (h, w, b) if t is not None and t.requires_grad]
    # a different upstream gradient per token, as GRPO's per-token ratio gives
    return logp, torch.autograd.grad((logp * upstream).sum(), params)


def _rel_err(got, want):
    return ((got.float() - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


def _compare(dtype, hidden, weight, bias, labels, **kwargs):
    upstream = torch.randn(hidden.shape[0], generator=torch.Generator().manual_seed(7))
    logp, grads = _run(fused_linear_logprobs, hidden, weight, bias, labels, upstream, **kwargs)
    # the reference in fp32 from the same (rounded) inputs
    ref, ref_grads = _run(fused_linear_logprobs_reference, hidden.float(), weight.float(),
                          None if bias is None else bias.float(), labels, upstream, **kwargs)
    assert logp.dtype == torch.float32 and logp.shape == labels.shape
    assert torch.all(logp[labels == -100] == 0) and torch.all(logp[labels != -100] < 0)
    assert _rel_err(logp, ref) <= REL_TOL[dtype]
    for got, want in zip(grads, ref_grads, strict=True):
        assert got.dtype == dtype
        assert _rel_err(got, want) <= REL_TOL[dtype], (got.shape, _rel_err(got, want))


def test_logprobs_match_reference_with_ignored_labels():
    _compare(torch.float32, *_case())


@pytest.mark.parametrize("temperature", [0.7, 1.6])
def test_logprobs_temperature(temperature):
    _compare(torch.float32, *_case(seed=1), temperature=temperature)


def test_logprobs_softcap_with_temperature():
    hidden, weight, bias, labels = _case(seed=2)
    _compare(torch.float32, hidden * 8, weight, bias, labels, softcap=3.0, temperature=0.9)  # the cap matters


@pytest.mark.parametrize("softcap", [None, 5.0])
def test_logprobs_trainable_head_and_bias_recompute(softcap):
    _compare(torch.float32, *_case(seed=3, train_weight=True, with_bias=True), softcap=softcap,
             temperature=0.8)


def test_logprobs_frozen_head_with_bias():
    _compare(torch.float32, *_case(seed=4, with_bias=True))


def test_logprobs_bf16_kernel():
    _compare(torch.bfloat16, *_case(torch.bfloat16, seed=5), temperature=0.7)


def test_logprobs_bf16_torch_path_on_cpu(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    hidden, weight, _, labels = _case(torch.bfloat16, seed=6)
    assert "not on CUDA" in kernel_unavailable_reason(hidden)
    _compare(torch.bfloat16, hidden, weight, None, labels, softcap=4.0, temperature=0.7)


def test_logprobs_one_chunk_equals_many(monkeypatch):
    hidden, weight, _, labels = _case(seed=8)
    many = fused_linear_logprobs(hidden, weight, labels)
    monkeypatch.setattr(fll, "CHUNK_BYTES", 1 << 30)
    torch.testing.assert_close(fused_linear_logprobs(hidden, weight, labels), many, rtol=1e-6, atol=1e-6)


def test_logprobs_frozen_head_gets_no_grad_and_backward_twice_is_refused():
    hidden, weight, _, labels = _case(seed=9)
    h = hidden.clone().requires_grad_()
    logp = fused_linear_logprobs(h, weight, labels)
    logp.sum().backward(retain_graph=True)
    assert weight.grad is None and h.grad is not None
    with pytest.raises(RuntimeError, match="twice"):
        logp.sum().backward()
    with torch.no_grad():
        torch.testing.assert_close(fused_linear_logprobs(hidden, weight, labels),
                                   fused_linear_logprobs_reference(hidden, weight, labels))


def test_logprobs_label_outside_vocab_gives_nan_and_bad_inputs_are_named():
    hidden, weight, _, labels = _case(seed=10)
    labels[1] = V + 5
    logp = fused_linear_logprobs(hidden, weight, labels)
    assert torch.isnan(logp[1]) and not torch.isnan(logp[2:]).any()
    with pytest.raises(ValueError, match="labels"):
        fused_linear_logprobs(hidden, weight, labels[:-1])
    with pytest.raises(ValueError, match="hidden"):
        fused_linear_logprobs(hidden[:, :-1], weight, labels)
    with pytest.raises(ValueError, match="temperature"):
        fused_linear_logprobs(hidden, weight, labels, temperature=0.0)


def test_sequence_logps_matches_a_python_loop():
    torch.manual_seed(11)
    token_logp = -torch.rand(50)
    seq_index = torch.randint(-1, 6, (50,))     # -1: padding, dropped
    mask = torch.rand(50) > 0.3
    sums, counts = sequence_logps(token_logp, seq_index, 7, mask=mask)
    for s in range(7):
        picked = [token_logp[i].item() for i in range(50) if seq_index[i] == s and mask[i]]
        assert counts[s].item() == len(picked)
        assert abs(sums[s].item() - sum(picked)) < 1e-5
    sums_all, counts_all = sequence_logps(token_logp, seq_index, 7)
    assert counts_all.sum().item() == (seq_index >= 0).sum().item()
    assert abs(sums_all.sum().item() - token_logp[seq_index >= 0].sum().item()) < 1e-4


def _pairs(seed, lengths):
    """Per sequence: hidden rows, labels (the first 3 tokens a prompt, ignored)."""
    torch.manual_seed(seed)
    hidden = [torch.randn(n, D) for n in lengths]
    labels = [torch.randint(0, V, (n,)) for n in lengths]
    for lab in labels:
        lab[:3] = -100
    return hidden, labels


def test_dpo_chosen_and_rejected_in_one_call_equal_two_calls():
    weight = torch.randn(V, D) * 0.2
    chosen_h, chosen_l = _pairs(12, [9, 14, 5])
    rejected_h, rejected_l = _pairs(13, [11, 6, 20])
    seqs_h, seqs_l = chosen_h + rejected_h, chosen_l + rejected_l
    index = torch.cat([torch.full((len(l),), i) for i, l in enumerate(seqs_l)])
    sums, _ = sequence_logps(fused_linear_logprobs(torch.cat(seqs_h), weight, torch.cat(seqs_l)), index, 6)

    def separate(hs, ls):
        idx = torch.cat([torch.full((len(l),), i) for i, l in enumerate(ls)])
        return sequence_logps(fused_linear_logprobs(torch.cat(hs), weight, torch.cat(ls)), idx, len(ls))[0]

    torch.testing.assert_close(sums, torch.cat([separate(chosen_h, chosen_l), separate(rejected_h, rejected_l)]),
                               rtol=1e-5, atol=1e-5)


def test_logprobs_bench_smoke_runs_on_cpu(tmp_path):
    out = tmp_path / "logprobs_op.jsonl"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "logprobs_op.py"), "--smoke", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {row["impl"] for row in rows} == {"fusetune", "fusetune-compact", "torch"}
    assert all(row["max_abs_diff_vs_torch"] < 1e-4 for row in rows if row["impl"] != "torch")
    assert all(row["ms"] >= 0 and "config" in row for row in rows)
