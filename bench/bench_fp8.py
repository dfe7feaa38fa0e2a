"""BASELINES.md rows for FP8 base weights: our engine with bf16 and with FP8 bases, in one process on
one model (same weights, same data, adapters reset before each variant), in bench_lora.py's
format and timing (median of 8 steps after 3 warm-ups, peak = max_memory_allocated).

A variant is PRECISION[+SWITCH...]:CHECKPOINTING, e.g. bf16:off, fp8:off, fp8:offload,
fp8:budget=16.6, fp8+fullx:off. Switches (module flags, read at call time, restored after):
savex (fused nodes keep X as FP8 codes for dA; the default since 2026-12-01, so rows before that
date without it had fullx), fullx (they keep the bf16 X: the old default), fastbwd (fast FP8 accumulation in backward too),
torchT (weight codes transposed by torch's copy_ instead of the Triton kernel), nogc (Python's cyclic
GC off while the variant runs: does a collection mid-step idle the GPU?), packed (attention through
kernels/packed_attention.py with each row one fixed document: FlashAttention varlen, no mask),
graph (packed, and the whole step captured once as a CUDA graph and replayed: kernels/step_graph.py,
AdamW capturable=True; the host no longer sets the pace).
"budget=G" keeps as many decoder layers un-recomputed as fit under G GiB peak (the rest are
checkpointed with their inputs offloaded to pinned host memory), measured, and steps down one
layer at a time while the measured peak is over G (every try is written, "fits" says which
held): the way to compare with a peer at no more than its memory. bf16 variants must come first
(FP8 quantization frees the bf16 weights). --save-model DIR writes the random-init base model
(with a word-level tokenizer) for bench/unsloth_rows.py, so Unsloth loads the very same weights.

    python bench/bench_fp8.py --shape llama-3.1-8b --bs 2 --variants bf16:off,fp8:off,fp8:budget=16.6
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_lora import (ROOT, SHAPES, USEFUL_PEAK_TFLOPS, _write, add_lora, build_model,  # noqa: E402
                              make_batches, run, useful_flops_per_token)

GIB = 2 ** 30
SWITCHES = {"savex": ("kernels.ops.fp8_linear", "SAVE_INPUT_FP8", True),   # the default since 2026-12-01
            "fullx": ("kernels.ops.fp8_linear", "SAVE_INPUT_FP8", False),
            "fastbwd": ("kernels.ops.fp8_linear", "FAST_ACCUM_BACKWARD", True),
            "torchT": ("kernels.ops.fp8_transpose", "BACKEND", "torch"),
            "policyfirst": ("jobs.train.methods.preference", "REFERENCE_FIRST", False),   # DPO's pass order
            "ktowhole": ("jobs.train.methods.preference", "KTO_HALVES", False),   # KTO's KL answers with grad
            "ktohalves": ("jobs.train.methods.preference", "KTO_HALVES", True),   # ... in a forward without grad
            # KTO's KL answers riding along the answers' packed forward whatever the layer size, or never
            # (before 2026-12-07: the halves or whole units)
            "ktoride": ("jobs.train.methods.preference", "KTO_RIDING", True),
            "ktonoride": ("jobs.train.methods.preference", "KTO_RIDING", False),
            "ktobucket": ("kernels.checkpoint_rows", "BUCKET", 256),   # riding's recompute rounded up to 256 tokens
            # SFT's further pass charged its fixed GPU work alone: a budgeted SFT micro-batch in passes of
            # fewer rows that recompute fewer layers (jobs/models/fit_passes.py SFT_PASS_SECONDS)
            "sftpasses": ("jobs.models.fit_passes", "SFT_PASS_SECONDS", 0.003),
            "sftwhole": ("jobs.models.fit_passes", "SFT_PASS_SECONDS", 10.0),   # ... in passes only to fit
            # a recomputed layer's MLP runs its down projection too (before 2026-12-06; kernels/lora_patch.py)
            "fulldown": ("kernels.lora_patch", "SKIP_DOWN_IN_RECOMPUTE", False),
            # the LM-head loss runs its logits for every row, labelled or not (before 2026-12-06)
            "allrows": ("kernels.ops.fused_linear_cross_entropy", "SKIP_UNLABELED_ROWS", False),
            # a hosted input embedding as before 2026-12-06: the token ids read back from the GPU (waiting for
            # the queued kernels), gathered into a fresh tensor, then a pinned copy of it
            "hostcopy": ("kernels.host_embedding", "STAGED_GATHER", False),
            # the staged gather, but with the ids read back (the sync alone, for a three-way A/B)
            "hostsync": ("kernels.host_embedding", "HOST_IDS", False),
            # the fused MLP's forward without grad writing e, g and h as the forward with grad does (before
            # 2026-12-06, session 61)
            "mlpsave": ("kernels.ops.lora_mlp", "NO_GRAD_OVER_E", False),
            # each adapter's cast to bf16 made once a step, not once a forward (kernels/ops/_lora_common.py
            # step_casts; session 69, off until measured)
            "stepcasts": ("kernels.ops._lora_common", "CACHE_STEP_CASTS", True)}


def save_base(model, folder: Path, vocab: int) -> None:
    """The bf16 base model plus a word-level tokenizer (Unsloth's loader needs one)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    words = {f"<t{i}>": i for i in range(vocab)}
    tok = Tokenizer(models.WordLevel(vocab=words, unk_token="<t0>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<t0>", bos_token="<t1>", eos_token="<t2>",
                            pad_token=f"<t{vocab - 1}>").save_pretrained(folder)


def _batches(args):
    return make_batches(args.shape, args.bs, args.seq)   # bench_lora.run's data


def _patch(model, precision: str, state: dict) -> list[str]:
    from kernels import patch_model
    if state.get("precision") == precision:
        return state["report"]
    if state.get("precision") == "fp8":
        raise SystemExit("bf16 variants must come before fp8 ones (FP8 quantization frees the bf16 weights)")
    report = patch_model(model, backend="triton", base_precision=precision).lines()
    state.update(precision=precision, report=report)
    return report


def _budget_policy(model, target_gib: float, keep: int | None, tokens: int) -> tuple[str, int, int]:
    """Keep `keep` layers (None: estimate from the free budget), offload the rest's inputs."""
    from kernels.checkpoint import _set_policy, decoder_layers, layer_activation_bytes
    layers = decoder_layers(model)
    config = model.get_base_model().config
    per_layer = layer_activation_bytes(config, tokens, 2)
    if keep is None:
        lora = sum(p.numel() for p in model.parameters() if p.requires_grad) * 4
        spare = target_gib * GIB - torch.cuda.memory_allocated() - 3 * lora - 768 * 2 ** 20
        keep = int(max(0, min(len(layers), spare // per_layer)))
    keep = max(0, min(keep, len(layers)))
    flags = [True] * (len(layers) - keep) + [False] * keep
    _set_policy(layers, flags, offload=keep < len(layers), device=torch.device("cuda"))
    return f"budget {target_gib} GiB: {keep} of {len(layers)} layers kept, the rest offloaded", keep, per_layer


def _run_variant(args, model, variant, state, lora_state, reference):
    import gc
    import importlib
    precision, mode = variant.split(":", 1)
    precision, *switches = precision.split("+")
    saved, gc_was_on = [], gc.isenabled()
    if "nogc" in switches:   # Python's cyclic GC off while this variant runs (host-jitter experiment)
        switches.remove("nogc")
        gc.collect()
        gc.disable()
    args.graph, args.packed = "graph" in switches, "packed" in switches
    switches = [name for name in switches if name not in ("graph", "packed")]
    for name in switches:
        module_name, attr, value = SWITCHES[name]
        module = importlib.import_module(module_name)
        saved.append((module, attr, getattr(module, attr)))
        setattr(module, attr, value)
    try:
        return _run_mode(args, model, variant, precision, mode, state, lora_state, reference)
    finally:
        for module, attr, value in saved:
            setattr(module, attr, value)
        args.graph = args.packed = False
        if gc_was_on:
            gc.enable()


def _run_mode(args, model, variant, precision, mode, state, lora_state, reference):
    """Rows of one variant; a budget variant moves `keep` up or down until the best fitting one."""
    report = _patch(model, precision, state)
    keep, tried = None, set()
    while True:
        result, target, keep, per_layer = _measure(args, model, variant, precision, mode, report, state,
                                                   lora_state, reference, keep)
        tried.add(keep)
        if target is None:
            return result
        room = (target - result["peak_gib"]) * GIB
        step = int(room // per_layer) if result["fits"] else -(int(-room // per_layer) + 1)
        keep = max(0, keep + step)
        if step == 0 or keep in tried or len(tried) >= 4:
            return result
        torch.cuda.empty_cache()


def _measure(args, model, variant, precision, mode, report, state, lora_state, reference, keep):
    from kernels import apply_checkpointing
    target = per_layer = None
    if mode.startswith("budget="):
        target = float(mode.split("=", 1)[1])
        policy, keep, per_layer = _budget_policy(model, target, keep, args.bs * args.seq)
    else:
        policy = apply_checkpointing(model, mode, batch_tokens=args.bs * args.seq)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name in lora_state:
                param.copy_(lora_state[name])
    model._bench_report, model._bench_ready = report + [f"checkpointing: {policy}"], True
    args.checkpointing = mode
    result = run(args, model)
    # useful MFU against BASELINES.md's bf16 rate (bench_lora counts nn.Linear, not Fp8Linear)
    mfu = state["flops_per_token"] * result["tokens_per_s"] / (USEFUL_PEAK_TFLOPS * 1e12)
    result.update(variant=variant, base_precision=precision, hf_first_step_loss=reference,
                  loss_rel_diff=abs(result["first_step_loss"] - reference) / abs(reference),
                  useful_mfu=round(mfu, 4))
    if target is not None:
        result.update(fits=result["peak_gib"] <= target, layers_kept=keep)
    _write(args.out, result)
    return result, target, keep, per_layer


def profile(model, args, out: Path) -> None:
    from bench.profile_step import group_of
    x = _batches(args)[0]
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)

    def step():
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    for _ in range(2):
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(2):
            step()
        torch.cuda.synchronize()
    groups, kernels = {}, []
    for event in prof.key_averages():
        us = getattr(event, "device_time_total", 0) or 0
        if event.device_type == torch.autograd.DeviceType.CUDA and us:
            groups[group_of(event.key)] = groups.get(group_of(event.key), 0.0) + us / 2e3
            kernels.append([event.key, round(us / 2e3, 3), event.count // 2])
    kernels.sort(key=lambda k: -k[1])
    result = {"config": {k: v for k, v in vars(args).items() if isinstance(v, (str, int, float, bool))},
              "variant": args.profile_variant, "ms_per_step_by_group": dict(sorted(groups.items(), key=lambda kv: -kv[1])),
              "gpu_ms_per_step": sum(groups.values()), "kernels_ms_launches": kernels[:60]}
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps({"profile": args.profile_variant, "gpu_ms": round(result["gpu_ms_per_step"], 1),
                      "by_group": {k: round(v, 1) for k, v in result["ms_per_step_by_group"].items()}}))
    for name, ms, n in kernels[:15]:
        print(f"{ms:9.2f} ms {n:5d}x  {name[:100]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), required=True)
    parser.add_argument("--bs", type=int, default=2)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--variants", default="bf16:off,fp8:off")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--save-model", default=None, help="write the base model here for bench/unsloth_rows.py")
    parser.add_argument("--profile-variant", default=None, help="after the rows, profile this variant")
    parser.add_argument("--profile-out", default="profile_fp8.json")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "lora.jsonl"))
    args = parser.parse_args()
    args.stack, args.qlora, args.lora_dtype, args.fused_adamw = "fusetune", False, "fp32", False
    tick = time.perf_counter()
    model = build_model(args.shape, qlora=False)
    if args.save_model:
        save_base(model, Path(args.save_model), SHAPES[args.shape]["vocab_size"])
        print(f"saved {args.save_model} in {time.perf_counter() - tick:.0f} s", flush=True)
    model = add_lora(model, args.lora_dtype)
    model.config.use_cache = False
    lora_state = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    x = _batches(args)[0]
    with torch.no_grad():
        reference = float(model(input_ids=x, labels=x).loss)
    state: dict = {"flops_per_token": useful_flops_per_token(model, SHAPES[args.shape], args.seq)}
    for variant in args.variants.split(","):
        _run_variant(args, model, variant, state, lora_state, reference)
        torch.cuda.empty_cache()
    if args.profile_variant:
        precision, mode = args.profile_variant.split(":", 1)
        _patch(model, precision, state)
        from kernels import apply_checkpointing
        apply_checkpointing(model, mode, batch_tokens=args.bs * args.seq)
        profile(model, args, Path(args.profile_out))


if __name__ == "__main__":
    main()
