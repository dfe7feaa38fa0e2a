"""The sentences jobs/ writes for a person, by name: one English template each, with {placeholders}.

Code builds such text with ``say("row_not_json", where=..., detail=...)``, which returns the plain
English str. Such text crosses process boundaries (events.jsonl, the preflight child's JSON, the
queue's SQLite reason) as plain text anyway, so the studio translates by the templates themselves:
studio/server_text.py derives a pattern from each one and renders ``msg.<key>`` from
studio/locales/zh-CN.json. jobs/ knows no language but English: add a template here and its
Chinese there, in the same commit (tests/studio/test_job_messages.py checks both).

Placeholder names carry meaning for that pattern: ``where`` is a row's place ("row 3 (line 5)"),
row/line/count-like names (also rank, step, index) and ``{x:,}`` are numbers, ``problems`` is a
"; "-joined list of row problems, ``findings`` one of "key: message" pieces and ``gpu_reasons`` one of
per-GPU reasons, ``field`` is a JobSpec key and ``config_file`` a job's config.yaml path,
``problem``/``message`` hold another message; a placeholder's value that is itself one of these
messages is translated too. On the lowest floor of jobs/ (tests/test_layout.py): every package may
import it."""
from __future__ import annotations

from typing import Any

MESSAGES: dict[str, str] = {
    # where a row is (jobs/data/readers.py, json_stream.py, dataset.py)
    "at_row": "row {number}",
    "at_row_line": "row {number} (line {line})",
    "at_row_line_format": "row {number} (line {line}, {format})",
    "at_row_format": "row {number} ({format})",
    "at_header_line": "{name}'s header line",
    # a bad row (jobs/data/)
    "row_problem": "{where}: {problem}",
    "row_too_large": "{where} is {size}, over the row size limit of {limit:,} bytes: split or shorten it "
                     "(or raise {env})",
    "byte_count": "{count:,} bytes",
    "row_not_utf8": "{where} is not UTF-8 text (undecodable byte at offset {offset:,} of the file): "
                    "save the file as UTF-8",
    "row_not_json_column": "{where} is not valid JSON (column {column}): {detail}",
    "row_not_json": "{where} is not valid JSON: {detail}",
    "row_too_deep": "{where} nests brackets ([ or {{) more than {limit} levels deep, over the nesting limit of "
                    "{limit}: a row of chat data needs a few levels; flatten it or remove it",
    "row_not_object": "{where} is {kind}, not an object with fields",
    "kind_list": "a list",
    "kind_string": "a string",
    "kind_null": "null",
    "kind_bool": "true/false",
    "kind_number": "a number",
    "row_not_csv": "{where} is not valid CSV: {detail}",
    "row_field_count": "{where} has {count} fields; the header has {header_count} ({header})",
    "rows_after_unchecked": "rows after {where} were not checked: its quoted field spans lines, so the next row "
                            "cannot be found; fix it first",
    "field_missing": "field '{key}' is missing or empty",
    "field_not_text": "field '{key}' must be text, not {kind}",
    "conversations_not_list": "field 'conversations' must be a non-empty list of {{from, value}}",
    "messages_not_list": "field 'messages' must be a non-empty list of {{role, content}}",
    "turn_bad_role": "turn {turn} has role {role!r}; use one of {choices}",
    "turn_needs_text": "turn {turn} needs a text field '{key}'",
    "no_assistant_turn": "has no assistant turn, so there is nothing to train on",
    "only_empty_messages": "has only empty messages (every user and assistant text is blank), so there is "
                           "nothing to train on: fill them in or remove the row",
    "only_empty_answers": "has only empty assistant turns, so there is nothing to train on: write the answers "
                          "or remove the row",
    # a preference row (jobs/data/preference.py) and a prompt row (jobs/data/prompts.py)
    "field_not_turns": "field '{key}' must be text or a non-empty list of messages",
    "field_turn_not_message": "field '{key}' turn {turn} must be a message {{role, content}}",
    "field_turn_needs_text": "field '{key}' turn {turn} needs a text field 'content' (or 'value')",
    "pair_no_shared_prompt": "chosen and rejected share no prompt (their first messages differ); add a 'prompt' field",
    "label_not_bool": "field 'label' must be true or false, not {value!r}",
    "pair_needs_conversation": "field '{key}' must be a whole conversation (a message list) when there is no "
                               "'prompt' field",
    "not_preference_row": "is not a preference row: it needs prompt/chosen/rejected, chosen/rejected, "
                          "conversations/chosen/rejected or prompt/completion/label",
    "prompt_empty": "`prompt` is empty or not text / a list of messages",
    "prompt_no_user_turn": "`{key}` has no user turn to prompt with",
    # an image-text row (jobs/data/vision.py)
    "image_not_path": "image {reference!r} is not a file path",
    "image_is_url": "image {reference!r} is a URL: images are read from files next to the dataset (upload a .zip "
                    "holding the data file and its images), never fetched",
    "image_outside": "image {reference!r} is outside the dataset's folder (and the allowed folders)",
    "image_missing": "image {reference!r} does not exist (looked for {path})",
    "image_too_many_pixels": "image {name} is {width}x{height}: more than {limit:,} pixels",
    "image_not_image": "image {name} is not an image (PIL cannot identify it)",
    "image_corrupt": "image {name} is corrupt: {detail}",
    "image_and_more": "{problem} (and {count} more)",
    "vision_no_messages": "has no `messages` list",
    "vision_images_not_list": "`images` is not a list of file paths",
    "vision_bad_role": "message {turn} needs a role of system, user or assistant",
    "vision_image_in_answer": "message {turn} is an answer with an image: images go in user turns",
    "vision_image_count": "`images` lists {count} images but the text has {placeholders} {placeholder} placeholders",
    "vision_no_answer": "has no answer (an assistant message with text)",
    "vision_too_many_placeholders": "message {turn} has more {placeholder} placeholders than `images`",
    "vision_bad_content": "message {turn}'s content is neither text nor a list of parts",
    "vision_bad_part": "message {turn} has a part that is neither text nor image: {part}",
    # an image-text row that does not encode (jobs/data/vision_encode.py)
    "vision_template_turns": "the chat template does not render this conversation turn by turn",
    "vision_extra_image_tokens": "the text holds more image tokens than the row has images",
    "vision_image_tokens_written": "the chat template wrote {count} image tokens for {images} images",
    "vision_row_too_long": "is {length:,} tokens, more than max_seq_length={limit:,}: raise max_seq_length or use "
                           "smaller images",
    "vision_row_too_long_images": "is {length:,} tokens ({shown:,} of them image tokens), more than "
                                  "max_seq_length={limit:,}: raise max_seq_length or use smaller images",
    # export notes (jobs/export/) and why a chat template has no Ollama TEMPLATE (jobs/export/ollama.py)
    "export_note_no_lora_gguf": "no llama.cpp LoRA GGUF: {message}",
    "export_note_qlora": "QLoRA job: merged into the dequantized base (its linear weights sent "
                         "through the same NF4 4-bit round trip training used), so it computes what "
                         "the trained model computed",
    "export_note_f16_tensors": "{count} tensors stored as f16: their rows are not a multiple of the "
                               "{quant} block size (e.g. {tensor})",
    "export_note_pre_tokenizer": "llama.cpp does not know this tokenizer's pre-tokenizer; it will "
                                 "split text with its default rules, which can tokenize some text "
                                 "differently",
    "export_note_no_template": "Modelfile without TEMPLATE ({message}); Ollama falls back to the GGUF's chat template",
    "template_part_not_fixed": "the {what} is not a fixed text",
    "template_fails": "the template fails on a plain conversation: {detail}",
    "template_first_user_turn": "the first user turn is wrapped differently from the others",
    "template_unexplained_head": "the template adds text before the first turn it does not explain",
    "template_system_then_user": "the system turn is not followed by an ordinary user turn",
    "template_first_not_system": "the template adds a first turn that is not a system turn",
    "template_not_reproduced": "the measured format does not reproduce {count}-turn chats",
    "template_triple_quotes": "the text contains \"\"\", which a Modelfile cannot quote",
    # a dataset as a whole (jobs/data/)
    "bad_row": "{name} has 1 bad row: {problems}",
    "bad_rows": "{name} has {count:,} bad rows: {problems}",
    "bad_rows_first": "{name} has {count:,} bad rows (the first {shown} shown): {problems}",
    "no_rows": "{name} has no rows: add at least one example",
    "no_row_answer_tokens": "no row has answer tokens within max_seq_length={length}; raise it",
    "hub_dataset_unreachable": "could not load the hub dataset {name!r}: {detail}. Offline? Upload the file "
                               "instead (.json/.jsonl/.csv/.parquet).",
    "sft_got_preference_rows": "row 1 is a preference row (chosen/rejected or prompt/completion/label), which "
                               "supervised fine-tuning cannot train: set method to dpo, orpo, simpo or kto",
    "format_unknown": "cannot tell the format of row 1 (fields: {fields}). Expected alpaca (instruction, input, "
                      "output), sharegpt (conversations), messages, or text; or set dataset_format explicitly",
    "no_such_data_file": "{reference}: no such data file",
    "unsupported_file_type": "{name}: unsupported file type; use one of {choices}",
    "unknown_dataset_format": "unknown dataset_format {fmt!r}",
    "csv_empty": "{name} is empty: a CSV needs a header line naming the fields (e.g. instruction,input,output) "
                 "and one row per example",
    "csv_header_unreadable": "{name}'s header line cannot be read: {problem}",
    "json_empty": "{name} is empty: it must hold {shape}",
    "json_trailing_comma": "{name}: a comma after row {number} (line {line}) is followed by no row: remove the "
                           "trailing comma",
    "json_cut_off": "{name} ends inside row {number} (line {line}): the file is cut off or a closing bracket or "
                    "quote is missing",
    "json_no_separator": "{name}: after row {number} (line {line}) comes {found}, not ',' or ']': a comma or the "
                         "closing bracket is missing",
    "json_cut_in_first_key": "{name} is not valid JSON: it ends inside its first key",
    "json_not_row_list": "{name} must hold {shape}; it starts with {start}",
    "json_after_closing": "{name}: after the list of rows comes more than the closing '}}' (only one key holding "
                          "the rows is read)",
    "json_text_after_rows": "{name}: there is text after the list of rows (line {line})",
    "not_preference_fields": "is not a preference row (fields: {fields}); method {method} needs "
                             "prompt/chosen/rejected rows",
    "not_preference_fields_kto": "is not a preference row (fields: {fields}); method {method} needs "
                                 "prompt/chosen/rejected rows or prompt/completion/label",
    "method_needs_other_rows": "method {method} needs {need}, this row is {kind}",
    "max_row_bytes_not_number": "{env}={raw!r} is not a whole number of bytes",
    "max_row_bytes_too_small": "{env}={raw!r} must be at least 1",
    # a refused config field (jobs/spec.py, jobs/spec_values.py; the field is named apart, by SpecError.key)
    "model_empty": "is empty: pick the built-in model, a hub id, a folder or a .gguf file",
    "dataset_empty": "is empty: pick builtin:identity or upload a data file",
    "epochs_needed": "must be > 0 when max_steps is 0 (or set max_steps)",
    "bot_name_empty": "is empty: the identity dataset needs a name to teach",
    "not_checkpoint": "{path} is not a checkpoint folder",
    "eval_dataset_builtin": "must be a data file; leave it empty to hold out eval_fraction",
    "eval_both": "set either eval_fraction or eval_dataset, not both",
    "keep_best_needs_eval": "needs eval data: set eval_fraction or eval_dataset",
    "processes_gpus": "is {processes} but gpus lists {count} GPU(s); use one process per GPU (or 0 for automatic)",
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
    "seq_over_model_limit": "{length:,} is longer than this model's limit of {limit:,} tokens "
                            "(max_position_embeddings); use at most that",
    "module_not_linear": "{names} is not a linear layer of this model; its linear layers are: {leaves}",
    "modules_not_linear": "{names} are not a linear layer of this model; its linear layers are: {leaves}",
    "no_answer_tokens": "no row of {name} has answer tokens within max_seq_length={length}; raise it",
    "reward_file_unreadable": "{name} cannot be read as Python: {detail}",
    "reward_file_empty": "{name} defines no reward: add a top-level function "
                         "def my_reward(prompts, completions, **columns) -> list[float]",
    "reward_unknown": "unknown reward {name!r}; known: {known}",
    "answer_empty": "an answer is empty, so there is nothing to compare",   # after row_problem's where
    # export (jobs/export/)
    "export_no_cuda": "--device cuda was asked for, but this machine has no CUDA GPU",
    "export_not_job_folder": "{folder} is not a job folder (no {config})",
    "export_no_adapter": "job {job} has no finished adapter ({missing} missing); wait for it to finish, or "
                         "cancel it to save the current step",
    "export_no_disk_space": "not enough disk space in {folder}: the export needs about {need}, {free} is free; "
                            "free some space or pass --out on another disk",
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
    "yaml_expands": "expands through aliases to more than {limit:,} values, over the limit of {limit:,}: write "
                    "its values out without YAML aliases (&anchor / *alias)",
    # config values (jobs/spec_values.py)
    "target_modules_empty": "must be 'all-linear' or a non-empty list of module names",
    "target_module_invalid": "{name!r} is not a module name (letters, digits, _ and .)",
    "report_to_invalid": "{value!r} is not none or a list of {choices}",
    "report_to_none_and_more": "none cannot be combined with a tracker; list the trackers alone",
    "gpus_invalid": "{value!r} is not auto, all or a list of GPU numbers such as 0,1",
    "gpus_twice": "{value!r} names a GPU twice",
    # image-text data (jobs/data/vision_dataset.py, vision_preview.py, jobs/checks/vision.py)
    "vision_text_builtin": "{reference} is text data: a vision-language model trains on {shapes} or a data file "
                           "with image rows",
    "vision_not_data_file": "{reference} is not a data file: image-text data is a local file next to its images",
    "no_image_rows": "{name} has no rows: add at least one image-text example",
    "vision_targets_missing": "{names} match no linear layer of this model; its linear layers are: {leaves} (and "
                              "the aliases vit, aligner)",
    "vision_targets_all_vision": "these names are all in the vision tower or projector: set vision_lora: true to "
                                 "train them",
    # a vision-language model (jobs/models/vision.py)
    "vision_model_unsupported": "{model_type!r} is a vision-language model that Fusetune does not train yet (its "
                                "image tokens are not wired in); supported: {supported}",
    "image_processor_unloadable": "could not load the image processor of {source!r}: {detail}",
    "tokenizer_no_image_token": "the tokenizer has no {token} token: it is not a Qwen2-VL tokenizer",
    "method_text_only": "method {method} does not train vision-language models yet; use method sft",
    # preference data (jobs/data/pair_preview.py, dataset.py's builtin:concise), chat templates, Parquet
    "no_pair_rows": "{name} has no rows: add at least one preference pair",
    "concise_not_generated": "{concise} is made from this base model's own answers, which are generated when the "
                             "first job on it starts (once per model, a few minutes on a CPU); start the job, or "
                             "preview again after it has begun",
    "template_not_prefix_stable_pair": "this model's chat template renders the prompt differently once an answer "
                                       "follows, so the answer part cannot be located; use a prefix-stable template",
    "template_rewrites_turns": "this model's chat template rewrites earlier turns, so the answer part cannot be "
                               "located; use a model with a prefix-stable template",
    "not_parquet": "{name} is not a Parquet file ({detail}); export it again as Parquet, or give the file the "
                   "suffix of its real type",
    # the rarer export refusals (jobs/export/: __init__.py, source.py, families.py, vocab.py, lora_gguf.py)
    "export_format_unknown": "--format {value!r} is not one of {choices}",
    "export_quant_unknown": "--quant {value!r} is not one of {choices}",
    "export_config_refused": "{config_file}: {problem}",
    "export_tensor_not_in_base": "the adapter changes {tensor}, which the base model {base} does not have; was it "
                                 "trained on a different model?",
    "export_base_missing": "cannot find the base model: {problem}",
    "export_adapter_option": "the adapter uses {option}, which export does not support",
    "export_adapter_odd_tensor": "the adapter has a tensor export cannot merge: {tensor}",
    "export_lora_half": "the adapter's LoRA for {tensor} is incomplete (only {halves})",
    "export_tensor_unplaced": "do not know where {tensor} goes in a GGUF file; is this a plain {supported} "
                              "checkpoint?",
    "export_rope_scaling": "GGUF export does not know RoPE scaling {kind!r} of this model",
    "export_no_fast_tokenizer": "GGUF export needs the fast tokenizer file {name}, which {folder} lacks",
    "export_vocab_too_big": "the tokenizer has {count} tokens but the model only {size} embeddings",
    "export_lora_scales_differ": "the adapter's LoRA pairs have different scales; llama.cpp takes one alpha per "
                                 "file",
    # an uploaded .zip of a dataset and its images (jobs/io/dataset_zip.py)
    "zip_symlink": "{member} is a symbolic link: links are not unpacked",
    "zip_outside": "{member} points outside the archive's folder",
    "zip_too_big": "the archive unpacks to more than {megabytes:,.0f} MB",
    "zip_too_many_files": "the archive holds more than {limit:,} files",
    "zip_data_files": "the archive must hold exactly one data file ({suffixes}) beside its images; found {count}: "
                      "{found}",
    "zip_none_found": "none",
    "zip_member_grows": "{member} unpacks to more than its declared size",
    "zip_unreadable": "{name} is not a readable .zip file ({detail})",
    # the queue's reasons (jobs/queue/runner.py)
    "wait_running_job": "waiting for the running job to finish",
    "owner_stopped_before_start": "the studio instance {owner} that took this job stopped before starting its "
                                  "trainer; start the job again",
    # a config error as the job's error event writes it: the field's name, then why (SpecError)
    "field_error": "{field}: {message}",
}


def say(key: str, /, **params: Any) -> str:
    """The English sentence `key` with its placeholders filled: a plain str, as it would cross a
    process boundary anyway (and rows keep their `where` by the million: no extra object each).
    An unknown key is a KeyError, so a typo shows in the first test that reaches it."""
    return MESSAGES[key].format(**params)
