"""Jobs of the other methods export and chat as SFT jobs do (issue 19 item 7, issue 20 item 7): a DPO
and a GRPO job give the same adapter zip (with its llama.cpp LoRA GGUF), merged folder and GGUF with
Ollama Modelfile as the SFT job on the same tiny base, each computing base + adapter; and the Chat tab's
loader loads a GRPO adapter.

An export reads the job's model, adapter and tokenizer only: the fixture deletes the DPO job's pairs
and the GRPO job's reward file once they have trained, as a user tidying up would, and they still
export (the config was refused for them, being re-checked as if to start the job again)."""
import json
import shutil
import zipfile
from pathlib import Path

import pytest
import torch
import yaml

from jobs.export import ExportError, export
from jobs.spec import JobSpec, SpecError
from tests.jobs.export.model_outputs import IDS, folder_logits, load_gguf, logits, peft_logits, stored_as
from tests.jobs.export_jobs import train_job
from tests.jobs.train.method_jobs import PAIRS, grpo_config

# a few steps each (seconds on CPU): enough for the adapters to change the logits by ~0.5 and more
FEW_STEPS = dict(max_steps=3, batch_size=2)


@pytest.fixture(scope="module")
def method_jobs(tmp_path_factory, tiny_model) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("method-jobs")
    inputs = root / "inputs"
    inputs.mkdir()
    pairs = inputs / "pairs.jsonl"
    pairs.write_text("\n".join(json.dumps(row) for row in PAIRS) + "\n")
    grpo = grpo_config(inputs, num_generations=2, max_completion_length=8, **FEW_STEPS)
    jobs = {"dpo": train_job(root, tiny_model, "dpo-job", method="dpo", dataset=str(pairs), learning_rate=5e-3,
                             **FEW_STEPS),
            "grpo": train_job(root, tiny_model, "grpo-job", **grpo)}
    pairs.unlink()
    Path(grpo["reward_file"]).unlink()
    return jobs


@pytest.fixture(scope="module")
def sft_exports(tiny_job, tmp_path_factory) -> dict[str, Path]:
    """The SFT job's three exports, what the other methods' must look like."""
    root = tmp_path_factory.mktemp("sft-exports")
    return {"adapter": export(tiny_job, "adapter", out=root / "a.zip").files[0],
            "merged": export(tiny_job, "merged", out=root / "merged", device="cpu").files[0],
            "gguf": export(tiny_job, "gguf", "f16", out=root / "gguf" / "m.gguf", device="cpu").files[0]}


def zip_names(archive: Path) -> set[str]:
    with zipfile.ZipFile(archive) as zf:
        return set(zf.namelist())


def test_a_grpo_job_whose_reward_file_is_gone_still_exports_adapter_and_merged(method_jobs, tiny_model, tmp_path):
    job = method_jobs["grpo"]
    reward_file = yaml.safe_load((job / "config.yaml").read_text())["reward_file"]
    assert reward_file and not Path(reward_file).exists()
    with pytest.raises(SpecError) as refused:   # starting the job again would need it
        JobSpec.from_yaml(job / "config.yaml")
    assert refused.value.key == "reward_file"
    adapter = export(job, "adapter", out=tmp_path / "a.zip")
    assert [p.name for p in adapter.files] == ["a.zip", "a.gguf"] and adapter.notes == []
    with zipfile.ZipFile(adapter.files[0]) as zf:   # portable: it names the base, as for SFT
        assert json.loads(zf.read("adapter/adapter_config.json"))["base_model_name_or_path"] == str(tiny_model)
    merged = export(job, "merged", device="cpu").files[0]
    assert merged == job / "exports" / "tiny-llama-ft-merged"   # named after the model, not the folder
    torch.testing.assert_close(folder_logits(merged), peft_logits(tiny_model, job / "adapter"), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("method", ["dpo", "grpo"])
def test_the_job_exports_the_adapter_merged_and_gguf_as_an_sft_job_does(method_jobs, sft_exports, tiny_model,
                                                                       method, tmp_path):
    job = method_jobs[method]
    adapter = export(job, "adapter", out=tmp_path / "a.zip")
    assert [p.name for p in adapter.files] == ["a.zip", "a.gguf"] and adapter.notes == []
    assert zip_names(adapter.files[0]) == zip_names(sft_exports["adapter"])

    merged = export(job, "merged", out=tmp_path / "merged", device="cpu").files[0]
    assert {p.name for p in merged.iterdir()} == {p.name for p in sft_exports["merged"].iterdir()}
    expected = peft_logits(tiny_model, job / "adapter")
    assert (expected - folder_logits(tiny_model)).abs().max() > 1e-1   # the adapter changes something
    torch.testing.assert_close(folder_logits(merged), expected, atol=1e-4, rtol=1e-4)

    gguf = export(job, "gguf", "f16", out=tmp_path / "gguf" / "m.gguf", device="cpu")
    assert gguf.files == [tmp_path / "gguf" / "m.gguf", tmp_path / "gguf" / "Modelfile"]
    torch.testing.assert_close(logits(load_gguf(gguf.files[0])), logits(stored_as(merged, "f16")), atol=2e-4,
                               rtol=1e-4)
    modelfile = gguf.files[1].read_text()
    assert modelfile == (sft_exports["gguf"].parent / "Modelfile").read_text()   # same base, same chat
    assert 'TEMPLATE """' in modelfile and 'PARAMETER stop "<|im_end|>"' in modelfile


def test_a_config_broken_for_export_is_still_refused_naming_the_field(method_jobs, tmp_path):
    """Only the files a start reads are let go: a base model that is gone stops the export, by name."""
    job = tmp_path / "job"
    shutil.copytree(method_jobs["grpo"], job, ignore=shutil.ignore_patterns("exports"))
    config = yaml.safe_load((job / "config.yaml").read_text())
    (job / "config.yaml").write_text(yaml.safe_dump({**config, "model": str(tmp_path / "moved-model")}))
    with pytest.raises(ExportError, match=rf"config.yaml: model: {tmp_path / 'moved-model'} is not a Hugging "
                                          r"Face model folder"):
        export(job, "merged", out=tmp_path / "merged", device="cpu")
    assert not (tmp_path / "merged").exists()


def test_the_chat_loader_loads_a_grpo_adapter(method_jobs, tiny_model, tmp_path):
    from peft import PeftModel

    from jobs.models.load import load_for_chat
    adapter = method_jobs["grpo"] / "adapter"
    model, tokenizer = load_for_chat(str(tiny_model), str(adapter), tmp_path)   # what the Chat tab calls
    assert isinstance(model, PeftModel)
    with torch.no_grad():
        tuned = model(IDS).logits.float()
        with model.disable_adapter():   # the base answer beside the tuned one
            base = model(IDS).logits.float()
    torch.testing.assert_close(tuned, peft_logits(tiny_model, adapter))
    torch.testing.assert_close(base, folder_logits(tiny_model))
    assert (tuned - base).abs().max() > 1e-1
    assert tokenizer.eos_token == "<|im_end|>"


def _step_events(job: Path) -> list[dict]:
    return [event for event in map(json.loads, (job / "events.jsonl").read_text().splitlines())
            if event["type"] == "step"]


def test_the_cards_name_the_method_and_its_last_numbers_and_the_merged_card_repeats_them(method_jobs, tmp_path):
    """The adapter's README.md says how it was trained: the method, and the last step's numbers that
    mean something for it (GRPO: its reward, not a loss near 0; DPO: its loss, reward accuracy and
    margin); the merged export's card carries the same line and the config that ran."""
    grpo, dpo = _step_events(method_jobs["grpo"])[-1], _step_events(method_jobs["dpo"])[-1]
    dpo_mean = sum(e["loss"] for e in _step_events(method_jobs["dpo"])) / 3   # the headline is smoothed
    lines = {
        "grpo": f"- Training: grpo, finished after 3 steps, reward_mean {grpo['reward_mean']:.4f} at the last step",
        "dpo": (f"- Training: dpo, finished after 3 steps, final loss {dpo_mean:.4f} (mean of the last 3 steps) "
                f"(reward_accuracy "
                f"{dpo['reward_accuracy']:.4f}, reward_margin {dpo['reward_margin']:.4f} at the last step)")}
    for method, line in lines.items():
        job = method_jobs[method]
        adapter_card = (job / "adapter" / "README.md").read_text()
        assert line in adapter_card.splitlines(), adapter_card
        merged = export(job, "merged", out=tmp_path / method, device="cpu").files[0]
        card = (merged / "README.md").read_text()
        assert line in card.splitlines(), card
        ran = yaml.safe_load(card.split("## Config that ran\n```yaml\n")[1].split("```")[0])
        assert ran == yaml.safe_load((job / "config.yaml").read_text())
    assert "final loss" not in (method_jobs["grpo"] / "adapter" / "README.md").read_text()
    done = [line for line in (method_jobs["grpo"] / "train.log").read_text().splitlines() if "done: 3 steps" in line]
    assert len(done) == 1 and f"reward_mean {grpo['reward_mean']:.4f} at the last step" in done[0]   # the log says it too
