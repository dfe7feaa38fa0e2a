"""Image-text LoRA through `python -m jobs.train` (issue 21): tokens/s and peak GiB of SFT on a
vision-language model, LoRA r16 on the language model, the fused engine on a GPU.

Random weights of a real shape (Qwen2.5-VL-7B: the 7B language model and its 32-block vision tower,
as our other shape benchmarks use random weights), rows of one image each, sizes drawn from 448x448
to 1024x768, answers of long-tailed length (median ~40 words, a tail to ~400); the tokenizer is
tests/tiny.py's small Qwen2-style one with the vision specials (the shape, not the vocabulary, sets
the cost; the embedding keeps Qwen's 152,064 rows). One JSON line a run in --out.

    python bench/bench_vision.py prepare --dir /tmp/bv            # model + data (GPU machine)
    python bench/bench_vision.py run --dir /tmp/bv                # the job, one JSON line
    python bench/bench_vision.py --smoke                          # CPU: tiny Qwen2.5-VL, 3 steps
    python bench/bench_vision.py run --dir /tmp/bv --packing off  # one example a row, as the peers

The peers: bench/bench_vision_peers.py (one example a row; results in bench/results/vision.jsonl)."""
from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

QWEN25_VL_7B = dict(
    text=dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
              num_key_value_heads=4, vocab_size=152064, max_position_embeddings=32768,
              rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]}),
    vision=dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=3584,
                patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
                fullatt_block_indexes=[7, 15, 23, 31]))


def build_model(folder: Path, shape: dict, device: str) -> None:
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    from tests.tiny import QWEN2_VL_TEMPLATE, VISION_SPECIALS, make_qwen2_tokenizer
    tokenizer = make_qwen2_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": VISION_SPECIALS})
    tokenizer.chat_template = QWEN2_VL_TEMPLATE
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in VISION_SPECIALS}
    config = Qwen2_5_VLConfig(text_config=dict(shape["text"], bos_token_id=None), vision_config=shape["vision"],
                              image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                              vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
                              eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    with torch.device(device):
        model = Qwen2_5_VLForConditionalGeneration(config).to(torch.bfloat16 if device == "cuda" else torch.float32)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    Qwen2VLImageProcessorPil().save_pretrained(folder)


def write_rows(folder: Path, rows: int, sizes: list[tuple[int, int]], seed: int = 0) -> Path:
    from PIL import Image, ImageDraw
    rng = random.Random(seed)
    (folder / "imgs").mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(rows):
        width, height = rng.choice(sizes)
        image = Image.new("RGB", (width, height), tuple(rng.randrange(256) for _ in range(3)))
        ImageDraw.Draw(image).ellipse((width // 4, height // 4, width // 2, height // 2), fill=(200, 30, 30))
        image.save(folder / "imgs" / f"{i}.png")
        words = min(400, int(rng.lognormvariate(3.7, 0.8)))   # long-tailed answers, median ~40 words
        answer = " ".join(rng.choice(["red", "circle", "left", "the", "a", "image", "shows"]) for _ in range(words))
        lines.append(json.dumps({"messages": [
            {"role": "user", "content": [{"type": "image", "image": f"imgs/{i}.png"},
                                         {"type": "text", "text": "Describe the picture."}]},
            {"role": "assistant", "content": answer}]}))
    path = folder / "rows.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def run_job(model: Path, data: Path, out: Path, steps: int, device: str, max_len: int,
            packing: str = "auto", checkpointing: str = "auto", budget_gib: float = 0.0) -> dict:
    config = dict(model=str(model), dataset=str(data), output_dir=str(out), lora_r=16, lora_alpha=16,
                  max_steps=steps, save_steps=0, batch_size=1, max_seq_length=max_len, learning_rate=1e-4,
                  packing=packing, gradient_checkpointing=checkpointing, max_gpu_memory_gb=budget_gib,
                  fused_kernels=device == "cuda", dtype="bf16" if device == "cuda" else "fp32", seed=0)
    path = out.with_suffix(".yaml")
    # a fresh folder per run: events.jsonl appends, and on 2026-12-02 three runs into one folder were
    # summed into each other's rows (their peaks and tokens/s; bench/NOTES.md)
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config))   # JSON is YAML
    proc = subprocess.run([sys.executable, "-m", "jobs.train", str(path), "--data-dir", str(out.parent / "data")],
                          cwd=ROOT, capture_output=True, text=True)
    from jobs.io.events import summarize   # the project's one reader: a later start supersedes
    summary = summarize(out)
    steps_seen = summary.steps
    later = steps_seen[1:] or steps_seen
    tokens = sum(e["tokens"] for e in later)
    seconds = sum(e["tokens"] / max(e["tokens_per_s"], 1e-9) for e in later)
    return {"returncode": proc.returncode, "steps": len(steps_seen),
            "real_tokens_per_s": round(tokens / seconds, 1) if seconds else None,
            "peak_gib": max((e.get("peak_gb") or 0 for e in steps_seen), default=None),
            "final_loss": steps_seen[-1]["loss"] if steps_seen else None, "plan": plan_lines(out),
            **predicted(summary.start),
            "error": proc.stderr.strip().splitlines()[-1] if proc.returncode and proc.stderr.strip() else None}


def predicted(start: dict | None) -> dict:
    """The fit check's allocated peak for this job (its start event), to set beside the measured peak
    (issue 38: every budgeted row predicted within +-10 %)."""
    estimate = (start or {}).get("memory_estimate") or {}
    return {"predicted_gib": estimate.get("allocated_gb"), "predicted_parts_gib": estimate.get("breakdown_gb")}


def plan_lines(out: Path) -> list[str]:
    """What the job says it ran: its checkpointing plan, where its embedding table was, the vision
    tower's attention (train.log's kernel report)."""
    log = out / "train.log"
    keys = ("checkpointing:", "input embeddings:", "vision_attention")
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    return [line.strip() for line in lines if any(key in line for key in keys)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", nargs="?", choices=("prepare", "run"))
    parser.add_argument("--dir", type=Path, default=Path("/tmp/bench-vision"))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "vision.jsonl")
    parser.add_argument("--smoke", action="store_true")
    # auto packs several rows into each 4,096-token row on a GPU (jobs/data/vision_packing.py); the
    # peers (bench_vision_peers.py) run one example a row, so `--packing off` is the like-for-like run
    parser.add_argument("--packing", choices=("auto", "on", "off"), default="auto")
    # the peer's peak as our budget (bench/device.sh vision runs the peer first), or a fixed plan
    parser.add_argument("--checkpointing", choices=("auto", "on", "off", "offload"), default="auto")
    parser.add_argument("--max-gpu-memory-gb", type=float, default=0.0)
    # the packed row length (max_seq_length); every bench row (1,667 tokens at most) fits 2,048 too, and a
    # shorter row is a smaller step transient: at 4,096 even full offload peaked 0.86 GiB over the peer
    parser.add_argument("--max-len", type=int, default=4096)
    args = parser.parse_args()
    if args.smoke:
        from tests.tiny import make_tiny_vision_model
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            model = make_tiny_vision_model(root / "model")
            data = write_rows(root / "data-rows", rows=4, sizes=[(56, 56), (84, 56)])
            print(json.dumps({"bench": "vision", "mode": "smoke", **run_job(model, data, root / "job", 3, "cpu", 4096, args.packing)}))
        return
    import torch
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.mode == "prepare":
        build_model(args.dir / "qwen2.5-vl-7b", QWEN25_VL_7B, device)
        write_rows(args.dir / "rows", rows=max(64, args.steps + 8), sizes=[(448, 448), (640, 480), (1024, 768)])
        return
    from bench.bench_job import versions, write
    # a folder per configuration: the next run's fresh folder would take this one's train.log with it
    job = args.dir / f"job-{args.checkpointing}-{args.max_gpu_memory_gb:g}-{args.max_len}-{args.packing}"
    result = run_job(args.dir / "qwen2.5-vl-7b", args.dir / "rows" / "rows.jsonl", job, args.steps,
                     device, args.max_len, args.packing, args.checkpointing, args.max_gpu_memory_gb)
    write({"bench": "vision", "shape": "qwen2.5-vl-7b", "stack": "fusetune", "packing": args.packing,
           "checkpointing": args.checkpointing, "max_gpu_memory_gb": args.max_gpu_memory_gb, "max_len": args.max_len,
           **versions(), **result}, args.out)


if __name__ == "__main__":
    main()
