"""Serving finished jobs: an OpenAI-compatible HTTP API (`python -m jobs.serve JOB_DIR ...`) over the
jobs' common base model and each job's LoRA adapter, all on one base in memory (PEFT multi-adapter),
generating on the project's own decode loop (jobs/train/decode.py, GRPO's sampler).

The shape follows the peers' servers: vLLM's and ms-swift's `swift deploy` OpenAI routes (one model id
per LoRA adapter, chosen per request by `model`), Unsloth Studio's served API. Modules: served.py
loads the models, engine.py generates one batch, scheduler.py queues requests into batches,
schema.py and api.py are the HTTP side, cli.py the command line."""
