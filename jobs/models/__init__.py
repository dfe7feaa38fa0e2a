"""Models: resolve a reference (hub id, folder, GGUF, the built-in model), load the tokenizer and the base
(bf16, NF4 for QLoRA), add LoRA, and the fit check (the predicted peak memory of a job; on a CPU, its time from one measured step).

May import jobs.spec, jobs.io and kernels (for the checkpointing plan the fit check predicts)."""
