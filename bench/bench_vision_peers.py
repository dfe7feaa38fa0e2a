"""The peers of bench/bench_vision.py (issue 21), on its model folder and rows, one JSON line a run:

- `--stack hf`: transformers + PEFT as a user writes it: the image-text model in bf16, LoRA r16 on the
  language model's linear layers (vision tower and projector frozen, as ours), transformers' gradient
  checkpointing, torch AdamW, one example a step. It trains on the very batches our job trains on
  (jobs/data/vision_encode.py: the same image patches, token ids and answer-only labels), so the
  difference is the engine only.
- `--stack unsloth`: Unsloth's FastVisionModel + TRL's SFTTrainer with UnslothVisionDataCollator, the
  setup of Unsloth's vision notebooks (finetune_vision_layers=False, their gradient checkpointing,
  `skip_prepare_dataset`), on the same rows with the images opened as PIL images. Its own process:
  Unsloth is imported before transformers / peft / trl (PYTHONPATH holds the carried peers).

Tokens are the batches' non-pad tokens, image tokens included (what our step events count); the
first step is warm-up. `--smoke` runs the hf stack on CPU with the tiny Qwen2.5-VL (tests/tiny.py).

    python bench/bench_vision_peers.py --stack hf --dir /tmp/bv          # after bench_vision.py prepare
    PYTHONPATH=.whl/site python bench/bench_vision_peers.py --stack unsloth --dir /tmp/bv
    python bench/bench_vision_peers.py --smoke"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

if "--stack" in sys.argv and "unsloth" in sys.argv:
    import unsloth  # noqa: F401  (first: it patches transformers, peft and trl on import)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LANGUAGE_TARGETS = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"


def step_summary(ends: list[float], tokens: list[int], began: float, peak_gib: float, warmup: int = 1) -> dict:
    """Real tokens/s over the steps after `warmup`, the median step and the peak."""
    times = [b - a for a, b in zip([began, *ends], ends)]
    kept_t, kept_n = times[warmup:] or times, tokens[warmup:] or tokens
    ordered = sorted(kept_t)
    return {"steps": len(ends), "real_tokens_per_s": round(sum(kept_n) / max(sum(kept_t), 1e-9), 1),
            "step_s_median": round(ordered[len(ordered) // 2], 4) if ordered else None,
            "peak_gib": round(peak_gib, 3)}


def hf_batches(model_dir: Path, rows: Path, max_len: int, steps: int) -> list:
    """Our job's batches (one example each) of the rows, in file order."""
    from jobs.data.vision_dataset import vision_examples
    from jobs.data.vision_encode import collate_vision
    from jobs.models import load, vision
    from jobs.spec import JobSpec
    tokenizer = load.load_tokenizer(str(model_dir))
    processor = vision.load_image_processor(str(model_dir))
    _, image_id = vision.image_token(tokenizer)
    spec = JobSpec(model=str(model_dir), dataset=str(rows), max_seq_length=max_len)
    examples = vision_examples(spec, "dataset", tokenizer, processor, image_id, None, log=lambda _line: None)
    return [collate_vision([examples[i % len(examples)]], tokenizer.pad_token_id, image_id) for i in range(steps)]


def run_hf(model_dir: Path, rows: Path, steps: int, max_len: int) -> dict:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.bfloat16 if cuda else torch.float32)
    model.to(device)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=16, lora_dropout=0.0, bias="none",
                                             target_modules=LANGUAGE_TARGETS))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    batches = hf_batches(model_dir, rows, max_len, steps)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    ends, tokens, losses, began = [], [], [], time.time()
    for batch in batches:
        inputs = {k: v.to(device) for k, v in batch.tensors.items()}
        loss = model(**inputs).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())   # a host sync a step, as a Trainer's logging makes
        ends.append(time.time())
        tokens.append(int(inputs["attention_mask"].sum()))
    peak = torch.cuda.max_memory_allocated() / 2 ** 30 if cuda else 0.0
    return {"stack": "transformers+peft", **step_summary(ends, tokens, began, peak), "first_loss": losses[0],
            "final_loss": losses[-1], "config": {"gradient_checkpointing": "transformers (non-reentrant)",
                                                 "optim": "torch AdamW", "batch": 1, "max_length": max_len}}


def unsloth_rows(rows: Path) -> list[dict]:
    """The rows as Unsloth's vision notebooks give them: content parts with PIL images, text parts."""
    from PIL import Image
    out = []
    for line in rows.read_text().splitlines():
        messages = json.loads(line)["messages"]
        converted = []
        for message in messages:
            content = message["content"]
            parts = content if isinstance(content, list) else [{"type": "text", "text": content}]
            converted.append({"role": message["role"], "content": [
                {"type": "image", "image": Image.open(rows.parent / p["image"]).convert("RGB")}
                if p.get("type") == "image" else {"type": "text", "text": p["text"]} for p in parts]})
        out.append({"messages": converted})
    return out


def run_unsloth(model_dir: Path, rows: Path, steps: int, max_len: int) -> dict:
    import torch
    from trl import SFTConfig, SFTTrainer
    from unsloth import FastVisionModel

    from bench.bench_job_unsloth import train_timed   # the (c) runs' timed train: peak reset, step end times
    from unsloth.trainer import UnslothVisionDataCollator
    model, tokenizer = FastVisionModel.from_pretrained(str(model_dir), load_in_4bit=False, dtype=torch.bfloat16,
                                                       use_gradient_checkpointing="unsloth")
    model = FastVisionModel.get_peft_model(model, finetune_vision_layers=False, finetune_language_layers=True,
                                           finetune_attention_modules=True, finetune_mlp_modules=True, r=16,
                                           lora_alpha=16, lora_dropout=0, bias="none", random_state=0)
    FastVisionModel.for_training(model)
    collator = UnslothVisionDataCollator(model, tokenizer)
    counts: list[int] = []

    def counting(features):
        batch = collator(features)
        counts.append(int(batch["attention_mask"].sum()))
        return batch

    config = SFTConfig(output_dir=str(model_dir.parent / "unsloth-vision"), per_device_train_batch_size=1,
                       gradient_accumulation_steps=1, max_steps=steps, learning_rate=1e-4, warmup_steps=0,
                       logging_steps=1, save_strategy="no", report_to="none", bf16=True, optim="adamw_torch",
                       remove_unused_columns=False, dataset_text_field="", max_length=max_len,
                       dataset_kwargs={"skip_prepare_dataset": True}, seed=0)
    trainer = SFTTrainer(model=model, processing_class=tokenizer, data_collator=counting,
                         train_dataset=unsloth_rows(rows), args=config)
    ends, began = train_timed(trainer)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    peak = torch.cuda.max_memory_allocated() / 2 ** 30
    return {"stack": "unsloth+trl", **step_summary(ends, counts[:len(ends)], began, peak),
            "first_loss": losses[0] if losses else None, "final_loss": losses[-1] if losses else None,
            "config": {"gradient_checkpointing": "unsloth", "optim": "adamw_torch", "batch": 1,
                       "max_length": max_len, "collator": "UnslothVisionDataCollator"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stack", choices=("hf", "unsloth"), default="hf")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/bench-vision"))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--max-len", type=int, default=4096)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "vision.jsonl")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        from bench.bench_vision import write_rows
        from tests.tiny import make_tiny_vision_model
        with tempfile.TemporaryDirectory() as tmp:
            model = make_tiny_vision_model(Path(tmp) / "model")
            rows = write_rows(Path(tmp) / "rows", rows=3, sizes=[(56, 56), (84, 56)])
            print(json.dumps({"bench": "vision", "mode": "smoke", **run_hf(model, rows, 3, args.max_len)}))
        return
    from bench.bench_job import versions, write
    run = run_unsloth if args.stack == "unsloth" else run_hf
    result = run(args.dir / "qwen2.5-vl-7b", args.dir / "rows" / "rows.jsonl", args.steps, args.max_len)
    write({"bench": "vision", "shape": "qwen2.5-vl-7b", **versions(), **result}, args.out)


if __name__ == "__main__":
    main()
