"""The preflight (Start's check, `--dry-run`) of image-text jobs: what it opens, counts and refuses."""
import pytest

from jobs.checks.preflight import run_preflight
from jobs.models import vision
from jobs.spec import JobSpec
from tests.jobs.vision_rows import LLAMA_FACTORY_ROW, PARTS_ROW, write_dataset


def test_a_vision_job_passes_with_its_images_and_lora_parts_counted(tiny_vision_model, tmp_path):
    spec = JobSpec(model=str(tiny_vision_model), dataset="builtin:shapes", max_seq_length=128)
    report = run_preflight(spec, data_dir=tmp_path, log=lambda _: None)
    assert report.ok, report.problems
    notes = "\n".join(report.notes)
    assert "LoRA modules: language 14/14, vision 0/10, projector 0/2 (vision and projector frozen)" in notes
    assert "48 images opened" in notes and "image tokens (never trained)" in notes
    # ~100-token examples in rows of 128: one a row even on a GPU
    assert "image-text rows: packing: auto -> off (examples already fill max_seq_length" in notes, notes
    summary = report.datasets[0]
    assert summary.rows == 48 and summary.stats["images"] == 48 and summary.trained_tokens > 0


def test_the_preflight_says_packing_is_on_for_image_text_rows(tiny_vision_model, tmp_path):
    spec = JobSpec(model=str(tiny_vision_model), dataset="builtin:shapes", max_seq_length=512, packing="on")
    notes = "\n".join(run_preflight(spec, data_dir=tmp_path, log=lambda _: None).notes)
    assert "image-text rows: packing: on" in notes, notes
    spec = JobSpec(model=str(tiny_vision_model), dataset="builtin:shapes", max_seq_length=512)
    notes = "\n".join(run_preflight(spec, data_dir=tmp_path, log=lambda _: None).notes)
    assert "packing: auto -> on (48 examples in 8 rows of 512) on a GPU; off on CPU" in notes, notes


def test_bad_images_and_long_rows_are_refused_by_row(tiny_vision_model, tmp_path):
    rows = [PARTS_ROW, {**LLAMA_FACTORY_ROW, "images": ["imgs/fake.png"]},
            {**LLAMA_FACTORY_ROW, "images": ["http://example.com/a.png"]}]
    path = write_dataset(tmp_path, rows)
    (tmp_path / "imgs" / "fake.png").write_text("hello")
    report = run_preflight(JobSpec(model=str(tiny_vision_model), dataset=str(path)), data_dir=tmp_path,
                           log=lambda _: None)
    assert not report.ok and report.problems[0].key == "dataset"
    text = str(report.problems[0])
    assert "2 bad rows" in text and "row 3" in text
    assert "row 2 (line 2): image #1 'imgs/fake.png' is not an image" in text
    short = run_preflight(JobSpec(model=str(tiny_vision_model), dataset=str(write_dataset(tmp_path / "b", [PARTS_ROW])),
                                  max_seq_length=16), data_dir=tmp_path, log=lambda _: None)
    assert "image tokens), more than max_seq_length=16" in str(short.problems[0])


def test_method_and_targets_are_checked_against_the_vision_model(tiny_vision_model, tmp_path):
    base = dict(model=str(tiny_vision_model), dataset="builtin:shapes", max_seq_length=128)
    dpo = run_preflight(JobSpec(**base, method="dpo"), data_dir=tmp_path, log=lambda _: None)
    assert [p.key for p in dpo.problems] == ["method"]
    targets = run_preflight(JobSpec(**base, target_modules=["qkv"]), data_dir=tmp_path, log=lambda _: None)
    assert [p.key for p in targets.problems] == ["target_modules"] and "vision_lora" in str(targets.problems[0])
    vit = run_preflight(JobSpec(**base, target_modules=["q_proj", "vit"]), data_dir=tmp_path, log=lambda _: None)
    assert vit.ok and "language 2/14, vision 10/10, projector 0/2" in "\n".join(vit.notes)


def test_a_text_model_is_refused_image_data(tiny_model, tmp_path):
    report = run_preflight(JobSpec(model=str(tiny_model), dataset="builtin:shapes"), data_dir=tmp_path,
                           log=lambda _: None)
    assert [p.key for p in report.problems] == ["dataset"]
    assert "is a text model: pick a vision-language model (Qwen2-VL or Qwen2.5-VL" in str(report.problems[0])
    assert "none ships with Fusetune" in str(report.problems[0])   # issue 40: offline, a dead end said why
    rows = write_dataset(tmp_path / "rows", [PARTS_ROW])
    from_file = run_preflight(JobSpec(model=str(tiny_model), dataset=str(rows)), data_dir=tmp_path, log=lambda _: None)
    assert [p.key for p in from_file.problems] == ["dataset"] and "holds images" in str(from_file.problems[0])


@pytest.mark.parametrize("model_type", ["llava", "idefics3", "gemma3", "mllama"])
def test_other_image_text_models_are_refused_with_the_reason(model_type):
    from transformers import AutoConfig
    reason = vision.refusal(AutoConfig.for_model(model_type))
    assert reason.startswith(f"{model_type!r} is a vision-language model that Fusetune does not train yet")
    assert vision.refusal(AutoConfig.for_model("qwen2_5_vl")) is None
    assert vision.refusal(AutoConfig.for_model("llama")) is None


@pytest.mark.parametrize("dataset", ["builtin:shapes", "builtin:identity"])
def test_a_llama_3_2_vision_folder_is_refused_at_preflight_with_the_reason(tmp_path, dataset):
    """Llama 3.2 Vision (mllama: cross-attention image layers) as a local folder, its config and a
    tokenizer: Start refuses it on the model field, saying why and what is supported, with image rows
    or text rows alike, before any weight is read (the folder has none)."""
    from transformers import AutoConfig
    from tests.tiny import make_tokenizer
    folder = tmp_path / "Llama-3.2-11B-Vision-Instruct"
    AutoConfig.for_model("mllama").save_pretrained(folder)
    make_tokenizer().save_pretrained(folder)
    report = run_preflight(JobSpec(model=str(folder), dataset=dataset, max_seq_length=128), data_dir=tmp_path,
                           log=lambda _: None)
    assert not report.ok and [p.key for p in report.problems] == ["model"]
    assert str(report.problems[0]) == ("model: 'mllama' is a vision-language model that Fusetune does not train "
                                       "yet (its image tokens are not wired in); supported: Qwen2-VL, Qwen2.5-VL")


def test_a_vision_model_not_downloaded_is_called_that_not_a_text_model(tmp_path, monkeypatch):
    """Issue 40: offline, an un-downloaded Qwen2-VL was also refused as "a text model"."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    report = run_preflight(JobSpec(model="Qwen/Qwen2-VL-2B-Instruct", dataset="builtin:shapes"), data_dir=tmp_path,
                           log=lambda _: None)
    assert [p.key for p in report.problems] == ["model"], report.problems
    assert "is not in the local Hugging Face cache" in str(report.problems[0])
