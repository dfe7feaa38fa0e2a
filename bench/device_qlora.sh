#!/usr/bin/env bash
# QLoRA rows of BASELINES.md (issue 4) in one device call: 8B bs2x2048, 8B bs1x16384, a 70B step,
# then the 24 GB long-context sweep (cut by its timeout if it runs long). Results under $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.whl/site:${PYTHONPATH:-} HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
b() { timeout "$1" python3 bench/bench_lora.py --out "$OUT/lora.jsonl" "${@:2}" 2>>"$OUT/qlora.err" | cut -c1-420 ; }
b 150 --shape llama-3.1-8b --bs 2 --seq 2048 --stack fusetune --checkpointing offload --qlora
b 150 --shape llama-3.1-8b --bs 1 --seq 16384 --stack fusetune --checkpointing offload --qlora
b 170 --shape llama-3.1-70b --bs 1 --seq 2048 --stack fusetune --checkpointing offload --qlora --steps 2 --warmup 1
timeout "${LONGCTX_S:-150}" python3 bench/bench_lora.py --shape llama-3.1-8b --bs 1 --stack fusetune \
  --checkpointing offload --qlora --memory-cap-gb 24 --steps 1 --warmup 1 --out "$OUT/longctx.jsonl" \
  --seq-sweep 16384,32768,65536,81920,98304,131072 2>>"$OUT/qlora.err" | cut -c1-300
tail -20 "$OUT/qlora.err"
