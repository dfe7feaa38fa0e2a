"""Export of a vision-language job: the merged folder loads as the image-text model with its image
processor and equals base + adapter on an image batch; GGUF is refused with the reason."""
import pytest
import torch

from jobs.data.vision_encode import collate_vision
from jobs.export import ExportError, export
from tests.jobs.export_jobs import train_job
from tests.jobs.vision_rows import encoded_shapes


def test_merged_export_keeps_the_processor_and_equals_base_plus_adapter(tiny_vision_model, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText
    job = train_job(tmp_path, tiny_vision_model, "vl", dataset="builtin:shapes", max_steps=3, batch_size=2,
                    max_seq_length=128, env={"FUSETUNE_HOME": str(tmp_path / "data")})
    out = export(job, "merged", out=tmp_path / "merged", device="cpu").files[0]
    assert (out / "preprocessor_config.json").is_file() and (out / "tokenizer_config.json").is_file()
    tokenizer, examples = encoded_shapes(tiny_vision_model, tmp_path, rows=2)
    image_id = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    batch = collate_vision(examples, tokenizer.pad_token_id, image_id).to(torch.device("cpu"))
    batch.pop("labels")
    with torch.no_grad():
        merged = AutoModelForImageTextToText.from_pretrained(out)(**batch).logits
        base = AutoModelForImageTextToText.from_pretrained(tiny_vision_model)
        reference = PeftModel.from_pretrained(base, job / "adapter")(**batch).logits
    assert (reference - AutoModelForImageTextToText.from_pretrained(tiny_vision_model)(**batch).logits).abs().max() > 1e-3
    torch.testing.assert_close(merged, reference, atol=1e-4, rtol=1e-4)
    with pytest.raises(ExportError, match="needs two files, the language model's GGUF and an mmproj GGUF"):
        export(job, "gguf", out=tmp_path / "vl.gguf")
