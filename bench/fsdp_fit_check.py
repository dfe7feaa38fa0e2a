"""The sharded fit check against a rank's measured peak, on ONE GPU (issue 37): each world size N runs the
real trainer (jobs.train.loop.Trainer, `sharding: fsdp`) as rank 0 of N in a process of its own, over
PyTorch's fake process group (torch.testing._internal.distributed.fake_pg, the one its FSDP memory
tracker tests use): every collective returns at once without moving data, but FSDP2 allocates exactly
what a real rank allocates (its 1/N shard at rest, a layer's all-gather buffer, the reduce-scatter's
input and output), so `max_memory_allocated` after a few steps is rank 0's peak of an N-GPU job. The
numbers the steps compute are not the job's (the other ranks' shards are whatever the buffers held):
this measures memory, never loss or speed. NCCL refuses two ranks on one GPU, and `sharding: fsdp`
with one process trains unsharded, which is why this exists.

    python bench/fsdp_fit_check.py --model DIR --data CHAT.jsonl --world 2 4 [--rows 2] [--steps 4]
        [--checkpointing offload] [--qlora] [--budget GIB] [--out results.jsonl]

--budget sets max_gpu_memory_gb (checkpointing auto): the plan each rank trains by is then sized for what
one process holds (jobs/models/fit_rank.py), and the row says whether the peak stayed within the budget
(+3 % allocator slack, issue 38's bound).

One JSON line per world size (1: the same job unsharded, a control): the fit check's per-GPU prediction
(`fit.estimate_peak` of one process, what the job logs as "memory estimate") beside the measured peak (GiB allocated),
their ratio, the plan's parts and the kernel report. On the CPU the same path runs and records no memory
(tests/jobs/train/test_fsdp_fit_bench.py)."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def fake_ranks(world: int) -> None:
    """This process becomes rank 0 of `world` over the fake group, as torchrun's environment says;
    the loop's host-side group (a gloo group beside NCCL) is the same fake group."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    os.environ.update(RANK="0", WORLD_SIZE=str(world), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                      TORCHELASTIC_RUN_ID="fsdp-fit-check")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    dist.new_group = lambda *args, **kwargs: dist.group.WORLD


def one_world(args) -> dict:
    """Rank 0 of an N-rank sharded SFT job: prepare, a few steps, the peak beside the prediction."""
    import torch

    world = args.world[0]
    if world > 1:   # world 1: the same job unsharded, the control beside the sharded rows
        fake_ranks(world)
    from jobs.io.events import EventWriter
    from jobs.spec import JobSpec
    from jobs.train import distributed
    from jobs.train.loader import Prefetcher
    from jobs.train.loop import Trainer

    cuda = torch.cuda.is_available()
    out = Path(tempfile.mkdtemp(prefix="fsdp-fit-"))
    spec = JobSpec(model=str(args.model), dataset=str(args.data), dataset_format="messages", output_dir=str(out),
                   lora_r=16, lora_alpha=16, lora_dropout=0.0, target_modules=TARGETS, max_steps=args.steps + 2,
                   save_steps=0, max_seq_length=args.max_len, batch_size=args.rows, packing="on",
                   gradient_checkpointing="auto" if args.budget else args.checkpointing, fused_kernels=cuda,
                   max_gpu_memory_gb=args.budget,
                   sharding="fsdp" if world > 1 else "none",
                   dtype="bf16" if cuda else "fp32", load_in_4bit=args.qlora, seed=0)
    dist = distributed.init()
    trainer = Trainer(spec, out, EventWriter(str(out)), log=lambda line: None, dist=dist)
    trainer.prepare()
    assert trainer.sharded == (world > 1), "the job did not shard"
    stream = Prefetcher(trainer.plan, 0, pin=cuda)
    trainer.train_step(stream).read()   # the first step: lazy inits, Triton compiles, AdamW's state
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    began = time.perf_counter()
    for _ in range(args.steps):
        trainer.train_step(stream).read()
    stream.close()
    estimate = trainer.fit_estimate
    row = {"check": "fsdp_fit_one_gpu", "world": world, "model": args.model.name, "rows": args.rows,
           "max_len": args.max_len, "checkpointing": args.checkpointing, "qlora": args.qlora, "steps": args.steps,
           "predicted_gib": round(estimate.allocated_gb, 3) if estimate else None,
           "parts_gib": estimate.breakdown() if estimate else None,
           "plan": estimate.checkpointing if estimate else None, "wall_s": round(time.perf_counter() - began, 2),
           "sharded": trainer.sharded, "patch_report": trainer.patch_report, "budget_gib": args.budget or None}
    if cuda:
        peak = torch.cuda.max_memory_allocated() / 2 ** 30
        row.update(measured_gib=round(peak, 3), device=torch.cuda.get_device_name(0),
                   measured_over_predicted=round(peak / estimate.allocated_gb, 3) if estimate else None)
        if args.budget:
            row["within_budget"] = peak <= args.budget * 1.03
    return row


def versions() -> dict:
    import torch
    import transformers
    return {"torch": torch.__version__, "transformers": transformers.__version__}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True, help="chat rows (messages)")
    parser.add_argument("--world", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--rows", type=int, default=2, help="packed rows a step on each rank")
    parser.add_argument("--max-len", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=4, help="measured steps after the first")
    parser.add_argument("--checkpointing", default="offload")
    parser.add_argument("--qlora", action="store_true")
    parser.add_argument("--budget", type=float, default=0.0, help="max_gpu_memory_gb of each rank (0: none)")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)   # the child of one world size
    parser.add_argument("--timeout", type=float, default=400)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_world(args)), flush=True)
        return 0
    failed = 0
    for world in args.world:   # a fresh process each: one CUDA context and one fake group per world size
        argv = [sys.executable, __file__, "--one", "--world", str(world), *_passed(args)]
        try:
            proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout)
            lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
            row = json.loads(lines[-1]) if proc.returncode == 0 and lines else {
                "check": "fsdp_fit_one_gpu", "world": world, "error": (proc.stderr or proc.stdout)[-1500:]}
        except subprocess.TimeoutExpired:
            row = {"check": "fsdp_fit_one_gpu", "world": world, "error": f"timed out after {args.timeout:g} s"}
        failed += "error" in row
        row.update(versions(), time=time.strftime("%Y-%m-%dT%H:%M:%S"))
        print(json.dumps(row), flush=True)
        if args.out:
            with args.out.open("a", encoding="utf-8") as out:
                out.write(json.dumps(row) + "\n")
    return 1 if failed else 0


def _passed(args) -> list[str]:
    argv = ["--model", str(args.model), "--data", str(args.data), "--rows", str(args.rows), "--max-len",
            str(args.max_len), "--steps", str(args.steps), "--checkpointing", args.checkpointing]
    return argv + (["--qlora"] if args.qlora else []) + (["--budget", str(args.budget)] if args.budget else [])


if __name__ == "__main__":
    sys.exit(main())
