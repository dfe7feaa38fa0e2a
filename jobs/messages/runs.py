"""(jobs/messages) What a job's settings and its run say: refused config fields, the preflight, the rule for code,
export, how a job ended, its failure lines and rewards, GPU placement, YAML limits, config values."""

MESSAGES: dict[str, str] = {
    # a refused config field (jobs/spec.py, jobs/spec_values.py; the field is named apart, by SpecError.key)
    "model_empty": "is empty: pick the built-in model, a hub id, a folder or a .gguf file",
    "dataset_empty": "is empty: pick builtin:identity or upload a data file",
    "epochs_needed": "must be > 0 when max_steps is 0 (or set max_steps)",
    "bot_name_empty": "is empty: the identity dataset needs a name to teach",
    "text_too_long": "is {length:,} characters long, over the limit of {limit:,}: shorten it",
    "text_control_char": "holds the invisible control character {char} at character {index:,}: it can hide or "
                         "reorder text where the name is shown (the job list, labels); remove it",
    "not_checkpoint": "{path} is not a checkpoint folder",
    "eval_dataset_builtin": "must be a data file; leave it empty to hold out eval_fraction",
    "eval_both": "set either eval_fraction or eval_dataset, not both",
    "keep_best_needs_eval": "needs eval data: set eval_fraction or eval_dataset",
    "processes_gpus": "is {processes} but gpus lists {count} GPU(s); use one process per GPU (or 0 for automatic)",
    "sharding_unsupported": "fsdp does not support {setting} yet; use sharding none (auto leaves such a job unsharded)",
    "value_invalid": "{value!r} is not a valid {kind}",
    "value_not_choice": "{value!r} is not one of {choices}",
    "value_below_min": "{value} is below the minimum {min}",
    "value_above_max": "{value} is above the maximum {max}",
    "unknown_builtin_dataset": "unknown built-in dataset {dataset!r}; the built-in ones are {choices}",
    "dataset_type_unsupported": "{name} has an unsupported type; use one of {choices}",
    "file_missing": "file {path} does not exist",
    "unknown_builtin_model": "unknown built-in model {model!r}; the built-in one is {builtin}",
    "gguf_missing": "GGUF file {path} does not exist",
    "not_hf_folder": "{path} is not a Hugging Face model folder (no config.json)",
    "prompt_data_needs_grpo": "{dataset} is prompt data for method grpo; set method: grpo",
    "reward_file_missing": "{path} is not an existing Python (.py) file",
    "grpo_no_eval": "grpo has no eval loss: leave eval_fraction, eval_dataset and keep_best unset",
    "reward_name_invalid": "{name!r} is not a reward name (letters, digits and _)",
    "reward_weight_invalid": "{part!r}: the weight after ':' must be a number",
    "sft_on_pairs": "sft cannot train on {dataset}: it is a set of preference pairs; pick {methods}, or the dataset "
                    "{identity} for sft",
    "pairs_method_on_answers": "{method} trains on preference pairs, and {identity} has answers, not pairs: pick the "
                               "dataset {concise} or a preference file, or method sft",
    "fp8_with_4bit": "fp8 cannot be combined with load_in_4bit: QLoRA keeps its base weights in 4-bit NF4; set "
                     "base_precision: bf16 for QLoRA, or load_in_4bit: false for FP8",
    "fp8_needs_fused_kernels": "fp8 runs on the fused engine: set fused_kernels: true (or base_precision: bf16)",
    "sft_format_for_pairs": "{format} is an SFT row format; preference rows ({method}) are detected from their "
                            "fields: leave it at auto",
    "beta_positive": "must be > 0 for {method} (TRL's default is 0.1)",
    "orpo_lambda_positive": "must be > 0 (TRL's default is 0.1)",
    "kto_weights_zero": "and kto_undesirable_weight are both 0: nothing would train",
    "no_reference_model": "{method} uses no reference model; set it to false",
    # preflight (jobs/checks/)
    "sft_got_pairs": "{name} has {count:,} preference rows ({rows}) but method is {method}: set method to dpo, "
                     "orpo or simpo (chosen/rejected pairs) or kto (prompt/completion/label)",
    "images_need_vision_model": "{dataset} holds images, and {model} is a text model: pick a vision-language "
                                "model ({supported})",
    "vision_sft_only": "{method} does not train vision-language models yet; use sft",
    "preflight_also": "{message} (also: {findings})",
    "tracker_missing": "{name} is not installed: pip install {package} (or remove {name} from report_to)",
    "budget_below_least": "{budget} GiB is less than this job can run within: it needs at least {least} GiB "  # fit.py
                          "({how}); raise max_gpu_memory_gb to {least} or more, or use {levers}",
    "seq_over_model_limit": "{length:,} is longer than this model's limit of {limit:,} tokens "
                            "(max_position_embeddings); use at most that",
    "module_not_linear": "{names} is not a linear layer of this model; its linear layers are: {leaves}",
    "modules_not_linear": "{names} are not a linear layer of this model; its linear layers are: {leaves}",
    "no_answer_tokens": "no row of {name} has answer tokens within max_seq_length={length}; raise it",
    "reward_file_unreadable": "{name} cannot be read as Python: {detail}",
    "reward_file_empty": "{name} defines no reward: add a top-level function "
                         "def my_reward(prompts, completions, **columns) -> list[float]",
    "reward_unknown": "unknown reward {name!r}; known: {known}",
    # the rule for code (jobs/checks/reward_code.py, docs/SECURITY.md)
    "reward_file_from_studio": "{path} came through the studio (an upload, a cache, a job or an export in its "
                               "data dir), and the studio never runs such a file as code: put your own reward file "
                               "in {folder}, or start the studio with --allow-reward-code and use Upload reward file",
    "reward_upload_not_allowed": "{path} was uploaded through the page, and uploaded reward files run only when the "
                                 "studio is started with --allow-reward-code: do so, or put your own file in {folder}",
    "answer_empty": "an answer is empty, so there is nothing to compare",   # after row_problem's where
    # export (jobs/export/)
    "export_no_cuda": "--device cuda was asked for, but this machine has no CUDA GPU",
    "export_not_job_folder": "{folder} is not a job folder (no {config})",
    "export_no_adapter": "job {job} has no finished adapter ({missing} missing); wait for it to finish, or "
                         "cancel it to save the current step",
    "export_no_disk_space": "not enough disk space in {folder}: the export needs about {need}, {free} is free; "
                            "free some space or pass --out on another disk",
    "export_cancelled": "the export was cancelled; nothing of it was left behind",
    "export_disk_failed": "the disk failed while writing {name}, nothing was left behind: {detail}; or pass --out on "
                          "another disk",
    "export_tokenizer_kind": "GGUF export supports byte-level BPE tokenizers (Llama 3, Qwen2, SmolLM) and "
                             "SentencePiece-style BPE with byte fallback (Llama 2, Mistral); this one is a {kind} "
                             "tokenizer",
    "export_vision_gguf": "GGUF export of a vision-language model ({model_type}) needs two files, the language "
                          "model's GGUF and an mmproj GGUF of the vision tower and projector; Fusetune does not "
                          "write them yet. "
                          "Export the merged folder (--format merged) and convert it with llama.cpp's "
                          "convert_hf_to_gguf.py (once plain, once with --mmproj)",
    "export_architecture": "GGUF export does not support the {architecture} architecture; supported: {supported}. "
                           "Export it as a merged folder (--format merged) and convert that with llama.cpp's "
                           "convert_hf_to_gguf.py",
    "export_base_not_here": "the base model {model!r} is not on this machine ({kind}); download it first, or train "
                            "from a local folder",
    "export_no_safetensors": "the base model {folder} has no safetensors weights (model.safetensors or "
                             "model.safetensors.index.json); re-save it with save_pretrained(safe_serialization=True)",
    "export_qlora_needs_bnb": "this is a QLoRA job: merging it needs bitsandbytes (pip install bitsandbytes) to "
                              "rebuild the 4-bit base it trained against",
    "export_tied_lm_head": "the adapter changes lm_head, which this model ties to the embeddings; llama.cpp cannot "
                           "apply that as a LoRA (export --format merged instead)",
    # how a job ended (jobs/queue/outcome.py)
    "finished_before_cancel": "it finished all its steps before the cancel took effect",
    "job_reported_error": "the job reported an error",
    "ended_without_reason": "the training process ended with {exit} without reporting why; see train.log",
    "trainer_not_started": "could not start the trainer ({python} -m jobs.train): {detail}; check that the "
                           "studio's Python is still installed there",
    # the job's own failure lines (jobs/train/cli.py, evaluate.py) and its reward functions (jobs/train/rewards/)
    "config_missing": "config file {path} does not exist",
    "config_not_utf8": "{path} is not UTF-8 text (byte {offset} is 0x{byte:02x}): save it as UTF-8",
    "config_unreadable": "cannot read {path}: {detail}; check its permissions",
    "config_not_yaml": "{path} is not valid YAML: {detail}",
    "config_not_mapping": "{path} must be one flat mapping of key: value pairs",
    "config_not_flat": "the config must be one flat mapping of key: value pairs",
    "config_unknown_key": "unknown key (known keys: {known})",
    "out_of_gpu_memory": "out of GPU memory at step {step}: lower batch_size or max_seq_length, turn on "
                         "gradient_checkpointing, or use load_in_4bit",
    "torchrun_needs_output_dir": "must be set when torchrun starts the job: every rank writes to the same folder",
    "rank_not_joined": "rank {rank} could not join the other ranks: {detail}",
    "ranks_lost": "lost contact with the other ranks at step {step} ({detail})",
    "on_rank": "rank {rank}: {message}",
    "error_event_lost": "{message} (and the error event could not be recorded: {problem})",
    "eval_fraction_too_few": "eval_fraction={fraction} needs at least 2 usable rows; the dataset has {count}. "
                             "Use eval_dataset or a larger dataset",
    "in_eval_dataset": "eval_dataset: {problem}",
    "reward_file_not_python": "{path} cannot be loaded as a Python file",
    "reward_file_import_failed": "{name} failed to import: {detail}",
    "reward_raised": "reward {name} raised {detail} (the traceback is in train.log)",
    "reward_bad_values": "reward {name} must return one finite number per completion ({count}), got {got} values",
    # GPU choice and placement (jobs/io/gpus.py; the wait reasons are "; "-joined in gpu_reasons)
    "gpus_without_gpu": "{key} names GPUs, but this machine has no NVIDIA GPU (NVML found none); use gpus: auto "
                        "to train on the CPU",
    "gpu_missing": "GPU {index} does not exist; this machine has GPU {have}",
    "processes_vs_gpus": "is {processes}, but the job gets {wanted} GPU(s) (gpus: {key}); use one process per "
                         "GPU, or 0 for one per chosen GPU",
    "processes_over_gpus": "asks for {wanted} processes, one per GPU, but this machine has {count} GPU(s) ({have})",
    "gpu_chat_generating": "GPU {index}: the Chat tab holds {held:.1f} GiB (a reply is being generated); unload it "
                           "or wait for the reply",
    "gpu_used_by_others": "GPU {index} has {used:.1f} of {total:.1f} GiB in use by other processes",
    "gpu_too_small": "GPU {index}: needs {need:.1f} GiB, more than its {total:.1f} GiB; lower the settings (see the "
                     "fit check) or Start anyway",
    "gpu_short": "GPU {index}: needs {need:.1f} GiB, {free:.1f} GiB free ({used:.1f} GiB held by other processes)",
    "gpu_short_chat": "GPU {index}: needs {need:.1f} GiB, {free:.1f} GiB free ({used:.1f} GiB held by other "
                      "processes, the Chat tab {held:.1f} GiB)",
    "gpu_held_by_job": "GPU {index} is in use by job '{job}'",
    "gpu_kept_for_queue": "GPU {index} is kept for a job queued earlier",
    "gpu_wait": "waiting: {gpu_reasons}",
    "gpu_wait_for": "waiting for {need}: {gpu_reasons}",
    "gpu_anyway": "starting on GPU {gpus} anyway: {gpu_reasons}",
    "gpu_anyway_for": "starting on GPU {gpus} anyway for {need}: {gpu_reasons}",
    "a_free_gpu": "a free GPU",
    "free_gpus": "{count} free GPUs ({free} free now)",
    # YAML limits (jobs/yaml_bounded.py)
    "yaml_too_deep": "{source} nests more than {limit} levels deep: a job config is one flat mapping of key: "
                     "value pairs",
    "yaml_key_too_big": "{source}: key '{key}' {problem}",
    "yaml_document_too_big": "{source}: the document {problem}",
    "yaml_self_alias": "refers to itself through an alias: write its values out without YAML aliases "
                       "(&anchor / *alias)",
    "yaml_nests": "nests more than {limit} levels deep: a job config is one flat mapping of key: value pairs",
    "yaml_duplicate_key": "{source}: the key '{key}' is written twice, on line {first_line:,} and on line {line:,}: "
                          "keep one (YAML would silently keep only the last)",
    "yaml_expands": "expands through aliases to more than {limit:,} values, over the limit of {limit:,}: write "
                    "its values out without YAML aliases (&anchor / *alias)",
    # config values (jobs/spec_values.py)
    "target_modules_empty": "must be 'all-linear' or a non-empty list of module names",
    "target_module_invalid": "{name!r} is not a module name (letters, digits, _ and .)",
    "report_to_invalid": "{value!r} is not none or a list of {choices}",
    "report_to_none_and_more": "none cannot be combined with a tracker; list the trackers alone",
    "gpus_invalid": "{value!r} is not auto, all or a list of GPU numbers such as 0,1",
    "gpus_twice": "{value!r} names a GPU twice",
}
