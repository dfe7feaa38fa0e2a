"""Portable adapters (issue 8, item 2): the saved and zipped adapter_config.json names a base that
another machine can load, and the model card says which file training read, with valid metadata."""
import json
import zipfile

import pytest
import torch
import yaml

from jobs.models import builtin as smollm2
from jobs.export import ExportError, export_adapter_zip, model_card
from jobs.export.card import hub_id, portable_base_model, smoothed_loss
from jobs.spec import BUILTIN_MODEL, JobSpec


def front_matter(card: str) -> dict:
    assert card.startswith("---\n")
    meta = yaml.safe_load(card.split("---\n")[1])
    assert isinstance(meta, dict)
    return meta


@pytest.mark.parametrize("model, expected", [
    (BUILTIN_MODEL, "HuggingFaceTB/SmolLM2-135M-Instruct"),
    ("Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct"),
    ("/models/my-llama", None),
    ("./relative/folder", None),
    ("~/downloads/model.Q8_0.gguf", None),
])
def test_hub_id_and_portable_name(model, expected):
    assert hub_id(model) == expected
    assert portable_base_model(model) == (expected or model)


def test_builtin_card_names_the_hub_model_and_the_file_it_was_trained_from():
    card = model_card(JobSpec(model=BUILTIN_MODEL), "/root/.fusetune/models/smollm2-135m-instruct", 0.5, 60)
    meta = front_matter(card)
    assert meta["base_model"] == smollm2.HUB_ID and meta["library_name"] == "peft"
    assert meta["base_model_relation"] == "adapter" and "fusetune" in meta["tags"]
    assert smollm2.GGUF_NAME in card
    assert f'from_pretrained("{smollm2.HUB_ID}")' in card
    assert "/root/.fusetune" not in card.split("## Config that ran")[0]


def test_local_folder_card_has_no_invalid_base_model_metadata(tmp_path):
    card = model_card(JobSpec(model=str(tmp_path)), str(tmp_path), None, 3, "cancelled at step 3")
    meta = front_matter(card)
    assert "base_model" not in meta  # the hub only accepts hub ids there
    assert f"the local folder `{tmp_path}`" in card


def test_trained_adapter_names_the_given_folder_and_loads_from_it(tiny_job, tiny_model):
    config = json.loads((tiny_job / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(tiny_model)
    card = (tiny_job / "adapter" / "README.md").read_text()
    assert front_matter(card)["library_name"] == "peft"


def test_zip_rewrites_an_old_adapter_config_and_loads_by_itself(tiny_job, tiny_model, tmp_path):
    """An adapter saved before the rewrite still points at a cache folder; the zip fixes it."""
    job = tmp_path / "old-job"
    import shutil
    shutil.copytree(tiny_job, job)
    config_file = job / "adapter" / "adapter_config.json"
    config = json.loads(config_file.read_text())
    config["base_model_name_or_path"] = "/root/.fusetune/models/gone"
    config_file.write_text(json.dumps(config))
    archive = export_adapter_zip(job, tmp_path / "out" / "a.zip")
    with zipfile.ZipFile(archive) as zf:
        zf.extractall(tmp_path / "unzipped")
        assert "adapter/adapter_model.safetensors" in zf.namelist()
    unzipped = tmp_path / "unzipped" / "adapter"
    assert json.loads((unzipped / "adapter_config.json").read_text())["base_model_name_or_path"] == str(tiny_model)
    from peft import AutoPeftModelForCausalLM, PeftModel
    from transformers import AutoModelForCausalLM
    ids = torch.tensor([[1, 5, 9, 14, 20]])
    with torch.no_grad():
        alone = AutoPeftModelForCausalLM.from_pretrained(unzipped)(ids).logits
        reference = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model),
                                              tiny_job / "adapter")(ids).logits
    torch.testing.assert_close(alone, reference)
    assert not list((tmp_path / "out").glob(".*partial*"))


def test_zip_of_a_job_without_adapter_is_refused(tmp_path):
    with pytest.raises(ExportError, match="no finished adapter"):
        export_adapter_zip(tmp_path)


def test_cards_keep_unicode_names_as_written():
    """Emoji (beyond the BMP), CJK and RTL text in the bot name and the job name appear in the cards as
    typed, not as escapes, and the card's config reads back to the same values."""
    from jobs.export.card import merged_card
    spec = JobSpec(model=BUILTIN_MODEL, bot_name="Bot😀 名字", bot_author="بوت 𠀋", name="调优 😀 مرحبا")
    card = model_card(spec, "/x", 0.5, 60)
    assert "bot_name: Bot😀 名字" in card and "\\U" not in card and "\\u" not in card
    config = yaml.safe_load(card.split("```yaml\n")[1].split("```")[0])
    assert (config["bot_name"], config["bot_author"], config["name"]) == (spec.bot_name, spec.bot_author, spec.name)
    assert "\n# 调优 😀 مرحبا (gguf), exported by Fusetune Studio\n" in merged_card(spec, "gguf", [])


def test_an_export_holds_its_job_folder_against_delete(tmp_path, monkeypatch):
    """While `jobs.export.export` runs (the CLI and the Export tab both go through it), the job
    folder cannot be renamed away by a delete; after it, it can."""
    import jobs.export
    from jobs.export.busy import ExportRunning, rename_unless_exporting
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    seen = []

    def fake_export(job, *args):
        with pytest.raises(ExportRunning):
            rename_unless_exporting(job, tmp_path / "gone")
        seen.append(job.is_dir())
        return "result"

    monkeypatch.setattr(jobs.export, "_export", fake_export)
    assert jobs.export.export(job_dir, "merged", out=tmp_path / "out") == "result" and seen == [True]
    rename_unless_exporting(job_dir, tmp_path / "gone")
    assert (tmp_path / "gone").is_dir()


def test_the_training_line_names_the_method_and_what_its_numbers_mean():
    from jobs.export.card import adapter_training_line, merged_card
    sft = model_card(JobSpec(model=BUILTIN_MODEL), "/x", 0.5, 60)
    assert "\n- Training: sft, finished after 60 steps, final loss 0.5000\n" in sft
    grpo = JobSpec(model=BUILTIN_MODEL, method="grpo", dataset="builtin:arithmetic")
    cancelled = model_card(grpo, "/x", 0.0, 0, "cancelled at step 0")   # cancelled before a step
    assert adapter_training_line(cancelled) == "- Training: grpo, cancelled at step 0 after 0 steps, reward_mean n/a"
    kto = model_card(JobSpec(model=BUILTIN_MODEL, method="kto"), "/x", 0.25, 8, last_step={
        "reward_accuracy": 0.75, "reward_margin": 1.5, "kto_kl": 0.1})
    line = "- Training: kto, finished after 8 steps, final loss 0.2500 (reward_accuracy 0.7500, reward_margin 1.5000 at the last step)"
    assert adapter_training_line(kto) == line
    merged = merged_card(JobSpec(model=BUILTIN_MODEL, method="kto"), "merged", ["weights: bf16"], line)
    assert f"\n{line}\n- weights: bf16\n\n## Config that ran\n```yaml\n" in merged
    assert adapter_training_line("# an adapter card from before") is None
    loss, averaged = smoothed_loss([9.0] + [2.0, 1.0] * 5)
    smoothed = model_card(JobSpec(model=BUILTIN_MODEL), "/x", loss, 60, averaged=averaged, eval_loss=1.25)
    assert "final loss 1.5000 (mean of the last 10 steps), eval loss 1.2500\n" in smoothed


def test_the_headline_loss_is_the_mean_of_the_last_ten_steps():
    assert smoothed_loss([]) == (None, 0) and smoothed_loss([3.0, 1.0]) == (2.0, 2)
    assert smoothed_loss(range(20)) == (14.5, 10)
