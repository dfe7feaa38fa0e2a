"""(jobs/messages) What reading and checking a dataset says: where a row is, a bad row, preference, prompt and
image-text rows, export notes, a dataset as a whole."""

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
    "label_not_bool": "field 'label' must be a boolean, true or false (in JSON without quotes), not {value!r}",
    "pair_needs_conversation": "field '{key}' must be a whole conversation (a message list) when there is no "
                               "'prompt' field",
    "not_preference_row": "is not a preference row: it needs prompt/chosen/rejected, chosen/rejected, "
                          "conversations/chosen/rejected or prompt/completion/label",
    "prompt_empty": "`prompt` is empty or not text / a list of messages",
    "prompt_no_user_turn": "`{key}` has no user turn to prompt with",
    "prompt_missing": "has no prompt: a row needs a `prompt` column (text or messages), `messages`, or a "
                      "`question` / `problem` / `instruction` column",
    # an image-text row (jobs/data/vision.py)
    "image_not_path": "image {reference!r} is not a file path",
    "image_is_url": "image {reference!r} is a URL: images are read from files next to the dataset (upload a .zip "
                    "holding the data file and its images), never fetched",
    "image_outside": "image {reference!r} is outside the dataset's folder (and the allowed folders)",
    "image_missing": "image {reference!r} does not exist (looked for {path})",
    "image_too_many_pixels": "image {name} is {width}x{height}: more than {limit:,} pixels (the limit per image, "
                             "{env}): use a smaller image",
    "image_bomb": "image {name} has {pixels:,} pixels, more than {limit:,} (the limit per image, {env}): refused "
                  "before decoding it",
    "image_row_over_budget": "its {count} images decode to {size:,} bytes, over the budget per row of {limit:,} "
                             "bytes ({env}); the largest is image {name} ({width}x{height}): use fewer or smaller "
                             "images",
    "image_dataset_over_budget": "{name}: its images decode to {size:,} bytes by {where}, over the budget per "
                                 "dataset of {limit:,} bytes ({env}): use fewer or smaller images",
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
}
