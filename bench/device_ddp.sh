#!/usr/bin/env bash
# One device call on kind nvidia-h200-x2 (issue 10's benchmark): `python -m jobs.train` on 1 GPU and
# on 2 GPUs (DDP through torchrun), Llama-3.1-8B shape, bs 2x2048 per GPU, fused, checkpointing auto;
# then a short 2-GPU run with checkpointing offload whose losses must match too.
# Usage (on the device, from the repo root): bash bench/device_ddp.sh
# Results: $OUT/ddp.jsonl (one JSON line per run + comparison rows), $OUT/ddp.log (the jobs' logs).
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv >"$OUT/ddp.log" 2>&1
timeout 560 python3 bench/ddp_bench.py --work /tmp/ddp-bench --out "$OUT/ddp.jsonl" --steps 12 \
  --offload-check --deadline-s 540 2>>"$OUT/ddp.log"
echo "exit $?"
