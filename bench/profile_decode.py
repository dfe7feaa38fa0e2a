"""Where GRPO's sampling time goes: the Trainer of `python -m jobs.train` built in process from a GRPO
job YAML (the job's model, LoRA and engine patches), one micro-batch of prompts x num_generations
decoded by jobs/train/decode.py, timed in parts (prefill, graph capture, replayed decode steps, with
the adapter on and off), then a few eager decode steps under torch.profiler: CUDA time by kernel.

    python bench/profile_decode.py GRPO.yaml --out /tmp/profile_decode.json
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _decoder(trainer, prompts):
    from jobs.train import decode
    from jobs.train.rollout import eos_ids_of, pad_left
    spec, tok = trainer.spec, trainer.tokenizer
    repeated = [p for p in prompts for _ in range(spec.num_generations)]
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    ids, mask = pad_left(repeated, pad_id, trainer.device)
    return decode.StaticDecoder(trainer.model, ids, mask, spec.max_completion_length, spec.temperature,
                                spec.top_p, sorted(eos_ids_of(trainer.model, tok)), pad_id)


def _timed(fn, sync) -> float:
    sync()
    began = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - began


def time_parts(trainer, prompts, steps: int) -> dict:
    """Seconds of prefill and capture, ms per replayed decode step (adapter on, then off)."""
    import torch
    from jobs.train import decode
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    out = {}
    for label, context in (("adapter_on", None), ("adapter_off", trainer.model.disable_adapter)):
        with torch.no_grad(), (context() if context else _null()):
            trainer.model.eval()
            decoder = _decoder(trainer, prompts)
            out[f"{label}_prefill_s"] = round(_timed(decoder.prefill, sync), 4)
            if torch.cuda.is_available():
                graph = [None]
                out[f"{label}_capture_s"] = round(_timed(lambda: graph.__setitem__(0, decode.capture(decoder)), sync), 4)
                replay_s = _timed(lambda: [graph[0].replay() for _ in range(steps)], sync)
                out[f"{label}_replay_ms_per_token_step"] = round(replay_s / steps * 1000, 3)
            eager_s = _timed(lambda: [decoder.decode_step() for _ in range(8)], sync)
            out[f"{label}_eager_ms_per_token_step"] = round(eager_s / 8 * 1000, 3)
            trainer.model.train()
    return out


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def profile_steps(trainer, prompts, steps: int) -> list:
    import torch
    from torch.profiler import ProfilerActivity, profile
    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    with torch.no_grad():
        trainer.model.eval()
        decoder = _decoder(trainer, prompts)
        decoder.prefill()
        for _ in range(2):
            decoder.decode_step()
        sync()
        with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                decoder.decode_step()
            sync()
        trainer.model.train()
    time_of = (lambda e: e.device_time_total) if cuda else (lambda e: e.self_cpu_time_total)
    table = sorted((e for e in prof.key_averages() if time_of(e) > 0), key=lambda e: -time_of(e))
    total = sum(time_of(e) for e in table) / 1000 / steps
    return [("TOTAL", round(total, 3), 0)] + [(e.key[:90], round(time_of(e) / 1000 / steps, 4),
                                               e.count // steps) for e in table[:30]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("--steps", type=int, default=64, help="replayed decode steps timed")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    from jobs.io.events import EventWriter
    from jobs.spec import JobSpec
    from jobs.train.loop import Trainer
    spec = JobSpec.from_yaml(args.config)
    spec.output_dir = tempfile.mkdtemp(prefix="profile-decode-")
    trainer = Trainer(spec, Path(spec.output_dir), EventWriter(spec.output_dir), log=lambda line: None)
    trainer.prepare()
    prompts = [row.input_ids for row in trainer.examples[:spec.batch_size]]
    summary = {"config": str(args.config), "batch": len(prompts) * spec.num_generations,
               "prompt_width": max(len(p) for p in prompts), "completion_len": spec.max_completion_length}
    summary.update(time_parts(trainer, prompts, min(args.steps, spec.max_completion_length - 12)))
    summary["cuda_ms_per_token_step_by_kernel"] = profile_steps(trainer, prompts, 8)
    args.out.write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if not k.startswith("cuda_ms")}))
    for name, ms, count in summary["cuda_ms_per_token_step_by_kernel"][:14]:
        print(f"{ms:9.4f} ms  x{count:<5} {name}")


if __name__ == "__main__":
    main()
