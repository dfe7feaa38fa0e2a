"""Serving finished jobs: an OpenAI-compatible HTTP API (`python -m jobs.serve JOB_DIR ...`) over the
jobs' common base model and each job's LoRA adapter, all on one base in memory (PEFT multi-adapter),
generating with continuous batching (requests join and leave a running batch between decode steps;
on the GPU inside GRPO's CUDA-graph decode loop, jobs/train/decode.py).

The shape follows the peers' servers: vLLM's and ms-swift's `swift deploy` OpenAI routes (one model id
per LoRA adapter, chosen per request by `model`), Unsloth Studio's served API. Modules: served.py
loads the models, engine.py opens batches, slots.py (GPU) and batch.py (CPU) hold their caches,
scheduler.py queues requests and admits them into the running batch,
schema.py and api.py are the HTTP side, cli.py the command line."""
