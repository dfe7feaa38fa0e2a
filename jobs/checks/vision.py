"""Preflight of a vision-language job (jobs/models/vision.py): the model is one Fusetune trains,
the method takes images, target_modules exist (the image-text model built on the meta device),
and every row of the data is read, every image opened (missing, corrupt, not an image, a URL,
outside the dataset's folder, over the pixel or byte budgets of jobs/data/image_budget.py, checked
from its header before decoding: counted and named by row) and every row encoded with its image
tokens, so a row past max_seq_length is refused by number before the job starts.

A text model given image-text data (builtin:shapes, or rows with image parts) is refused too,
saying what to pick."""
from __future__ import annotations

from jobs.messages import say
from jobs.data.conversation import DataError
from jobs.spec import BUILTIN_SHAPES, DATASET_SUFFIXES, JobSpec, is_local_reference

# none ships with Fusetune (no registry package holds one): offline, it must already be on the machine
SUPPORTED_TEXT = ("Qwen2-VL or Qwen2.5-VL, a local folder or a downloaded hub id; none ships with Fusetune, so "
                  "offline one must already be on this machine (`hf download Qwen/Qwen2-VL-2B-Instruct` while online)")


def is_vision_config(config) -> bool:
    from jobs.models import vision
    return vision.is_vision_config(config)


def check_text_model_data(spec: JobSpec, report, model_known: bool = True) -> bool:
    """False (and a finding) when a text model is given image-text data. `model_known` False: the model
    could not be read (not downloaded, offline: its own finding says so), so it is not called a text
    model; False is still returned, as the text checks of image rows would only mislead."""
    from jobs.data.dataset import scan_rows
    from jobs.data.vision import is_vision_row
    for key in ("dataset", "eval_dataset"):
        reference = getattr(spec, key)
        if not reference:
            continue
        images = reference == BUILTIN_SHAPES
        if not images and is_local_reference(reference, DATASET_SUFFIXES):   # a hub dataset is not read here
            try:
                rows, _ = scan_rows(reference, first=20)
            except DataError:
                continue   # the text checks report it
            images = any(is_vision_row(row) for row in rows)
        if images:
            if model_known:
                report.fail(key, say("images_need_vision_model", dataset=reference, model=spec.model,
                                     supported=SUPPORTED_TEXT))
            return False
    return True


def check_vision_job(spec: JobSpec, config, tokenizer, source: str, data_dir, report, summary_class) -> None:
    """Every check of a vision-language job (see the module docstring); findings go to `report`."""
    from jobs.models import vision
    reason = vision.refusal(config)
    if reason:
        return report.fail("model", reason)
    if spec.method != "sft":
        return report.fail("method", say("vision_sft_only", method=spec.method))
    _check_targets(spec, config, report)
    try:
        processor = vision.load_image_processor(source)
        _, image_id = vision.image_token(tokenizer)
    except vision.ModelError as exc:
        return report.fail("model", str(exc))
    for key in ("dataset", "eval_dataset"):
        if getattr(spec, key):
            _check_rows(spec, key, tokenizer, processor, image_id, data_dir, report, summary_class)


def _check_targets(spec: JobSpec, config, report) -> None:
    import torch
    from transformers import AutoModelForImageTextToText
    from jobs.models import vision
    try:
        with torch.device("meta"):
            model = AutoModelForImageTextToText.from_config(config)
    except (ValueError, KeyError, TypeError) as exc:
        report.notes.append(f"target_modules not checked: cannot build this model's architecture ({exc})")
        return
    linear = [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]
    missing = vision.missing_targets(linear, spec.target_modules)
    if missing:
        leaves = sorted({name.rsplit(".", 1)[-1] for name in linear})
        return report.fail("target_modules", say("vision_targets_missing", names=", ".join(missing),
                                                 leaves=", ".join(leaves)))
    chosen = vision.lora_targets(linear, spec.target_modules, spec.vision_lora)
    if not chosen:
        return report.fail("target_modules", say("vision_targets_all_vision"))
    report.notes.append(vision.lora_line(chosen, linear))


def _check_rows(spec: JobSpec, key: str, tokenizer, processor, image_id: int, data_dir, report,
                summary_class) -> None:
    from jobs.data.vision_dataset import encode_rows, read_conversations
    try:
        rows, good, problems = read_conversations(getattr(spec, key), data_dir)
    except DataError as exc:
        return report.fail(key, str(exc))
    encoded = encode_rows(rows, good, tokenizer, processor, image_id, spec.max_seq_length, problems)
    error = problems.error(rows.name)
    if error is not None or not encoded.examples:
        return report.fail(key, str(error) if error else say("no_rows", name=rows.name))
    summary = summary_class(key, rows.name, len(rows), "messages with images")
    lengths = sorted(len(e.input_ids) for e in encoded.examples)
    summary.tokens = {"min": lengths[0], "mean": round(sum(lengths) / len(lengths), 1),
                      "p95": lengths[min(len(lengths) - 1, int(0.95 * len(lengths)))], "max": lengths[-1]}
    summary.tokens_total = sum(lengths)
    summary.trained_tokens = sum(e.trained_tokens for e in encoded.examples)
    summary.stats = {"images": encoded.images, "image_tokens": sum(encoded.image_tokens)}
    report.datasets.append(summary)
    report.notes.append(f"{key}: {encoded.images:,} images opened, {sum(encoded.image_tokens):,} image tokens "
                        "(never trained)")
    if key == "dataset":
        from jobs.data.vision_packing import packing_note
        report.notes.append(packing_note(spec.packing, lengths, spec.max_seq_length, spec.seed))
