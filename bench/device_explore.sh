#!/usr/bin/env bash
# One exploratory device call (2026-11-30): CPU offload of the checkpointed layer inputs, the cost of
# the fp32 adapter casts (bf16 adapters as an upper bound), what is alive at the peak, and where the
# 1B row's time goes. Results under $OUT (copied into bench/results/explore/ afterwards).
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
b() { timeout 120 python3 bench/bench_lora.py --out "$OUT/lora_explore.jsonl" "$@" 2>>"$OUT/explore.err" | cut -c1-330 ; }
b --shape llama-3.1-8b --bs 2 --seq 2048 --checkpointing offload
b --shape llama-3.1-8b --bs 2 --seq 2048 --checkpointing offload --lora-dtype bf16
b --shape llama-3.2-1b --bs 4 --seq 2048 --checkpointing offload
timeout 120 python3 bench/memory_peak.py --shape llama-3.1-8b --bs 2 --seq 2048 --checkpointing offload \
  --out "$OUT/memory_peak_8b_offload.json" 2>>"$OUT/explore.err"
timeout 100 python3 bench/memory_peak.py --shape llama-3.2-1b --bs 4 --seq 2048 --checkpointing offload \
  --out "$OUT/memory_peak_1b_offload.json" 2>>"$OUT/explore.err"
timeout 100 python3 bench/profile_step.py --shape llama-3.2-1b --bs 4 --stack fusetune --checkpointing on \
  --out "$OUT/profile_fusetune_1b_gc.json" 2>>"$OUT/explore.err" | tail -8
timeout 120 python3 bench/profile_step.py --shape llama-3.1-8b --bs 2 --stack fusetune --checkpointing offload \
  --out "$OUT/profile_fusetune_8b_offload.json" 2>>"$OUT/explore.err" | tail -8
tail -c 3000 "$OUT/explore.err"
