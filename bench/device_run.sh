#!/usr/bin/env bash
# One device call: GPU op check, then the BASELINES.md rows for our engine, then a profile.
# Usage (on the device, from the repo root): bash bench/device_run.sh [quick|rows|experiments|rows+experiments|qlora|all]
# Results go to $OUT (copied into bench/results/ afterwards).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.whl/site:${PYTHONPATH:-} HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
what=${1:-all}
# all stderr in one log (at most 8 files come back from a device call); stdout: one JSON line per row
b() { echo "== $*" >>"$OUT/rows.err"; timeout 240 python3 bench/bench_lora.py --out "$OUT/lora.jsonl" "$@" 2>>"$OUT/rows.err" | cut -c1-400 ; }
if [ "$what" = quick ] || [ "$what" = all ]; then
  timeout 300 python3 bench/gpu_check.py --out "$OUT/gpu_check.jsonl" 2>"$OUT/gpu_check.err" | cut -c1-300
fi
if [ "$what" = rows ] || [ "$what" = rows+experiments ] || [ "$what" = all ]; then
  b --shape llama-3.1-8b --bs 2 --seq 2048 --stack fusetune --checkpointing on
  b --shape llama-3.1-8b --bs 2 --seq 2048 --stack fusetune --checkpointing off
  b --shape llama-3.1-8b --bs 2 --seq 2048 --stack fusetune --checkpointing auto
  b --shape llama-3.2-1b --bs 4 --seq 2048 --stack fusetune --checkpointing on
  b --shape qwen2.5-7b --bs 2 --seq 2048 --stack fusetune --checkpointing on
  b --shape smollm2-135m --bs 8 --seq 2048 --stack fusetune --checkpointing on
  b --shape gemma-2-2b --bs 2 --seq 2048 --stack fusetune --checkpointing on
  # GC on with the layer inputs in pinned CPU memory (what Unsloth's "unsloth" checkpointing does)
  b --shape llama-3.1-8b --bs 2 --seq 2048 --stack fusetune --checkpointing offload
  b --shape llama-3.2-1b --bs 4 --seq 2048 --stack fusetune --checkpointing offload
  b --shape qwen2.5-7b --bs 2 --seq 2048 --stack fusetune --checkpointing offload
  timeout 200 python3 bench/profile_step.py --shape llama-3.1-8b --stack fusetune --checkpointing on \
    --out "$OUT/profile_fusetune_8b.json" 2>"$OUT/profile.err" | tail -14
fi
if [ "$what" = experiments ] || [ "$what" = rows+experiments ]; then
  # bench-only variants behind the proposals in bench/NOTES.md (not the engine's default path)
  b --shape llama-3.2-1b --bs 4 --seq 2048 --stack fusetune --checkpointing on --lora-dtype bf16
  b --shape llama-3.2-1b --bs 4 --seq 2048 --stack fusetune --checkpointing on --fused-adamw
  timeout 150 python3 bench/profile_step.py --shape llama-3.2-1b --bs 4 --stack fusetune --checkpointing on \
    --out "$OUT/profile_fusetune_1b.json" 2>>"$OUT/rows.err" | head -1
fi
if [ "$what" = qlora ] || [ "$what" = all ]; then
  b --shape llama-3.1-8b --bs 2 --seq 2048 --stack fusetune --checkpointing on --qlora
  b --shape llama-3.1-8b --bs 1 --seq 16384 --stack fusetune --checkpointing on --qlora
fi
if [ "$what" = longctx ]; then
  timeout 500 python3 bench/bench_lora.py --shape llama-3.1-8b --bs 1 --stack fusetune --checkpointing on --qlora \
    --memory-cap-gb 24 --steps 2 --warmup 1 --out "$OUT/longctx.jsonl" \
    --seq-sweep 4096,8192,12288,16384,24576,32768,49152,65536,81920,98304,131072 2>"$OUT/longctx.err" | cut -c1-300
fi
if [ "$what" = big ]; then
  timeout 500 python3 bench/bench_lora.py --shape llama-3.1-70b --bs 1 --seq 2048 --stack fusetune \
    --checkpointing on --qlora --steps 2 --warmup 1 --out "$OUT/lora.jsonl" 2>"$OUT/big.err" | cut -c1-400
fi
