#!/usr/bin/env bash
# FP8 base weights (issue 11) in one device call: GPU correctness of the FP8 ops, the BASELINES.md
# rows with bf16 and FP8 bases and Unsloth on the very same weights, a profile, the FP8 GEMM
# microbenchmark and the 200-step quality run. Everything lands in $OUT (at most 8 files come back).
#
#   bash bench/device_fp8.sh [all|part1|part2|smoke]      (carry: .whl = the unzipped peers, see BASELINES.md)
#
# all    every stage in priority order, each with its own timeout; a stage is skipped once the
#        call has run DEADLINE seconds (default 540) so that what ran still comes back
# part1  correctness, 8B rows (ours bf16/FP8 + Unsloth no-GC and GC), profile, microbenchmark
# part2  1B rows (ours + Unsloth), quality run
# gc8b   8B rows with checkpointing (bf16 first: FP8 frees the bf16 weights) and Unsloth beside them
# graph8b  the graph check, then 8B no-recompute rows eager / packed / CUDA graph (bf16, FP8, FP8 fullx)
#        and Unsloth without checkpointing, in one call
# part3  1B rows, the quality run with fast backward accumulation too, then the 8B rows again with
#        Unsloth with and without checkpointing in the same call (to decide FAST_ACCUM_BACKWARD)
# smoke  CPU only (TRITON_INTERPRET=1, tiny shapes): checks every script here without a GPU
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH=$PWD/.whl/site:$PWD:${PYTHONPATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
what=${1:-all}
DEADLINE=${DEADLINE:-540}
HARD=${HARD:-585}         # the device runs a command for at most 600 s
PY=${PY:-python3}        # smoke here: PY=.venv/bin/python
START=$(date +%s)
LOG="$OUT/fp8.log"          # every stage's stderr and progress lines; stdout: the JSON summaries

stage() {  # stage NAME TIMEOUT_S CMD...: runs unless the deadline has passed, never past HARD seconds
  local name=$1 limit=$2; shift 2
  local used=$(( $(date +%s) - START ))
  if [ "$used" -ge "$DEADLINE" ]; then echo "== skip $name (deadline: ${used}s used)" | tee -a "$LOG"; return; fi
  if [ $(( used + limit )) -gt "$HARD" ]; then limit=$(( HARD - used )); fi
  echo "== $name (at ${used}s, limit ${limit}s)" | tee -a "$LOG"
  timeout "$limit" "$@" 2>>"$LOG" | cut -c1-600
  echo "   rc=${PIPESTATUS[0]} after $(( $(date +%s) - START ))s" | tee -a "$LOG"
}

rows_8b() {
  stage "ours 8B bf16+fp8" 330 "$PY" bench/bench_fp8.py --shape llama-3.1-8b --bs 2 --seq 2048 \
    --save-model /tmp/m8b --variants "${VARIANTS_8B:-bf16:off,bf16:offload,fp8:off,fp8+fullx:off,fp8+fastbwd:off,fp8:offload,fp8:budget=16.6}" \
    --profile-variant fp8:off --profile-out "$OUT/profile_fp8_8b.json" --out "$OUT/lora.jsonl"
  stage "unsloth 8B no GC" 170 "$PY" bench/unsloth_rows.py --model-dir /tmp/m8b --shape llama-3.1-8b \
    --bs 2 --gc off --out "$OUT/lora.jsonl"
  [ "${UNSLOTH_GC:-1}" = 1 ] && stage "unsloth 8B GC" 170 "$PY" bench/unsloth_rows.py --model-dir /tmp/m8b \
    --shape llama-3.1-8b --bs 2 --gc unsloth --out "$OUT/lora.jsonl"
  rm -rf /tmp/m8b
}

rows_1b() {
  stage "ours 1B bf16+fp8" 200 "$PY" bench/bench_fp8.py --shape llama-3.2-1b --bs 4 --seq 2048 \
    --save-model /tmp/m1b --variants bf16:offload,bf16:off,fp8:offload,fp8:off,fp8:budget=3.6 \
    --out "$OUT/lora.jsonl"
  stage "unsloth 1B GC" 150 "$PY" bench/unsloth_rows.py --model-dir /tmp/m1b --shape llama-3.2-1b \
    --bs 4 --gc unsloth --out "$OUT/lora.jsonl"
}

check() {
  stage "gpu_check fp8" 150 "$PY" bench/gpu_check.py --only fp8 --out "$OUT/gpu_check.jsonl"
}

micro() {
  stage "fp8 microbenchmark" 120 "$PY" bench/fp8_microbench.py --out "$OUT/fp8_microbench.jsonl"
}

quality() {
  stage "quality 1B 200 steps" "${QUALITY_S:-200}" "$PY" bench/fp8_quality.py \
    --variants "${QUALITY_VARIANTS:-bf16,fp8,fp8+fullx}" --out "$OUT/fp8_quality.jsonl"
}

case "$what" in
  all)   check; rows_8b; rows_1b; quality; micro ;;
  part1) check; rows_8b; micro ;;
  part2) rows_1b; quality ;;
  part3) rows_1b; QUALITY_VARIANTS=bf16,fp8,fp8+fastbwd quality
         VARIANTS_8B=bf16:off,bf16:offload,fp8:off,fp8+fastbwd:off,fp8:offload,fp8:budget=16.6 rows_8b ;;
  gc8b)  VARIANTS_8B=bf16:offload,fp8:offload,fp8:budget=16.6 rows_8b ;;   # 8B with checkpointing + Unsloth
  graph8b)   # the step captured as one CUDA graph (kernels/step_graph.py) beside eager and Unsloth (no GC)
         stage "gpu_check step_graph" 120 "$PY" bench/gpu_check.py --only step_graph --out "$OUT/gpu_check.jsonl"
         UNSLOTH_GC=0 VARIANTS_8B=${VARIANTS_8B:-bf16:off,bf16+graph:off,fp8:off,fp8+packed:off,fp8+graph:off,fp8+graph+fullx:off} \
           rows_8b ;;
  smoke)
    export TRITON_INTERPRET=1; DEADLINE=100000; HARD=100000
    stage "gpu_check fp8 (cpu)" 900 "$PY" bench/gpu_check.py --small --device cpu --only fp8 --out "$OUT/gpu_check.jsonl"
    stage "microbenchmark (cpu)" 900 "$PY" bench/fp8_microbench.py --smoke --out "$OUT/fp8_microbench.jsonl"
    stage "quality (cpu)" 900 "$PY" bench/fp8_quality.py --smoke --dump-data "$OUT/fp8_quality_data.jsonl" \
      --out "$OUT/fp8_quality.jsonl" ;;
  *) echo "usage: $0 [all|part1|part2|part3|gc8b|graph8b|smoke]"; exit 2 ;;
esac
tail -c 4000 "$LOG"
