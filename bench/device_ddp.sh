#!/usr/bin/env bash
# One device call on kind nvidia-h200-x2 (issue 10's benchmark), under 8 minutes: `python -m jobs.train`
# on 1 GPU and on 2 GPUs (DDP through torchrun), Llama-3.1-8B shape (random bf16 weights built on the
# GPU), bs 2x2048 per GPU, fused, checkpointing auto, the same global batch (1 GPU: batch 2 x
# accumulation 2); tokens/s and every step's loss compared; then, if time is left, a short 2-GPU run
# with checkpointing offload whose losses must match too.
# Nothing to carry: the tokenizer is the tiny test one (tests/tiny.py; its ids index the first rows of
# the 128,256-row embedding, which costs the same) and only the machine's own torch/triton/
# transformers/peft run (no .whl/site, no .carry/tok, unlike bench/device_job.sh).
# Usage (on the device, from the repo root): bash bench/device_ddp.sh      (CPU check: ... smoke)
# Results: $OUT/ddp.jsonl (a JSON line a run + comparison rows, bench/results format: GPU, versions,
# config, tokens/s, peak GB), $OUT/ddp.log (the jobs' logs), $OUT/gpus.txt (nvidia-smi before).
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if [ "${1:-}" = smoke ]; then
  exec timeout 600 python3 bench/ddp_bench.py --cpu-smoke --work /tmp/ddp-smoke --out "$OUT/ddp.jsonl" --steps 4
fi
timeout 20 nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv >"$OUT/gpus.txt" 2>&1
timeout 60 python3 -c 'import torch, triton, transformers, peft; from jobs.io.gpus import read_gpus
print("torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__,
      "peft", peft.__version__, "cuda devices", torch.cuda.device_count(), "NVML", [g.label() for g in read_gpus()])' \
  2>&1 | tee -a "$OUT/gpus.txt"
# the script stops starting runs at 430 s and kills a job (its own session: torchrun and the ranks)
# at that deadline; the hard limit leaves time to copy $OUT back
timeout -k 10 465 python3 bench/ddp_bench.py --work /tmp/ddp-bench --out "$OUT/ddp.jsonl" --steps 12 \
  --offload-check --deadline-s 430
code=$?
echo "exit $code"
exit $code
