#!/usr/bin/env bash
# One device call per shape for issue 7's real-job benchmark (bench/bench_job.py), each < 9 minutes:
#   bash bench/device_job.sh 1b     # varlen check, Llama-3.2-1B shape: (a) (b) (c), bench_lora at the
#                                   # same tokens per step, a profile of (a), then (a) with auto checkpointing
#   bash bench/device_job.sh 8b     # Llama-3.1-8B shape: (a) (b) (c), bench_lora at the same tokens per step
#   bash bench/device_job.sh jobgraph  # jobs.train, packed, no recompute: the captured step vs eager,
#                                   # 1B bf16 and 8B FP8 (jobs/train/graph_steps.py)
#   bash bench/device_job.sh fp8job # jobs.train, 8B FP8, offload and no recompute: the default (FP8 codes kept
#                                   # for dA, "savex") vs the old full input ("fullx"), and Unsloth's job
#   bash bench/device_job.sh fp8pair [SHAPE]  # jobs.train, bf16 vs FP8 (the defaults) in one call, offload and
#                                   # no recompute, 8B (default) or llama-3.2-1b: the pairs the studio's FP8 help
#                                   # text reads (studio/fp8_effect.py)
#   bash bench/device_job.sh smoke  # CPU: the same scripts on a tiny model (run here, not on the GPU)
# Needs (carried): .carry/tok (tokenizer, `python bench/job_data.py` docs) and .whl/site (Unsloth, TRL,
# datasets... unzipped wheels; see bench/NOTES.md "Real jobs"). Results: $OUT/job.jsonl (one line a run),
# $OUT/check_varlen.jsonl, $OUT/lora.jsonl, $OUT/profile_job_1b.json, $OUT/job.log (all stderr/stdout).
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
SITE=$PWD/.whl/site   # only (c) sees the carried peers: our runs use the machine's own packages
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
what=${1:-1b}
DIR=/tmp/bench_job; mkdir -p "$DIR"
LOG="$OUT/job.log"
START=$(date +%s)
left() { echo $(( 530 - ($(date +%s) - START) )); }      # seconds left of this call's budget
step() {  # step NAME TIMEOUT CMD...: run unless the budget is spent; output to the log, short lines to stdout
  local name=$1 limit=$2; shift 2
  if [ "$(left)" -lt 40 ]; then echo "SKIPPED (time budget): $name" | tee -a "$LOG"; return; fi
  [ "$limit" -gt "$(left)" ] && limit=$(left)
  echo "== $name (limit ${limit}s, t=$(( $(date +%s) - START ))s)" | tee -a "$LOG"
  BENCH_STEP_LIMIT=$limit timeout "$limit" "$@" >>"$LOG" 2>&1; echo "   exit $? (t=$(( $(date +%s) - START ))s)" | tee -a "$LOG"
}
# commands, not shell functions: `timeout` runs programs only
job="python3 bench/bench_job.py run --dir $DIR --out $OUT/job.jsonl"
unsloth_job="env PYTHONPATH=$SITE:${PYTHONPATH:-} python3 bench/bench_job_unsloth.py --dir $DIR --out $OUT/job.jsonl"

if [ "$what" = smoke ]; then
  python3 bench/bench_job.py smoke --dir /tmp/bench_job_smoke --out "$OUT/job.jsonl"; exit $?
fi
python3 -c 'import torch, triton, transformers, peft; print("torch", torch.__version__, "triton", triton.__version__,
  "transformers", transformers.__version__, "peft", peft.__version__, torch.cuda.get_device_name(0))' | tee -a "$LOG"

if [ "$what" = jobgraph ]; then   # jobs.train with the captured step (jobs/train/graph_steps.py) vs FUSETUNE_CUDA_GRAPH=0
  step gpu_check_graph 60 python3 bench/gpu_check.py --only step_graph --out "$OUT/gpu_check.jsonl"
  S=llama-3.2-1b
  step prepare 120 python3 bench/bench_job.py prepare --shape $S --dir "$DIR"
  step a_graph 110 env FUSETUNE_CUDA_GRAPH=1 $job --stack fusetune --shape $S --rows 4 --checkpointing off --steps 25
  step a_eager 110 env FUSETUNE_CUDA_GRAPH=0 $job --stack fusetune --shape $S --rows 4 --checkpointing off --steps 25
  S=llama-3.1-8b
  step prepare8 120 python3 bench/bench_job.py prepare --shape $S --dir "$DIR"
  step a8_graph 130 env FUSETUNE_CUDA_GRAPH=1 $job --stack fusetune --shape $S --rows 2 --checkpointing off --base-precision fp8 --steps 20
  step a8_eager 130 env FUSETUNE_CUDA_GRAPH=0 $job --stack fusetune --shape $S --rows 2 --checkpointing off --base-precision fp8 --steps 20
  tail -c 3000 "$LOG"; exit 0
fi

if [ "$what" = fp8job ]; then   # the savex default (kernels/ops/fp8_linear.SAVE_INPUT_FP8) on the product path
  S=llama-3.1-8b; ROWS=2
  step prepare8 150 python3 bench/bench_job.py prepare --shape $S --dir "$DIR" --examples 2000
  for x in savex fullx; do
    sw=""; [ $x = fullx ] && sw="--switch fullx"
    step "off_$x" 110 $job --stack fusetune --shape $S --rows $ROWS --checkpointing off --base-precision fp8 --steps 20 $sw
    step "offload_$x" 120 $job --stack fusetune --shape $S --rows $ROWS --checkpointing offload --base-precision fp8 --steps 25 $sw
  done
  step c_unsloth 150 $unsloth_job --shape $S --rows $ROWS --steps 25
fi
if [ "$what" = fp8pair ]; then  # the toggle's effect with both precisions measured on the same host
  S=${2:-llama-3.1-8b}; ROWS=2; [ "$S" = llama-3.2-1b ] && ROWS=4
  step prepare 150 python3 bench/bench_job.py prepare --shape $S --dir "$DIR" --examples 2000
  for ckpt in offload off; do
    for p in bf16 fp8; do
      step "${ckpt}_$p" 120 $job --stack fusetune --shape $S --rows $ROWS --checkpointing $ckpt --base-precision $p --steps 25
    done
  done
fi
if [ "$what" = 1b ]; then
  S=llama-3.2-1b; ROWS=4          # 4 x 4096 = 16,384 tokens a step
  step check_varlen 90 python3 bench/check_varlen.py --out "$OUT/check_varlen.jsonl"
  step prepare 120 python3 bench/bench_job.py prepare --shape $S --dir "$DIR"
  step a_offload 150 $job --stack fusetune --shape $S --rows $ROWS --checkpointing offload
  step c_unsloth 170 $unsloth_job --shape $S --rows $ROWS
  step b_pytorch 150 $job --stack torch --shape $S --rows $ROWS
  step bench_lora 60 python3 bench/bench_lora.py --shape $S --bs $ROWS --seq 4096 --stack fusetune \
    --checkpointing offload --out "$OUT/lora.jsonl"
  python3 - "$DIR" $S $ROWS <<'EOF'
import sys, yaml
d, s, rows = sys.argv[1], sys.argv[2], int(sys.argv[3])
config = yaml.safe_load(open(f"{d}/{s}-fusetune-offload-bf16.yaml"))
config.update(max_steps=8, gradient_checkpointing="offload")
yaml.safe_dump(config, open(f"{d}/profile.yaml", "w"))
EOF
  step profile_a 90 python3 bench/profile_job.py "$DIR/profile.yaml" --out "$OUT/profile_job_1b.json"
  step a_auto 120 $job --stack fusetune --shape $S --rows $ROWS --checkpointing auto
fi
if [ "$what" = rerun ]; then     # (b) on 1B with a limit that fits it, then (a) on 8B with FP8 base weights
  S=llama-3.2-1b; ROWS=4
  step prepare_1b 120 python3 bench/bench_job.py prepare --shape $S --dir "$DIR"
  step b_pytorch 260 $job --stack torch --shape $S --rows $ROWS --steps 20 --warmup 3
  S=llama-3.1-8b; ROWS=2
  step prepare_8b 150 python3 bench/bench_job.py prepare --shape $S --dir "$DIR" --examples 2000
  step a_fp8_offload 140 $job --stack fusetune --shape $S --rows $ROWS --checkpointing offload --steps 25 \
    --base-precision fp8
fi
if [ "$what" = 8b ]; then
  S=llama-3.1-8b; ROWS=2          # 2 x 4096 = 8,192 tokens a step
  step prepare 150 python3 bench/bench_job.py prepare --shape $S --dir "$DIR" --examples 2000
  step a_offload 140 $job --stack fusetune --shape $S --rows $ROWS --checkpointing offload --steps 25
  step c_unsloth 170 $unsloth_job --shape $S --rows $ROWS --steps 25
  step b_pytorch 140 $job --stack torch --shape $S --rows $ROWS --steps 25
  step bench_lora 70 python3 bench/bench_lora.py --shape $S --bs $ROWS --seq 4096 --stack fusetune \
    --checkpointing offload --out "$OUT/lora.jsonl"
fi
echo "== summary"; grep -h '^{' "$OUT/job.jsonl" 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(r.get("shape"), r.get("stack"), r.get("config", {}).get("gradient_checkpointing"), "tok/s", r.get("real_tokens_per_s"),
          "util", r.get("gpu_util_mean"), "peak GiB", r.get("peak_gib"), "loss", r.get("final_loss"), (r.get("error") or "")[:200])'
