"""(c) of bench/bench_job.py: Unsloth + TRL SFTTrainer with packing (their fastest documented
setting: best-fit-decreasing packing, padding-free batches), on the same model folder, data, LoRA
config, max length, rows per step and step count. Its own process: Unsloth must be imported
before transformers/peft/trl.

    python bench/bench_job_unsloth.py --shape llama-3.2-1b --dir /tmp/bj --rows 4 --steps 30

The chats become TRL prompt-completion rows (prompt = system/user turns, completion = the
assistant turn), so TRL trains the completion only, as Fusetune trains the answer only. Real
tokens per step are counted in the data collator (non-pad tokens of each batch).

`--method dpo|orpo` (issue 19): TRL's DPOTrainer (ref_model=None: the PEFT model with its adapter
off is the reference, as in Fusetune) or ORPOTrainer (trl.experimental.orpo in TRL 1.x), on
bench/pref_data.py's pairs (pairs.jsonl, TRL's conversational prompt/chosen/rejected form) with
--pairs pairs a step, beta 0.1, max_length --max-len. `--trl-option key=value` sets a further
config field where the installed TRL has it (e.g. padding_free=true); each one is written with the result.

`--stack trl` (d): the same trainers without Unsloth, on transformers + PEFT with TRL's own
gradient checkpointing; with `--trl-option use_liger_kernel=true` Liger-Kernel's layer kernels
(RMSNorm, RoPE, SwiGLU) are applied too. TRL 1.15's DPOTrainer computes the loss's log-probs with its
own chunked kernel (`trl/kernels/chunked_logprob.py`) and refuses Liger's fused linear cross-entropy
(dpo_trainer.py: "it replaces the model's forward"), so "TRL + Liger" there means Liger's layer
kernels beside TRL's fused LM head; Liger's chunked DPO loss is no longer wired into TRL.

`--method kto` (issue 38): TRL's KTOTrainer on kto.jsonl, the same pairs unpaired (bench/pref_data.py
kto_rows: each pair a desirable and an undesirable example), --pairs examples a step; kto_config says
what its best configuration is. `--stack trl --device cpu`: the plain-TRL path on a CPU (a smoke run:
fp32, no peak memory); Unsloth needs a GPU."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def _stack_from_argv(argv: list[str]) -> str:
    """--stack's value, read before anything imports transformers (Unsloth must come first)."""
    for i, arg in enumerate(argv):
        if arg == "--stack" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--stack="):
            return arg.split("=", 1)[1]
    return "unsloth"


if _stack_from_argv(sys.argv) == "unsloth":   # the script's (or its importer's) --stack
    import unsloth  # noqa: F401  (first: it patches transformers, peft and trl on import)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_job import TARGETS, UtilSampler, versions, window_stats, write  # noqa: E402
from bench.pref_data import unit_files  # noqa: E402


class CountingCollator:
    """Wraps TRL's collator and records the real tokens of every batch, in order."""

    def __init__(self, inner):
        self.inner, self.counts = inner, []

    def __call__(self, features):
        batch = self.inner(features)
        masks = [v for k, v in batch.items() if k.endswith("attention_mask")]   # preference collators: several
        ids = [v for k, v in batch.items() if k.endswith("input_ids")]
        self.counts.append(int(sum(m.sum() for m in masks)) if masks else int(sum(i.numel() for i in ids)))
        return batch


def dataset(path: Path):
    from datasets import Dataset
    rows = []
    for line in path.read_text().splitlines():
        messages = json.loads(line)["messages"]
        rows.append({"prompt": messages[:-1], "completion": messages[-1:]})
    return Dataset.from_list(rows)


def unsloth_lora(folder: Path, max_len: int, **load):
    """The peer's model as every (c)/(b) run sets it up: bf16 weights, LoRA r16 on the same targets,
    Unsloth's own checkpointing. Extra keywords go to FastLanguageModel.from_pretrained."""
    import torch
    from unsloth import FastLanguageModel
    model, tokenizer = FastLanguageModel.from_pretrained(model_name=str(folder), max_seq_length=max_len,
                                                         dtype=torch.bfloat16, load_in_4bit=False, **load)
    model = FastLanguageModel.get_peft_model(model, r=16, lora_alpha=16, lora_dropout=0, bias="none",
                                             target_modules=TARGETS, use_gradient_checkpointing="unsloth",
                                             random_state=0)
    return model, tokenizer


def trl_lora(folder: Path, max_len: int, device: str = "cuda"):
    """(d): the same bf16 weights and LoRA r16 targets on plain transformers + PEFT (TRL checkpoints);
    on a CPU (smoke runs) fp32."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer
    cuda = device == "cuda"
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.bfloat16 if cuda else torch.float32,
                                                 device_map={"": 0 if cuda else "cpu"}, attn_implementation="sdpa")
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=16, lora_dropout=0.0, bias="none",
                                             target_modules=TARGETS, task_type="CAUSAL_LM"))
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    return model, tokenizer


def train_timed(trainer, on_step=None) -> tuple[list[float], float]:
    """trainer.train() with the peak memory reset first; the end time of every optimizer step and the start.
    `on_step(ends)` after each step lets a caller report as it goes (a run cut off by a time limit)."""
    import torch
    from transformers import TrainerCallback
    ends: list[float] = []

    class StepTimes(TrainerCallback):
        def on_step_end(self, *_, **__):
            ends.append(time.time())
            if on_step:
                on_step(ends)

    trainer.add_callback(StepTimes())
    if torch.cuda.is_available():   # CPU smoke runs: no device to sync
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    began = time.time()
    trainer.train()
    return ends, began


def train(args) -> dict:
    import torch
    from trl import SFTConfig, SFTTrainer

    folder = args.dir / args.shape
    model, tokenizer = unsloth_lora(folder, args.max_len) if args.stack == "unsloth" else \
        trl_lora(folder, args.max_len, args.device)
    config = SFTConfig(output_dir=str(args.dir / f"unsloth-{args.shape}"), max_length=args.max_len, packing=True,
                       per_device_train_batch_size=args.rows, gradient_accumulation_steps=1,
                       max_steps=args.steps, learning_rate=1e-4, warmup_steps=0, lr_scheduler_type="cosine",
                       logging_steps=1, save_strategy="no", report_to="none", optim="adamw_torch", seed=0,
                       **_device_config(args))
    if args.method != "sft":
        config, trainer = preference_trainer(args, model, tokenizer)
    else:
        trainer = SFTTrainer(model=model, processing_class=tokenizer, train_dataset=dataset(args.dir / "data.jsonl"),
                             args=config)
    counter = CountingCollator(trainer.data_collator)
    trainer.data_collator = counter
    sampler = UtilSampler()
    ends, began = train_timed(trainer)
    sampler.stop()
    peak = torch.cuda.max_memory_allocated() / 2 ** 30 if args.device == "cuda" else None
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    steps = [{"time": t, "tokens": counter.counts[i] if i < len(counter.counts) else 0,
              "loss": losses[min(i, len(losses) - 1)] if losses else None, "peak_gib": peak}
             for i, t in enumerate(ends)]
    result = {"stack": stack_label(args), "wall_s": round(time.time() - began, 1), **window_stats(steps, args.warmup),
              "config": {"packing": getattr(config, "packing", None),
                         "packing_strategy": getattr(config, "packing_strategy", None), "rows": args.rows,
                         "max_length": args.max_len, "optim": "adamw_torch",
                         "gradient_checkpointing": "unsloth" if args.stack == "unsloth" else "trl (non-reentrant)"}}
    if args.method != "sft":
        stats = json.loads(unit_files(args.dir, args.method)[1].read_text())
        seconds = max(result["window_end"] - result["window_start"], 1e-9)
        # exactly --pairs pairs a step (TRL's preference collator does not pack): pairs x mean pair
        # tokens, whatever its collator's keys count (bench_job.pair_rates gives the same for Fusetune)
        rate = result["measured_steps"] * args.pairs * stats["mean"] / seconds
        if args.method == "kto":
            # KTO: bench_job.pair_rates' own conversion, real tokens/s x mean / mean_forward (= 1/2): the
            # collator counted attention_mask + KL_attention_mask, each example and its KL sequence, as
            # Fusetune's step counts a KTO unit's two sequences (jobs/data/pairs.py collate_units); so both
            # sides count an example's prompt + completion once. Counted, not pairs x mean: KTO's sequential
            # batches see the file's first examples, not a sample of all of them.
            rate = result["real_tokens_per_s"] * stats["mean"] / stats["mean_forward"]
        result.update(stack=stack_label(args, args.method), method=args.method, pairs_per_step=args.pairs,
                      pair_tokens_per_s=round(rate, 1), first_loss=losses[0] if losses else None,
                      trl_options=args.trl_option)
        result["config"].update(trainer=type(trainer).__name__, beta=config.beta, pairs=args.pairs,
                                **_kto_fields(args, config))
    result["gpu_util_mean"] = sampler.mean(result["window_start"], result["window_end"])
    return result


def _options(config_class, pairs: list[str]) -> dict:
    """--trl-option key=value pairs, typed from the config's own field defaults; unknown keys raise."""
    import dataclasses
    fields = {f.name: f for f in dataclasses.fields(config_class)}
    out = {}
    for pair in pairs:
        key, _, raw = pair.partition("=")
        if key not in fields:
            raise ValueError(f"{config_class.__name__} has no field {key!r} in this TRL")
        default = fields[key].default
        out[key] = raw.lower() in ("1", "true", "yes") if isinstance(default, bool) else type(default)(raw) \
            if isinstance(default, (int, float)) else raw
    return out


def _device_config(args) -> dict:
    """bf16 and 4 tokenizing processes on the GPU; fp32 and none on a CPU smoke run."""
    cuda = args.device == "cuda"
    return {"bf16": cuda, "dataset_num_proc": 4 if cuda else None}


def _kto_fields(args, config) -> dict:
    """What a KTO row ran with beyond DPO's fields (empty for the other methods)."""
    if args.method != "kto":
        return {}
    return {"padding_free": None, "train_sampling_strategy": config.train_sampling_strategy,
            "precompute_ref_log_probs": config.precompute_ref_log_probs, "loss_type": config.loss_type}


def _plain_trl(args) -> dict:
    """(d) checkpoints through TRL/transformers (Unsloth's runs use its own, set on the model)."""
    if args.stack == "unsloth":
        return {}
    return {"gradient_checkpointing": True, "gradient_checkpointing_kwargs": {"use_reentrant": False}}


def stack_label(args, method: str | None = None) -> str:
    """The row's `stack`: "unsloth+trl [method] (c)", or "trl[+liger] [method] (d)"."""
    if args.stack == "unsloth":
        name, letter = "unsloth+trl", "c"
    else:
        liger = any(o.lower() in ("use_liger_kernel=true", "use_liger_kernel=1") for o in args.trl_option)
        name, letter = ("trl+liger" if liger else "trl"), "d"
    return f"{name} {method} ({letter})" if method else f"{name} ({letter})"


def preference_trainer(args, model, tokenizer):
    """(config, trainer): TRL's DPOTrainer, ORPOTrainer (pairs.jsonl, --pairs pairs a step) or KTOTrainer
    (kto.jsonl, --pairs examples a step)."""
    from datasets import Dataset
    rows = [json.loads(line) for line in unit_files(args.dir, args.method)[0].read_text().splitlines()]
    if args.method == "dpo":
        from trl import DPOConfig as Config, DPOTrainer as Trainer
    elif args.method == "kto":
        Config, Trainer = kto_config()
    else:
        try:
            from trl.experimental.orpo import ORPOConfig as Config, ORPOTrainer as Trainer
        except ImportError:   # TRL before the move to experimental
            from trl import ORPOConfig as Config, ORPOTrainer as Trainer
    config = Config(output_dir=str(args.dir / f"unsloth-{args.shape}-{args.method}"), max_length=args.max_len,
                    per_device_train_batch_size=args.pairs, gradient_accumulation_steps=1, max_steps=args.steps,
                    learning_rate=1e-4, warmup_steps=0, lr_scheduler_type="cosine", logging_steps=1,
                    save_strategy="no", report_to="none", optim="adamw_torch", seed=0, beta=0.1,
                    **_device_config(args), **_plain_trl(args), **_options(Config, args.trl_option))
    extra = {"ref_model": None} if args.method in ("dpo", "kto") else {}
    return config, Trainer(model=model, args=config, train_dataset=Dataset.from_list(rows),
                           processing_class=tokenizer, **extra)


def kto_config():
    """(KTOConfig, KTOTrainer) of this TRL. TRL 1.15 has them in its stable API (`trl.experimental.kto` is a
    deprecated alias there: trl/experimental/kto/__init__.py); the fallback serves TRL versions that kept
    them under experimental only. The peer's best configuration for speed, per TRL 1.15's source:
    - no `padding_free` and no packing: KTOConfig (trl/trainer/kto_config.py) has neither field and
      DataCollatorForUnpairedPreference (trl/trainer/kto_trainer.py) pads every batch to its longest
      sequence, so the peer runs padded (its only mode), as DPO's does since TRL 1.15 ignores padding_free;
    - gradient checkpointing: Unsloth's own for (c), TRL's non-reentrant one for (d) (`_plain_trl`;
      KTOConfig's default is on too), as for DPO/ORPO;
    - loss_type "kto" with the KL term (sequential batches, train_sampling_strategy's default), as
      Fusetune's KTO computes it; precompute_ref_log_probs off on both sides (its pass over the whole
      file would fall before the first step, out of the measured window); activation_offloading off
      (it trades speed for memory; --trl-option can set any of these)."""
    try:
        from trl import KTOConfig, KTOTrainer
    except ImportError:
        from trl.experimental.kto import KTOConfig, KTOTrainer
    return KTOConfig, KTOTrainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="llama-3.2-1b")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/bench_job"))
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--max-len", type=int, default=4096)
    parser.add_argument("--method", default="sft", choices=["sft", "dpo", "orpo", "kto"])
    parser.add_argument("--pairs", type=int, default=8, help="--method dpo|orpo: pairs a step; kto: examples")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: --stack trl smoke runs")
    parser.add_argument("--stack", choices=["unsloth", "trl"], default="unsloth",
                        help="unsloth: Unsloth + TRL (c); trl: TRL on transformers + PEFT (d), with Liger where "
                             "--trl-option use_liger_kernel=true")
    parser.add_argument("--trl-option", action="append", default=[], help="key=value of the TRL config")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "job.jsonl")
    args = parser.parse_args()
    if args.device == "cpu":   # TRL's log-prob kernel is Triton's (trl/kernels/chunked_logprob.py): interpreted
        os.environ.setdefault("TRITON_INTERPRET", "1")   # read when TRL first imports it, inside train()
    result = {**versions(), "shape": args.shape, "method": args.method, "rows": args.rows, "max_len": args.max_len, "steps": args.steps,
              "warmup": args.warmup, "dataset": json.loads((args.dir / "dataset_stats.json").read_text())}
    try:
        result.update(train(args))
    except Exception as exc:  # recorded as a result line: the other rows of the run still count
        result.update(stack=stack_label(args), error=f"{type(exc).__name__}: {exc}"[:1500])
    write(result, args.out)


if __name__ == "__main__":
    main()
