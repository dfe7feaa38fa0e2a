"""GPU correctness and speed of every op at real model shapes (bf16), against its PyTorch
reference computed in fp32 on the same inputs, plus patched-vs-unpatched parity of whole models.

CI checks the kernels in the Triton interpreter on CPU; this is the same check compiled for the
GPU (triton 3.6 on the device). Prints one line per op and writes JSON lines to --out.

    python bench/gpu_check.py --out bench/results/gpu_check.jsonl
"""
from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEV = "cuda"
BF16 = torch.bfloat16
SMALL = False  # --small: tiny shapes, for checking this script on CPU with TRITON_INTERPRET=1


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def ms(fn) -> float:
    if SMALL:
        return 0.0
    import triton.testing
    return float(triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median"))


def leaf(*shape, dtype=BF16, grad=True, scale=1.0):
    return (torch.randn(*shape, device=DEV, dtype=torch.float32) * scale).to(dtype).requires_grad_(grad)


def compare(name, op, ref, inputs, grad_inputs, upcast=True):
    """Run op and ref (ref on fp32 copies) forward+backward; relative errors and times."""
    out = op(*inputs)
    ref_inputs = [t.detach().float().requires_grad_(t.requires_grad) if torch.is_tensor(t) and upcast and
                  t.is_floating_point() else t for t in inputs]
    ref_out = ref(*ref_inputs)
    outs = out if isinstance(out, tuple) else (out,)
    ref_outs = ref_out if isinstance(ref_out, tuple) else (ref_out,)
    errors = {f"out{i}": rel(o, r) for i, (o, r) in enumerate(zip(outs, ref_outs))}
    seeds = [torch.randn_like(r) for r in ref_outs]
    torch.autograd.backward([o for o in outs], [s.to(o.dtype) for o, s in zip(outs, seeds)])
    torch.autograd.backward(list(ref_outs), seeds)
    for i in grad_inputs:
        errors[f"grad{i}"] = rel(inputs[i].grad, ref_inputs[i].grad)
    fresh = [t.detach().requires_grad_(t.requires_grad) if torch.is_tensor(t) else t for t in inputs]
    fresh_ref = [t.detach().requires_grad_(t.requires_grad) if torch.is_tensor(t) else t for t in inputs]

    def fwd_bwd(fn, args):
        o = fn(*args)
        o = o if isinstance(o, tuple) else (o,)
        torch.autograd.backward(list(o), [torch.ones_like(x) for x in o])
    return {"op": name, "errors": errors, "ms_ours": ms(lambda: fwd_bwd(op, fresh)),
            "ms_torch_bf16": ms(lambda: fwd_bwd(ref, fresh_ref))}


def op_cases():
    from kernels.ops import fused_linear_cross_entropy as flce
    from kernels.ops import geglu, rms_norm, rope, swiglu
    tokens, hidden, inter = (37, 64, 96) if SMALL else (4096, 4096, 14336)
    vocab, g_hidden, g_inter, seq = (311, 48, 80, 9) if SMALL else (128256, 2304, 9216, 2048)
    yield "rms_norm(frozen w)", lambda: compare(
        "rms_norm(frozen w)", lambda x, w: rms_norm.rms_norm(x, w, 1e-5),
        lambda x, w: rms_norm.rms_norm_reference(x, w, 1e-5), [leaf(tokens, hidden), leaf(hidden, grad=False)], [0])
    yield "rms_norm(gemma, trained w)", lambda: compare(
        "rms_norm(gemma, trained w)", lambda x, w: rms_norm.rms_norm(x, w, 1e-6, 1.0),
        lambda x, w: rms_norm.rms_norm_reference(x, w, 1e-6, 1.0), [leaf(tokens, g_hidden), leaf(g_hidden, scale=0.1)], [0, 1])
    yield "swiglu", lambda: compare("swiglu", swiglu.swiglu, swiglu.swiglu_reference,
                                    [leaf(tokens, inter), leaf(tokens, inter)], [0, 1])
    yield "geglu(tanh)", lambda: compare("geglu(tanh)", geglu.geglu, geglu.geglu_reference,
                                         [leaf(tokens, g_inter), leaf(tokens, g_inter)], [0, 1])

    def rope_case():
        q, k = leaf(2, 32, seq, 128), leaf(2, 8, seq, 128)
        pos = torch.arange(seq, device=DEV, dtype=torch.float32)
        inv = 1.0 / (500000 ** (torch.arange(0, 128, 2, device=DEV).float() / 128))
        freqs = torch.outer(pos, inv)
        emb = torch.cat([freqs, freqs], -1)
        cos, sin = emb.cos()[None].expand(2, -1, -1).to(BF16), emb.sin()[None].expand(2, -1, -1).to(BF16)
        # rope works in place: give it clones so the leaves keep their values for the reference
        return compare("rope", lambda a, b, c, s: rope.rope(a.clone(), b.clone(), c, s), rope.rope_reference,
                       [q, k, cos, sin], [0, 1])
    yield "rope", rope_case

    def flce_case():
        h, w = leaf(tokens, hidden), leaf(vocab, hidden, grad=False, scale=0.02)
        labels = torch.randint(0, vocab, (tokens,), device=DEV)
        labels[::7] = -100
        return compare("fused_linear_cross_entropy", lambda a, b: flce.fused_linear_cross_entropy(a, b, labels),
                       lambda a, b: flce.fused_linear_cross_entropy_reference(a, b, labels), [h, w], [0])
    yield "fused_linear_cross_entropy", flce_case
    yield from lora_cases(tokens, hidden, inter)


def lora_cases(tokens, hidden, inter):
    from kernels.ops._lora_common import LoraProjection
    from kernels.ops import lora_mlp, lora_o, lora_qkv

    def proj(n_out, n_in):
        return LoraProjection(leaf(n_out, n_in, grad=False, scale=0.02), leaf(16, n_in, scale=0.02),
                              leaf(n_out, 16, scale=0.02), 1.0)

    def as_args(projs):
        return [t for p in projs for t in (p.weight, p.lora_A, p.lora_B)]

    def rebuild(args, n):
        return [LoraProjection(args[3 * i], args[3 * i + 1], args[3 * i + 2], 1.0) for i in range(n)]

    kv = hidden // 4
    q, k, v = proj(hidden, hidden), proj(kv, hidden), proj(kv, hidden)
    x = leaf(tokens, hidden)
    args = [x, *as_args([q, k, v])]
    grads = [0, 2, 3, 5, 6, 8, 9]
    yield "lora_qkv", lambda: compare("lora_qkv", lambda x_, *a: lora_qkv.lora_qkv(x_, *rebuild(a, 3)),
                                      lambda x_, *a: lora_qkv.lora_qkv_reference(x_, *rebuild(a, 3)), args, grads)
    o = proj(hidden, hidden)
    yield "lora_o", lambda: compare("lora_o", lambda x_, w, a, b: lora_o.lora_o(x_, w, a, b, 1.0),
                                    lambda x_, w, a, b: lora_o.lora_o_reference(x_, w, a, b, 1.0),
                                    [leaf(tokens, hidden), o.weight, o.lora_A, o.lora_B], [0, 2, 3])
    g, u, d = proj(inter, hidden), proj(inter, hidden), proj(hidden, inter)
    margs = [leaf(tokens, hidden), *as_args([g, u, d])]
    yield "lora_mlp", lambda: compare("lora_mlp", lambda x_, *a: lora_mlp.lora_mlp(x_, *rebuild(a, 3)),
                                      lambda x_, *a: lora_mlp.lora_mlp_reference(x_, *rebuild(a, 3)), margs, grads)


def lora_add_case():
    """The in-place LoRA add (Triton tile kernel) against addmm_ (what it replaces) at real shapes."""
    from kernels.ops import lora_add as la
    shapes = {"small": (37, 96)} if SMALL else {
        "8b_q_o_down[4096x4096]": (4096, 4096), "8b_kv[4096x1024]": (4096, 1024),
        "1b_q_o_down[8192x2048]": (8192, 2048), "1b_kv[8192x512]": (8192, 512),
        "smollm_q[16384x576]": (16384, 576)}
    errors, ours, addmm = {}, {}, {}
    for label, (m, n) in shapes.items():
        y = torch.randn(m, n, device=DEV, dtype=BF16)
        xa = torch.randn(m, 48, device=DEV, dtype=BF16)[:, 16:32]   # a slice of the shared [M, 3r] XA
        b = torch.randn(n, 16, device=DEV, dtype=BF16) * 0.05
        expected = y.float() + 0.5 * (xa.float() @ b.float().t())
        errors[label] = rel(la.lora_add_(y.clone(), xa, b, 0.5), expected)
        ours[label] = ms(lambda: la.lora_add_(y, xa, b, 0.5))
        addmm[label] = ms(lambda: y.addmm_(xa, b.t(), alpha=0.5))
    return {"op": "lora_add", "errors": errors, "ms_ours": ours, "ms_torch_bf16": addmm}


def lora_act_backward_case():
    """Down adapter's dh term inside the activation backward vs addmm_ + the plain kernel (8B MLP)."""
    from kernels.ops import lora_mlp as lm
    m, inter = (37, 96) if SMALL else (4096, 14336)

    def fresh():
        torch.manual_seed(0)
        dh, e, g = (torch.randn(m, inter, device=DEV, dtype=BF16) for _ in range(3))
        return dh, e, g, torch.randn(m, 16, device=DEV, dtype=BF16), torch.randn(16, inter, device=DEV, dtype=BF16) * 0.05
    ref = [t.float() for t in fresh()]
    ref[0] += ref[3] @ ref[4]
    lm._act_mul_backward_(*ref[:3], geglu=False)
    ours = fresh()
    lm._lora_act_backward_(*ours, geglu=False)
    errors = {name: rel(a, b) for name, a, b in zip(("h", "de", "dg"), ours[:3], ref[:3])}
    dh, e, g, dyb, ad = fresh()

    def unfused():
        dh.addmm_(dyb, ad)
        lm._act_mul_backward_(dh, e, g, False)
    return {"op": "lora_act_backward", "errors": errors,
            "ms_ours": ms(lambda: lm._lora_act_backward_(dh, e, g, dyb, ad, False)),
            "ms_torch_bf16": ms(unfused)}


def nf4_case():
    import bitsandbytes.functional as bnbf
    from kernels.ops.nf4 import dequantize_nf4
    w = torch.randn(*((96, 64) if SMALL else (14336, 4096)), device=DEV, dtype=BF16)
    packed, state = bnbf.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=True)
    ours, theirs = dequantize_nf4(packed, state), bnbf.dequantize_4bit(packed, state)
    out = torch.empty_like(ours)
    return {"op": "dequantize_nf4", "errors": {"bit_exact": bool(torch.equal(ours, theirs))},
            "ms_ours": ms(lambda: dequantize_nf4(packed, state, out=out)),
            "ms_bitsandbytes": ms(lambda: bnbf.dequantize_4bit(packed, state))}


def riding_cut_case(bucket: int):
    """KTO riding's cut attention (kernels/checkpoint_rows.py cut_layer_call) on the GPU's varlen kernel: a
    packed row from jobs/data/pairs.py collate_units_riding, its leading tokens (rounded up to `bucket`,
    ending within a KL completion) attended alone against the whole row's attention over them. The CPU
    reference slices documents to the tensors it gets, so a wrong last bound shows only here."""
    import functools
    import random
    from jobs.data.encode import IGNORE_INDEX, Example
    from jobs.data.pairs import PairUnit, collate_units_riding, shared_cuts
    from kernels.checkpoint_rows import cut_layer_call
    from kernels.packed_attention import packed_attention_forward
    rng, units = random.Random(0), []
    for _ in range(3 if SMALL else 8):
        prompt, answer, other = (rng.randint(2, 9), rng.randint(1, 9), rng.randint(1, 9)) if SMALL else (
            rng.randint(50, 300), rng.randint(20, 400), rng.randint(20, 400))
        units.append(PairUnit(Example([1] * prompt + [2] * answer, [IGNORE_INDEX] * prompt + [2] * answer),
                              Example([1] * prompt + [3] * other, [IGNORE_INDEX] * prompt + [3] * other)))
    bucket = min(bucket, 7) if SMALL else bucket   # --small: a cut within a document still
    group = collate_units_riding(units, 0, 64 if SMALL else 6144, shared_cuts(units), bucket)
    rows, total = group.ints["kto_rows"], group.tensors["input_ids"].shape[1]
    kwargs = {name: group.tensors[name].to(DEV) for name in ("cu_seq_lens_q", "cu_seq_lens_k", "kv_index")}
    kwargs.update(max_length_q=group.ints["max_length_q"], max_length_k=group.ints["max_length_k"])
    heads, kv_heads, dim = (4, 2, 16) if SMALL else (32, 8, 64)
    q, k, v = (leaf(1, n, total, dim, grad=False) for n in (heads, kv_heads, kv_heads))

    def attend(hidden, **given):
        n = hidden.shape[1]
        return packed_attention_forward(None, q[:, :, :n], k[:, :, :n], v[:, :, :n], None, scaling=dim ** -0.5,
                                        **given)[0]
    hidden = torch.zeros(1, total, 1, device=DEV)   # only its length is read
    whole = attend(hidden, **kwargs)[:, :rows.tokens]
    cut = cut_layer_call(functools.partial(attend, **kwargs), hidden, rows)(hidden[:, :rows.tokens])
    within = rows.tokens not in group.tensors["cu_seq_lens_q"].tolist()
    return {"op": f"riding_cut[{bucket}]", "errors": {"out0": rel(cut, whole)}, "tokens": rows.tokens,
            "row": total, "within_a_document": within}


def seeded_lora_model(config):
    """A random-init bf16 model of `config` on DEV (seed 0) with LoRA r16 on every linear."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    with torch.device(DEV):
        model = AutoModelForCausalLM.from_config(config, dtype=BF16)
    return get_peft_model(model, LoraConfig(r=16, lora_alpha=16, target_modules="all-linear"))


def model_parity(model_type: str):
    """A small random model with PEFT LoRA: patched (triton) vs unpatched loss and LoRA grads."""
    from transformers import AutoConfig
    from kernels import patch_model
    extra = {"head_dim": 64} if model_type in ("gemma2", "gemma3_text", "qwen3") else {}
    hidden, layers, vocab, seq = (64, 2, 128, 17) if SMALL else (512, 4, 32000, 512)
    extra = {"head_dim": 16} if SMALL and extra else extra
    config = AutoConfig.for_model(model_type, hidden_size=hidden, intermediate_size=hidden * 2 + 32,
                                  num_hidden_layers=layers, num_attention_heads=4 if SMALL else 8,
                                  num_key_value_heads=2 if SMALL else 4, vocab_size=vocab,
                                  pad_token_id=0, bos_token_id=1, eos_token_id=2, **extra)
    x = torch.randint(0, vocab, (2, seq), device=DEV)
    results = []
    for patched in (False, True):
        model = seeded_lora_model(config)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.02)  # non-zero B so every LoRA gradient is exercised
        report = patch_model(model, backend="triton").lines() if patched else []
        model = model.float() if DEV == "cpu" else model  # the interpreter's bf16 dot is wrong
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        grads = {n: p.grad.float() for n, p in model.named_parameters() if p.requires_grad}
        results.append((float(loss), grads, report))
    (l0, g0, _), (l1, g1, report) = results
    worst = max(rel(g1[n], g0[n]) for n in g0)
    return {"op": f"model[{model_type}]", "errors": {"loss_rel": abs(l1 - l0) / abs(l0), "worst_grad_rel": worst},
            "report": report}


def step_graph_case(precision: str):
    """kernels/step_graph.py: the same 4 training steps eager and as one captured step (1 eager
    warm-up + 3 replays) from the same init and data; losses and final adapters must agree."""
    from transformers import AutoConfig
    from bench.bench_lora import static_documents
    from kernels import patch_model
    from kernels.packed_attention import use_packed_attention
    from kernels.step_graph import StepGraph, language_model_step
    config = AutoConfig.for_model("llama", hidden_size=512, intermediate_size=1408, num_hidden_layers=3,
                                  num_attention_heads=8, num_key_value_heads=4, vocab_size=32000)
    gen = torch.Generator(device=DEV).manual_seed(3)
    batches = [torch.randint(0, 32000, (2, 256), device=DEV, generator=gen) for _ in range(4)]
    extra = static_documents(2, 256)
    runs = []
    for graphed in (False, True):
        model = seeded_lora_model(config)
        patch_model(model, backend="triton", base_precision=precision)
        use_packed_attention(model)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=1e-3, capturable=True)
        if graphed:
            graph = StepGraph(language_model_step(model, opt), {"input_ids": batches[0], "labels": batches[0], **extra})
            losses = [float(graph.warmup_outputs[0])] + [float(graph({"input_ids": x, "labels": x})) for x in batches[1:]]
        else:
            losses = []
            for x in batches:
                loss = model(input_ids=x, labels=x, **extra).loss
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                losses.append(float(loss))
        runs.append((losses, [p.detach().float().clone() for p in params]))
    (eager, p0), (graphed, p1) = runs
    return {"op": f"step_graph[{precision}]", "losses": {"eager": eager, "graph": graphed},
            "errors": {"worst_loss_rel": max(abs(a - b) / abs(a) for a, b in zip(eager, graphed)),
                       "worst_adapter_rel": max(rel(b, a) for a, b in zip(p0, p1))}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="gpu_check.jsonl")
    parser.add_argument("--small", action="store_true", help="tiny shapes on --device (script check)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--only", default=None,
                        help="comma-separated substrings: run only the cases whose name contains one")
    args = parser.parse_args()
    global DEV, SMALL
    DEV, SMALL = args.device, args.small
    cases = list(op_cases()) + [("dequantize_nf4", nf4_case), ("lora_add", lora_add_case),
                                ("lora_act_backward", lora_act_backward_case)]
    cases += [(f"model[{m}]", lambda m=m: model_parity(m))
              for m in ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3")]
    cases += [(f"step_graph[{p}]", lambda p=p: step_graph_case(p)) for p in ("bf16", "fp8")]
    cases += [(f"riding_cut[{b}]", lambda b=b: riding_cut_case(b)) for b in (1, 256)]
    from bench.fp8_check import fp8_cases   # FP8 base weights (issue 11): `--only fp8`
    cases += list(fp8_cases(DEV, SMALL, rel, ms))
    if args.only:
        cases = [(n, c) for n, c in cases if any(part in n for part in args.only.split(","))]
    with open(args.out, "a") as fh:
        for name, case in cases:
            torch.manual_seed(0)
            try:
                row = case()
            except Exception as exc:  # report every failing op and go on to the next
                row = {"op": name, "failed": f"{type(exc).__name__}: {exc}",
                       "trace": traceback.format_exc()[-1500:]}
            row.update(gpu=torch.cuda.get_device_name(0) if DEV == "cuda" else DEV, torch=torch.__version__,
                       triton=__import__("triton").__version__)
            fh.write(json.dumps(row) + "\n")
            shown = {k: row[k] for k in ("errors", "ms_ours", "ms_torch_bf16", "ms_torch", "ms_bf16_base",
                                         "ms_bitsandbytes", "failed")
                     if k in row}
            print(name, json.dumps(shown)[:400], flush=True)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
