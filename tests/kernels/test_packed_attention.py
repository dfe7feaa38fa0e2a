"""Packed rows train exactly like the same examples run one by one: summed loss and every LoRA
gradient agree (relative 1e-5, fp32) for every architecture of the patch table, with the Triton
engine (CPU interpreter) and without it; and the varlen op matches per-document attention."""
import copy

import pytest
import torch

from jobs.data.encode import Example
from jobs.data.packing import collate_packed
from kernels import patch_model
from kernels.arch import ARCHITECTURES
from kernels.ops.varlen_attention import varlen_attention, varlen_attention_reference
from kernels import packed_attention
from kernels.packed_attention import (NAME, documents, packed_attention_forward, restore_attention,
                                      use_packed_attention, whole_rows)
from tests.kernels.tiny_peft import tiny_model, with_lora

REL = 1e-5
# (length, prompt tokens with label -100); 13 > the sliding window 8 of mistral/gemma2/gemma3
SHAPES = [(5, 2), (13, 4), (9, 0), (7, 3)]


def examples(seed: int = 3) -> list[Example]:
    generator = torch.Generator().manual_seed(seed)
    out = []
    for length, prompt in SHAPES:
        ids = torch.randint(3, 128, (length,), generator=generator).tolist()
        out.append(Example(ids, [-100] * prompt + ids[prompt:]))
    return out


def label_total(items) -> int:
    return sum(1 for e in items for label in e.labels[1:] if label != -100)


def lora_grads(model) -> dict:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None and "lora_" in n}


def one_by_one(model, items):
    total, loss = label_total(items), 0.0
    for e in items:
        out = model(input_ids=torch.tensor([e.input_ids]), labels=torch.tensor([e.labels]), num_items_in_batch=total)
        out.loss.backward()
        loss += out.loss.detach()
    return loss, lora_grads(model)


def packed(model, items, row_length=20):
    batch = collate_packed([[items[0], items[1]], [items[2], items[3]]], row_length, pad_id=0)
    assert batch.label_tokens == label_total(items)
    out = model(**batch.to(torch.device("cpu")), num_items_in_batch=batch.label_tokens)
    out.loss.backward()
    return out.loss.detach(), lora_grads(model)


def assert_rel(actual, expected, what):
    err = (actual - expected).abs().max().item()
    scale = expected.abs().max().item() or 1.0
    assert err <= REL * scale, f"{what}: {err:.3g} > {REL} x {scale:.3g}"


@pytest.mark.parametrize("engine", ["triton", "torch"])
@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_packed_batch_equals_examples_one_by_one(model_type, engine):
    reference = with_lora(tiny_model(model_type))
    model = copy.deepcopy(reference)
    report = patch_model(model, backend=engine)
    assert report.backend == engine
    use_packed_attention(model)
    assert model.config._attn_implementation == NAME
    items = examples()
    loss_ref, grads_ref = one_by_one(reference, items)
    loss, grads = packed(model, items)
    assert_rel(loss, loss_ref, "summed loss")
    assert grads.keys() == grads_ref.keys() and grads
    for name, grad in grads.items():
        assert_rel(grad, grads_ref[name], name)


def test_without_the_seam_a_plain_sdpa_row_would_mix_examples():
    """The test above can fail: the same packed row under plain sdpa (no document boundaries,
    no cu_seq_lens) gives a different loss."""
    reference = with_lora(tiny_model("llama"))
    items = examples()
    loss_ref, _ = one_by_one(reference, items)
    batch = collate_packed([[items[0], items[1]], [items[2], items[3]]], 20, pad_id=0)
    inputs = batch.to(torch.device("cpu"))
    mixed = {k: v for k, v in inputs.items() if k not in ("cu_seq_lens_q", "cu_seq_lens_k", "position_ids")}
    loss = reference(**mixed, num_items_in_batch=batch.label_tokens).loss.detach()
    assert abs(loss - loss_ref) > 10 * REL * abs(loss_ref)   # far outside the tolerance above


def test_restore_attention_gives_the_previous_implementation_back():
    model = with_lora(tiny_model("qwen2"))
    before = model.config._attn_implementation
    use_packed_attention(model)
    restore_attention(model)
    assert model.config._attn_implementation == before


def test_documents_are_read_from_packed_position_ids_when_cu_seqlens_are_missing():
    positions = torch.tensor([[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 1]])
    cu, longest = documents(2, 6, torch.device("cpu"), position_ids=positions)
    assert cu.tolist() == [0, 3, 5, 6, 10, 12] and longest == 4
    cu, longest = documents(2, 6, torch.device("cpu"), position_ids=torch.arange(6)[None])
    assert cu.tolist() == [0, 6, 12] and longest == 6


@pytest.mark.parametrize("window", [None, 3])
def test_varlen_op_matches_sdpa_per_document(window):
    torch.manual_seed(0)
    lengths = [4, 9, 1, 6]
    cu = torch.tensor([0, 4, 13, 14, 20], dtype=torch.int32)
    q, k, v = torch.randn(20, 4, 8), torch.randn(20, 2, 8), torch.randn(20, 2, 8)
    out = varlen_attention(q, k, v, cu, max(lengths), sliding_window=window)
    start = 0
    for n in lengths:
        sl = slice(start, start + n)
        qd, kd, vd = (t[sl].transpose(0, 1) for t in (q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)))
        pos = torch.arange(n)
        allowed = (pos[:, None] >= pos[None, :]) & ((pos[:, None] - pos[None, :] < window) if window else True)
        expected = torch.nn.functional.scaled_dot_product_attention(qd, kd, vd, attn_mask=allowed)
        torch.testing.assert_close(out[sl], expected.transpose(0, 1), atol=1e-5, rtol=1e-5)
        start += n


def test_varlen_reference_applies_the_soft_cap():
    torch.manual_seed(1)
    q, k, v = torch.randn(6, 2, 4) * 5, torch.randn(6, 2, 4) * 5, torch.randn(6, 2, 4)
    cu = torch.tensor([0, 6], dtype=torch.int32)
    capped = varlen_attention_reference(q, k, v, cu, scale=1.0, softcap=2.0)
    plain = varlen_attention_reference(q, k, v, cu, scale=1.0)
    assert not torch.allclose(capped, plain, atol=1e-3)
    scores = torch.tanh(torch.einsum("qhd,khd->hqk", q, k) / 2.0) * 2.0
    scores = scores.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))
    expected = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)
    torch.testing.assert_close(capped, expected, atol=1e-5, rtol=1e-5)


def test_whole_rows_are_recognised_from_shapes_alone():
    rows = torch.tensor([0, 6, 12], dtype=torch.int32)
    assert whole_rows(rows, 6, batch=2, length=6)
    assert not whole_rows(rows, 5, batch=2, length=6)                       # a shorter longest document
    assert not whole_rows(torch.tensor([0, 3, 6, 12], dtype=torch.int32), 6, batch=2, length=6)
    assert not whole_rows(None, 6, batch=2, length=6) and not whole_rows(rows, None, batch=2, length=6)


@pytest.mark.parametrize("kv_heads", [2, 4])
def test_whole_row_documents_take_plain_causal_attention_with_the_same_result(kv_heads, monkeypatch):
    """Fixed-length rows given as documents: causal sdpa without a mask, equal to the varlen path
    (each row one document) in forward and backward."""
    torch.manual_seed(4)
    batch, length, heads, dim = 2, 7, 4, 8
    q, k, v = (torch.randn(batch, h, length, dim, requires_grad=True) for h in (heads, kv_heads, kv_heads))
    kwargs = {"cu_seq_lens_q": torch.tensor([0, 7, 14], dtype=torch.int32), "max_length_q": length}
    calls = []
    monkeypatch.setattr(packed_attention, "varlen_attention",
                        lambda *a, **kw: calls.append(1) or varlen_attention(*a, **kw))
    fast, _ = packed_attention_forward(None, q, k, v, None, scaling=0.3, **kwargs)
    assert calls == [] and fast.shape == (batch, length, heads, dim)
    (fast * torch.arange(dim)).sum().backward()
    fast_grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    slow, _ = packed_attention_forward(None, q, k, v, None, scaling=0.3, sliding_window=length + 1, **kwargs)
    assert calls == [1]                                                     # a window: the varlen path
    (slow * torch.arange(dim)).sum().backward()
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)
    for got, want in zip(fast_grads, (q.grad, k.grad, v.grad)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("heads,kv_heads", [(6, 2), (8, 1), (4, 4)])
def test_a_decode_step_folds_query_heads_and_matches_transformers_sdpa(heads, kv_heads):
    """One query token against a cache (odd length 37) with a padded row masked: the folded GQA path
    gives transformers' repeat_kv sdpa result; without groups it is transformers' own path."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    torch.manual_seed(0)
    batch, length, dim = 3, 37, 16
    query = torch.randn(batch, heads, 1, dim)
    key, value = torch.randn(batch, kv_heads, length, dim), torch.randn(batch, kv_heads, length, dim)
    allowed = torch.rand(batch, length) > 0.3
    allowed[:, -1] = True
    mask = torch.where(allowed, 0.0, torch.finfo(torch.float32).min)[:, None, None, :]
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = heads // kv_heads, True
    want, _ = sdpa_attention_forward(module, query, key, value, mask, dropout=0.0, scaling=None)
    got, _ = packed_attention._masked_attention(module, query, key, value, mask, 0.0, None, None, None)
    assert packed_attention._foldable(query, key, mask, 0.0, None) == (kv_heads < heads)
    assert got.shape == want.shape == (batch, 1, heads, dim)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_cached_decoding_attention_switches_only_for_its_span():
    model = tiny_model("llama")
    before = model.config._attn_implementation
    with packed_attention.cached_decoding_attention(model):
        assert model.config._attn_implementation == NAME
    assert model.config._attn_implementation == before
    packed_attention.use_packed_attention(model)   # a packed job's switch stays on through sampling
    with packed_attention.cached_decoding_attention(model):
        pass
    assert model.config._attn_implementation == NAME
    restore_attention(model)
    assert model.config._attn_implementation == before


@pytest.mark.parametrize("window", [None, 3])
def test_keys_apart_from_queries_align_causality_bottom_right(window):
    """Documents whose keys are not their queries' tokens (cu_seqlens_k): n queries over m >= n keys,
    query j seeing keys up to j + m - n (FlashAttention-2's convention), forward and backward."""
    torch.manual_seed(1)
    docs = [(3, 3), (4, 9), (1, 6), (5, 5)]   # (queries, keys)
    cu_q = torch.tensor([0, 3, 7, 8, 13], dtype=torch.int32)
    cu_k = torch.tensor([0, 3, 12, 18, 23], dtype=torch.int32)
    q = torch.randn(13, 4, 8, requires_grad=True)
    k, v = torch.randn(23, 2, 8, requires_grad=True), torch.randn(23, 2, 8, requires_grad=True)
    out = varlen_attention(q, k, v, cu_q, 5, sliding_window=window, cu_seqlens_k=cu_k, max_seqlen_k=9)
    pieces = []
    for (n, m), qs, ks in zip(docs, cu_q.tolist(), cu_k.tolist()):
        qd = q[qs:qs + n].transpose(0, 1)
        kd, vd = (t[ks:ks + m].repeat_interleave(2, 1).transpose(0, 1) for t in (k, v))
        distance = (torch.arange(n)[:, None] + m - n) - torch.arange(m)[None, :]
        allowed = (distance >= 0) & ((distance < window) if window else True)
        pieces.append(torch.nn.functional.scaled_dot_product_attention(qd, kd, vd, attn_mask=allowed).transpose(0, 1))
    expected = torch.cat(pieces)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    for g, w in zip(got, torch.autograd.grad(expected, (q, k, v), grad)):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_a_prompt_packed_once_gives_each_answer_what_its_own_copy_gives(model_type):
    """GRPO's shared packed pass (kv_index, module doc) through the patched model of every architecture:
    each answer token's hidden state equals the one it has packed behind its own copy of the prompt, and
    the LoRA gradients of a loss on them agree (the prompt's are summed through the gather)."""
    from jobs.train.methods.grpo_data import rollout_tensors_packed, rollout_tensors_packed_shared

    model = with_lora(tiny_model(model_type))
    patch_model(model, backend="triton")
    use_packed_attention(model)
    prompts, answers = [[5, 17, 33, 40, 2, 9, 81, 3, 4, 6], [12, 7, 60]], [[8, 9, 10], [11], [40, 41, 42, 43, 44], [7]]
    weights = torch.randn(10, generator=torch.Generator().manual_seed(0))   # one per answer token
    results = []
    for pack in (rollout_tensors_packed, rollout_tensors_packed_shared):
        tensors, ints = pack(prompts, answers, 2)
        model.zero_grad(set_to_none=True)
        inputs = {k: v for k, v in tensors.items() if k not in ("labels", "seq_index", "lengths", "gather")}
        hidden = model(**inputs, **ints, output_hidden_states=True).hidden_states[-1][0]
        picked = hidden.index_select(0, tensors["gather"])
        (picked.sum(-1) * weights).sum().backward()
        results.append((picked.detach(), lora_grads(model)))
    (want, want_grads), (got, got_grads) = results
    assert_rel(got, want, "answer hidden states")
    assert got_grads.keys() == want_grads.keys() and got_grads
    for name, grad in got_grads.items():
        assert_rel(grad, want_grads[name], name)
