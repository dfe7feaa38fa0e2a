"""LoRA / QLoRA training-step benchmark in the exact config of ../shared/BASELINES.md.

Random-init bf16 weights built on the GPU from a config of the named shape; LoRA r=16, alpha=16,
dropout 0 on q,k,v,o,gate,up,down; AdamW lr 1e-4; random token ids with labels = inputs; a step is
forward + backward + optimizer, timed with torch.cuda.synchronize() around it; median of 8 steps
after 3 warm-ups; peak = torch.cuda.max_memory_allocated() after load. Each run appends one JSON
line (GPU, versions, config, tokens/s, peak GB, first-step loss, the HF+PEFT first-step loss on the
same weights and data) to bench/results/<file>.jsonl.

    python bench/bench_lora.py --shape llama-3.1-8b --bs 2 --seq 2048 --stack fusetune --checkpointing on
"""
from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAPES = {
    "llama-3.1-8b": dict(model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, vocab_size=128256, rope_theta=5e5,
                         tie_word_embeddings=False, max_position_embeddings=131072),
    "qwen2.5-7b": dict(model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, vocab_size=152064, rope_theta=1e6,
                       tie_word_embeddings=False, max_position_embeddings=131072),
    "llama-3.2-1b": dict(model_type="llama", hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, vocab_size=128256, rope_theta=5e5,
                         tie_word_embeddings=True, max_position_embeddings=131072),
    "smollm2-135m": dict(model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, vocab_size=49152, rope_theta=1e5,
                         tie_word_embeddings=True, max_position_embeddings=8192),
    "gemma-2-2b": dict(model_type="gemma2", hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                       num_attention_heads=8, num_key_value_heads=4, head_dim=256, vocab_size=256000,
                       tie_word_embeddings=True, max_position_embeddings=8192),
    "llama-3.1-70b": dict(model_type="llama", hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                          num_attention_heads=64, num_key_value_heads=8, vocab_size=128256, rope_theta=5e5,
                          tie_word_embeddings=False, max_position_embeddings=131072),
}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
USEFUL_PEAK_TFLOPS = 790.0


def build_model(shape: str, qlora: bool):
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = dict(SHAPES[shape])
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    if qlora:
        from bench.quantize import build_nf4_model
        return build_nf4_model(config)
    with torch.device("cuda"):
        return AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)


def add_lora(model, lora_dtype: str = "fp32"):
    """PEFT LoRA in the BASELINES.md config. lora_dtype "fp32" is PEFT's default (adapters upcast to
    fp32, AdamW states in fp32: what every peer row uses); "bf16" keeps them in the model dtype, an
    experiment only (half the adapter/optimizer memory, no per-call casts, bf16 master weights)."""
    from peft import LoraConfig, get_peft_model
    config = LoraConfig(r=16, lora_alpha=16, lora_dropout=0.0, target_modules=TARGETS, bias="none",
                        task_type="CAUSAL_LM")
    return get_peft_model(model, config, autocast_adapter_dtype=lora_dtype == "fp32")


def useful_flops_per_token(model, cfg: dict, seq: int) -> float:
    """(4·N_linear + 6·L·seq·hidden), BASELINES.md's useful-MFU numerator (frozen base: no dW)."""
    n_linear = sum(m.weight.numel() if not hasattr(m.weight, "quant_state") else m.weight.quant_state.shape.numel()
                   for name, m in model.named_modules()
                   if isinstance(m, torch.nn.Linear) and "lora_" not in name)
    return 4 * n_linear + 6 * cfg["num_hidden_layers"] * seq * cfg["hidden_size"]


def setup_stack(model, stack: str, checkpointing: str, batch_tokens: int | None = None) -> list[str]:
    if stack == "hf":
        if checkpointing == "on":
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return ["hf+peft"]
    from kernels import apply_checkpointing, patch_model
    report = patch_model(model, backend="triton")
    policy = apply_checkpointing(model, checkpointing, batch_tokens=batch_tokens)
    return report.lines() + [f"checkpointing: {policy}"]


class GcPauses:
    """Python's cyclic-GC pauses while active (gc.callbacks): when the host only queues a few ms ahead
    of the GPU, a collection in the middle of a step shows up as GPU idle time (TorchTitan turns
    automatic collection off during training for that reason, torchtitan/tools/utils.py
    GarbageCollection). Measured here before anything changes it."""

    def __enter__(self):
        self.pauses, self._start = [], None
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc):
        gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        elif self._start is not None:
            self.pauses.append((info.get("generation", -1), (time.perf_counter() - self._start) * 1e3))
            self._start = None

    def total_ms(self) -> float:
        return sum(ms for _, ms in self.pauses)

    def summary(self) -> dict:
        return {"count": len(self.pauses), "total_ms": round(self.total_ms(), 2),
                "max_ms": round(max((ms for _, ms in self.pauses), default=0.0), 2),
                "gen2": sum(1 for gen, _ in self.pauses if gen == 2)}

    def per_step(self, steps: int) -> dict:
        """{"gen0": {"collections", "ms"}, ...}: collections and their time a step, by generation."""
        by_generation: dict[int, list] = {}
        for gen, ms in self.pauses:
            entry = by_generation.setdefault(gen, [0, 0.0])
            entry[0] += 1
            entry[1] += ms
        return {f"gen{g}": {"collections": n / steps, "ms": round(ms / steps, 3)}
                for g, (n, ms) in sorted(by_generation.items())}


def add_shape_args(parser, shape: str | None = "llama-3.1-8b") -> None:
    """--shape (required when no default), --bs, --seq: the row of BASELINES.md a script measures."""
    parser.add_argument("--shape", choices=sorted(SHAPES), required=shape is None, default=shape)
    parser.add_argument("--bs", type=int, default=2)
    parser.add_argument("--seq", type=int, default=2048)


def make_batches(shape: str, bs: int, seq: int, count: int = 4) -> list[torch.Tensor]:
    """BASELINES.md's data: random token ids from one seeded CUDA generator, the same for every stack."""
    gen = torch.Generator(device="cuda").manual_seed(1234)
    vocab = SHAPES[shape]["vocab_size"]
    return [torch.randint(0, vocab, (bs, seq), device="cuda", generator=gen) for _ in range(count)]


def timed_steps(model, batches, opt, warmup: int, steps: int, extra: dict | None = None) -> dict:
    """BASELINES.md's timing, shared by every stack: each full step (forward, backward, optimizer)
    between two torch.cuda.synchronize(); peak memory counted from here. Also per step: how long the
    host took to queue it (enqueue_s_all) and Python's GC pauses (diagnostics; the timing is unchanged).
    `extra`: keyword arguments every forward gets besides input_ids and labels (packed attention's)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times, queued, gc_ms, first_loss = [], [], [], None
    with GcPauses() as gc_pauses:
        for i in range(warmup + steps):
            x = batches[i % len(batches)]
            torch.cuda.synchronize()
            tick, gc_before = time.perf_counter(), gc_pauses.total_ms()
            loss = model(input_ids=x, labels=x, **(extra or {})).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            queued.append(time.perf_counter() - tick)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - tick)
            gc_ms.append(round(gc_pauses.total_ms() - gc_before, 2))
            if i == 0:
                first_loss = float(loss)
    return {"step_s_all": [round(t, 4) for t in times], "enqueue_s_all": [round(t, 4) for t in queued],
            "gc_ms_all": gc_ms, "gc_pause_ms": gc_pauses.summary(), "first_step_loss": first_loss}


def timed_graph_steps(model, batches, opt, warmup: int, steps: int, extra: dict) -> dict:
    """timed_steps with the step captured once as a CUDA graph (kernels/step_graph.py) and replayed:
    the warm-ups are the graph's eager warm-up steps (untimed), then each replay between two syncs.
    Peak memory counts the capture; the graph's private pool stays reserved (peak_reserved_gib)."""
    from kernels.step_graph import StepGraph, language_model_step
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    began = time.perf_counter()
    graph = StepGraph(language_model_step(model, opt), {"input_ids": batches[0], "labels": batches[0], **extra},
                      warmup_steps=warmup)
    warmup_losses = [float(loss) for loss in graph.warmup_outputs]
    torch.cuda.synchronize()
    setup_s, times, queued = time.perf_counter() - began, [], []
    for i in range(steps):
        x = batches[(i + 1) % len(batches)]
        torch.cuda.synchronize()
        tick = time.perf_counter()
        graph({"input_ids": x, "labels": x})
        queued.append(time.perf_counter() - tick)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - tick)
    opt.zero_grad(set_to_none=True)   # the static grads live in the graph's pool; the next row starts clean
    return {"step_s_all": [round(t, 4) for t in times], "enqueue_s_all": [round(t, 4) for t in queued],
            "timed_from": 0, "graph_setup_s": round(setup_s, 2), "warmup_losses": warmup_losses,
            "first_step_loss": warmup_losses[0],
            "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 2)}


def static_documents(bs: int, seq: int) -> dict:
    """Packed attention's arguments for bs unpadded rows of seq tokens (one document each), as
    fixed tensors and ints: no host sync in the forward, so a step can be captured."""
    cu = torch.arange(0, (bs + 1) * seq, seq, dtype=torch.int32, device="cuda")
    return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": seq, "max_length_k": seq}


def _timed(args, model, batches, params) -> dict:
    """The timed steps of one row: eager (BASELINES.md's way), eager with packed attention's
    fixed documents (args.packed), or replays of one captured step (args.graph, implies packed)."""
    graph, packed = getattr(args, "graph", False), getattr(args, "packed", False)
    if not (graph or packed):
        opt = torch.optim.AdamW(params, lr=1e-4, **({"fused": True} if args.fused_adamw else {}))
        return timed_steps(model, batches, opt, args.warmup, args.steps)
    from kernels.packed_attention import restore_attention, use_packed_attention
    use_packed_attention(model)
    try:
        extra = static_documents(args.bs, args.seq)
        if graph:
            opt = torch.optim.AdamW(params, lr=1e-4, capturable=True)
            return timed_graph_steps(model, batches, opt, args.warmup, args.steps, extra)
        opt = torch.optim.AdamW(params, lr=1e-4)
        return timed_steps(model, batches, opt, args.warmup, args.steps, extra)
    finally:
        restore_attention(model)


def run(args, model=None) -> dict:
    model = model or add_lora(build_model(args.shape, args.qlora), args.lora_dtype)
    model.config.use_cache = False
    batches = make_batches(args.shape, args.bs, args.seq)
    reference_loss = None
    if not getattr(model, "_bench_ready", False):
        with torch.no_grad():
            reference_loss = float(model(input_ids=batches[0], labels=batches[0]).loss)
        model._bench_report = setup_stack(model, args.stack, args.checkpointing, args.bs * args.seq)
        model._bench_ready = True
    report = model._bench_report
    params = [p for p in model.parameters() if p.requires_grad]
    # fused=True is an experiment flag (one kernel instead of foreach launches); peers use the default
    timed = _timed(args, model, batches, params)
    times, first_loss = timed["step_s_all"], timed["first_step_loss"]
    median = statistics.median(times[timed.get("timed_from", args.warmup):])
    tokens_per_s = args.bs * args.seq / median
    flops = useful_flops_per_token(model, SHAPES[args.shape], args.seq)
    return {
        "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": _version("triton"),
        "transformers": _version("transformers"), "peft": _version("peft"), "python": platform.python_version(),
        "shape": args.shape, "stack": args.stack, "qlora": args.qlora, "bs": args.bs, "seq": args.seq,
        "checkpointing": args.checkpointing, "lora_r": 16, "lora_dtype": args.lora_dtype,
        "tokens_per_s": round(tokens_per_s, 1),
        "step_s_median": round(median, 4), **timed,
        "peak_gb": round(torch.cuda.max_memory_allocated() / 1e9, 2),
        "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
        "fused_adamw": args.fused_adamw,
        "step_mode": "graph" if getattr(args, "graph", False) else "packed" if getattr(args, "packed", False) else "eager",
        "hf_first_step_loss": reference_loss,
        "loss_rel_diff": None if reference_loss is None else abs(first_loss - reference_loss) / abs(reference_loss),
        "useful_mfu": round(flops * tokens_per_s / (USEFUL_PEAK_TFLOPS * 1e12), 4),
        "report": report, "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def sweep(args) -> None:
    """Long-context fit: one model, lengths tried upward; the last line says where it stopped."""
    if args.memory_cap_gb:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.memory_cap_gb * 1e9 / total))
    model = add_lora(build_model(args.shape, args.qlora), args.lora_dtype)
    seqs = [int(s) for s in args.seq_sweep.split(",")]
    # No unpatched reference forward here: at long lengths its full fp32 logits alone exceed the cap.
    model._bench_report = setup_stack(model, args.stack, args.checkpointing, args.bs * seqs[0])
    model._bench_ready = True
    for seq in seqs:
        args.seq = seq
        try:
            result = run(args, model)
        except torch.OutOfMemoryError as exc:
            result = {"shape": args.shape, "stack": args.stack, "seq": seq, "bs": args.bs, "oom": True,
                      "error": str(exc).splitlines()[0][:300]}
        result.update(memory_cap_gb=args.memory_cap_gb, sweep=True)
        _write(args.out, result)
        torch.cuda.empty_cache()
        if result.get("oom"):
            break


def _write(path: str, result: dict) -> None:
    line = json.dumps(result)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fh.write(line + "\n")
    keys = ("shape", "bs", "seq", "qlora", "checkpointing", "lora_dtype", "variant", "fused_adamw",
            "tokens_per_s", "step_s_median", "peak_gb", "peak_gib", "loss_rel_diff", "useful_mfu", "oom", "error")
    print(json.dumps({k: result[k] for k in keys if k in result}), flush=True)


def _version(name: str) -> str:
    import importlib.metadata
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "missing"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), required=True)
    parser.add_argument("--bs", type=int, default=2)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--stack", choices=["hf", "fusetune"], default="fusetune")
    parser.add_argument("--checkpointing", choices=["on", "off", "auto", "offload"], default="on")
    parser.add_argument("--qlora", action="store_true")
    parser.add_argument("--lora-dtype", choices=["fp32", "bf16"], default="fp32",
                        help="adapter dtype; fp32 (PEFT default) is the BASELINES.md config")
    parser.add_argument("--fused-adamw", action="store_true", help="AdamW(fused=True) instead of the default")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--memory-cap-gb", type=float, default=None,
                        help="cap the process with torch.cuda.set_per_process_memory_fraction")
    parser.add_argument("--seq-sweep", default=None,
                        help="comma-separated lengths tried upward in one process until one runs out of memory")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "lora.jsonl"))
    args = parser.parse_args()
    if args.seq_sweep:
        return sweep(args)
    if args.memory_cap_gb:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.memory_cap_gb * 1e9 / total))
    try:
        result = run(args)
    except torch.OutOfMemoryError as exc:
        result = {"shape": args.shape, "stack": args.stack, "bs": args.bs, "seq": args.seq, "qlora": args.qlora,
                  "checkpointing": args.checkpointing, "oom": True, "error": str(exc).splitlines()[0],
                  "gpu": torch.cuda.get_device_name(0), "memory_cap_gb": args.memory_cap_gb}
    result["memory_cap_gb"] = args.memory_cap_gb
    _write(args.out, result)


if __name__ == "__main__":
    main()
