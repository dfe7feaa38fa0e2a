"""`--format merged`: a folder transformers loads by itself whose logits equal base + adapter, streamed
shard by shard, written atomically (a full disk leaves nothing behind)."""
import errno
import json
import subprocess
import sys

import pytest
import torch

from jobs.export import ExportError, export
from jobs.export import merge as merge_module
from tests.conftest import ROOT
from tests.jobs.export.model_outputs import IDS, folder_logits, peft_logits

def test_cli_writes_a_merged_folder_equal_to_base_plus_adapter(tiny_job, tiny_model, tmp_path):
    out = tmp_path / "merged"
    proc = subprocess.run([sys.executable, "-m", "jobs.export", str(tiny_job), "--format", "merged",
                           "--out", str(out), "--device", "cpu"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "[100%]" in proc.stdout and f"exported: {out} (" in proc.stdout
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md"} <= names
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert "<|im_start|>" in tokenizer.chat_template
    assert json.loads((out / "config.json").read_text())["dtype"] == "float32"  # the base's, on CPU
    merged, reference = folder_logits(out), peft_logits(tiny_model, tiny_job / "adapter")
    base = folder_logits(tiny_model)
    assert (reference - base).abs().max() > 1e-2  # the adapter changes something worth checking
    torch.testing.assert_close(merged, reference, atol=1e-4, rtol=1e-4)
    assert not list(tmp_path.glob(".*"))


def test_many_shards_with_an_index_load_the_same(tiny_job, tiny_model, tmp_path, monkeypatch):
    monkeypatch.setattr(merge_module, "MAX_SHARD_BYTES", 60_000)
    out = export(tiny_job, "merged", out=tmp_path / "sharded", device="cpu").files[0]
    shards = sorted(out.glob("model-*-of-*.safetensors"))
    assert len(shards) > 3
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {s.name for s in shards}
    torch.testing.assert_close(folder_logits(out), peft_logits(tiny_model, tiny_job / "adapter"),
                               atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("failure", [OSError(errno.ENOSPC, "No space left on device"),
                                     RuntimeError("Error while serializing: IoError(Os { code: 28, kind: "
                                                  "StorageFull, message: \"No space left on device\" })")])
def test_disk_full_mid_export_leaves_nothing_under_the_final_name(tiny_job, tmp_path, monkeypatch, failure):
    """safetensors reports a full disk as a RuntimeError with the Rust io error in its text."""
    monkeypatch.setattr(merge_module, "MAX_SHARD_BYTES", 60_000)
    written = []
    real_save = merge_module._save_shard

    def save_then_fill_up(tensors, path):
        if written:
            raise failure
        real_save(tensors, path)
        written.append(path)

    monkeypatch.setattr(merge_module, "_save_shard", save_then_fill_up)
    out = tmp_path / "exports" / "merged"
    with pytest.raises(ExportError, match="nothing was left behind.*No space left on device"):
        export(tiny_job, "merged", out=out, device="cpu")
    assert written and not written[0].exists()  # the shard that did fit was removed too
    assert not (tmp_path / "exports").exists()   # and the folder the export made for it


def test_too_little_free_space_is_refused_before_writing(tiny_job, tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _path: usage(10**9, 10**9, 1000))
    with pytest.raises(ExportError, match="not enough disk space.*needs about"):
        export(tiny_job, "merged", out=tmp_path / "merged", device="cpu")
    assert not (tmp_path / "merged").exists()


def test_qlora_job_merges_into_the_dequantized_base(tmp_path, tiny_model):
    from tests.jobs.export_jobs import train_job
    job = train_job(tmp_path, tiny_model, "qlora", load_in_4bit=True)
    result = export(job, "merged", out=tmp_path / "merged", device="cpu")
    assert any("dequantized base" in note for note in result.notes)
    assert "dequantized base" in (tmp_path / "merged" / "README.md").read_text()
    from transformers import BitsAndBytesConfig
    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                               bnb_4bit_compute_dtype=torch.float32)
    trained = peft_logits(tiny_model, job / "adapter", quantization_config=quant, dtype=torch.float32,
                          device_map={"": "cpu"})
    merged = folder_logits(tmp_path / "merged")
    torch.testing.assert_close(merged, trained, atol=2e-4, rtol=2e-4)
    # and it is not the same as merging into the original full-precision weights
    full = peft_logits(tiny_model, job / "adapter")
    assert (full - trained).abs().max() > 10 * (merged - trained).abs().max()


def test_a_job_folder_without_adapter_is_refused(tmp_path, tiny_model):
    (tmp_path / "config.yaml").write_text(f"model: {tiny_model}\n")
    with pytest.raises(ExportError, match="no finished adapter"):
        export(tmp_path, "merged", device="cpu")


def test_merged_dtype_is_bf16_on_a_gpu_and_the_base_dtype_otherwise():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert merge_module.output_dtype(torch.float32, cuda) == torch.bfloat16
    assert merge_module.output_dtype(torch.float16, cuda) == torch.bfloat16
    assert merge_module.output_dtype(torch.float32, cpu) == torch.float32
    assert merge_module.output_dtype(torch.bfloat16, cpu) == torch.bfloat16
    assert merge_module.output_dtype(torch.int64, cuda) == torch.int64


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_merge_is_bf16_and_equals_the_rounded_peft_merge(tiny_job, tiny_model, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    out = export(tiny_job, "merged", out=tmp_path / "merged").files[0]
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    reference = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model), tiny_job / "adapter")
    reference = reference.merge_and_unload().to(torch.bfloat16).float()
    with torch.no_grad():
        expected = reference(IDS).logits.float()
    # deltas computed on the GPU can round a few weights to the neighbouring bf16 value
    torch.testing.assert_close(folder_logits(out), expected, atol=5e-2, rtol=1e-2)
