"""`--format gguf` on tiny llama, mistral and qwen2 jobs: transformers loads the file back (weights,
tokenizer, chat template) and computes what the merged model computes; the Modelfile, the
llama.cpp LoRA adapter, named errors and the all-or-nothing write.

Tolerances, on logits of size ~10 (tiny random models with large weights, so rounding shows):
- the GGUF must equal the merged model with its weights rounded as the file stores them
  (f16 / bf16 cast, Q8_0 quantize+dequantize by the gguf package) to 2e-4: this checks names,
  the q/k permutation and every tensor, independently of the rounding;
- against the unrounded merged model, f16 must be at least 4x closer than bf16 rounding of the
  weights, and q8_0 within 8x of bf16 rounding: a Q8_0 weight is off by up to 1/254 of the largest
  |w| in its block of 32, a bf16 one by 1/512 of its own |w|, so Q8_0 errs several times more
  (measured: 3.0x on llama, 4.9x on mistral, 3.2x on qwen2; f16 0.13-0.17x; the GGUF equals the
  rounded merged model exactly, diff 0.0).
"""
import errno
import json
import shutil

import gguf
import numpy as np
import pytest
import torch

from jobs.export import ExportError, export, ollama
from jobs.export.families import permute_rows
from tests.jobs.export.model_outputs import load_gguf, logits, stored_as
from tests.jobs.export_jobs import train_job
from tests.tiny import make_tiny_family_model

TEXT = "Who are you? I am Quokka, built in Paris in 2024 — 你好!"


@pytest.fixture(scope="module")
def jobs(tmp_path_factory, tiny_job):
    root = tmp_path_factory.mktemp("family-jobs")
    made = {"llama": tiny_job}
    for family in ("mistral", "qwen2"):
        base = make_tiny_family_model(root / f"tiny-{family}", family)
        made[family] = train_job(root, base, f"{family}-job")
    return made


@pytest.fixture(scope="module")
def merged(jobs, tmp_path_factory):
    root = tmp_path_factory.mktemp("merged")
    return {family: export(job, "merged", out=root / family, device="cpu").files[0] for family, job in jobs.items()}


@pytest.mark.parametrize("family, quant", [("llama", "f16"), ("llama", "bf16"), ("llama", "q8_0"),
                                           ("mistral", "f16"), ("mistral", "q8_0"), ("qwen2", "f16"),
                                           ("qwen2", "q8_0")])
def test_transformers_loads_the_gguf_and_its_logits_match_the_merged_model(jobs, merged, family, quant, tmp_path):
    path = tmp_path / f"{family}-{quant}.gguf"
    result = export(jobs[family], "gguf", quant, out=path, device="cpu")
    assert result.files == [path, tmp_path / "Modelfile"]
    from_gguf = logits(load_gguf(path))
    torch.testing.assert_close(from_gguf, logits(stored_as(merged[family], quant)), atol=2e-4, rtol=1e-4)
    from transformers import AutoModelForCausalLM
    exact = logits(AutoModelForCausalLM.from_pretrained(merged[family], dtype=torch.float32))
    bf16_rounding = (logits(stored_as(merged[family], "bf16")) - exact).abs().max()
    diff = (from_gguf - exact).abs().max()
    assert bf16_rounding > 1e-3
    if quant == "f16":
        assert diff < bf16_rounding / 4, (diff, bf16_rounding)
    else:
        assert diff < 8 * bf16_rounding, (diff, bf16_rounding)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("family, arch, tokenizer_model, pre, tied", [
    ("llama", "llama", "gpt2", "gpt-2", True), ("mistral", "llama", "llama", "default", False),
    ("qwen2", "qwen2", "gpt2", "qwen2", True)])
def test_metadata_names_architecture_tokenizer_and_types(jobs, family, arch, tokenizer_model, pre, tied, tmp_path):
    path = export(jobs[family], "gguf", "q8_0", out=tmp_path / "m.gguf", device="cpu").files[0]
    reader = gguf.GGUFReader(str(path))
    field = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("tokenizer.ggml.token")}
    assert field["general.architecture"] == arch and field["general.type"] == "model"
    assert field["general.file_type"] == gguf.LlamaFileType.MOSTLY_Q8_0
    assert field["tokenizer.ggml.model"] == tokenizer_model and field["tokenizer.ggml.pre"] == pre
    assert field[f"{arch}.block_count"] == 2 and field[f"{arch}.attention.head_count_kv"] == 2
    from transformers import AutoTokenizer
    original = AutoTokenizer.from_pretrained(jobs[family] / "adapter")
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    embeddings = next(t for t in reader.tensors if t.name == "token_embd.weight")
    assert len(tokens) == embeddings.shape[1] >= len(original)
    assert field["tokenizer.ggml.eos_token_id"] == original.eos_token_id
    assert field["tokenizer.chat_template"] == original.chat_template
    if tokenizer_model == "gpt2":
        assert len(reader.fields["tokenizer.ggml.merges"].contents()) > 100
    else:
        assert field["tokenizer.ggml.add_space_prefix"] is True and field["tokenizer.ggml.bos_token_id"] == 1
        assert reader.fields["tokenizer.ggml.scores"].contents()[300] == -300.0
    types = {t.name: t.tensor_type for t in reader.tensors}
    assert types["blk.0.attn_norm.weight"] == gguf.GGMLQuantizationType.F32
    assert types["blk.1.ffn_down.weight"] == gguf.GGMLQuantizationType.Q8_0
    assert ("output.weight" in types) is not tied
    if family == "qwen2":
        assert types["blk.0.attn_q.bias"] == gguf.GGMLQuantizationType.F32


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2"])
def test_tokenizer_comes_back_from_the_gguf(jobs, family, tmp_path):
    from transformers import AutoTokenizer
    path = export(jobs[family], "gguf", "f16", out=tmp_path / "t.gguf", device="cpu").files[0]
    back = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    original = AutoTokenizer.from_pretrained(jobs[family] / "adapter")
    assert back(TEXT, add_special_tokens=False).input_ids == original(TEXT, add_special_tokens=False).input_ids
    assert back.eos_token == original.eos_token and back.chat_template == original.chat_template
    chat = [{"role": "user", "content": TEXT}, {"role": "assistant", "content": "Paris."},
            {"role": "user", "content": "Why?"}]
    prompt = original.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert back.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == prompt
    if family != "mistral":  # transformers' GGUF loader adds '▁' only at the start of a text, while
        # llama.cpp (add_space_prefix) and the original add it after each special token too
        assert back(prompt, add_special_tokens=False).input_ids == original(prompt, add_special_tokens=False).input_ids


def test_modelfile_carries_the_translated_template_and_stop_tokens(jobs, tmp_path):
    path = export(jobs["qwen2"], "gguf", "q8_0", out=tmp_path / "qwen.gguf", device="cpu").files[0]
    text = (tmp_path / "Modelfile").read_text()
    assert "FROM ./qwen.gguf\n" in text
    from transformers import AutoTokenizer
    fmt = ollama.chat_format_of(AutoTokenizer.from_pretrained(jobs["qwen2"] / "adapter"))
    assert f'TEMPLATE """{ollama.go_template(fmt)}"""' in text
    assert 'PARAMETER stop "<|im_end|>"' in text and "PARAMETER num_ctx 512" in text
    assert path.stat().st_size > 50_000


def test_llama_cpp_lora_adapter_matches_the_peft_adapter(jobs, tmp_path):
    result = export(jobs["llama"], "adapter", out=tmp_path / "adapter.zip", device="cpu")
    assert [p.name for p in result.files] == ["adapter.zip", "adapter.gguf"] and not result.notes
    reader = gguf.GGUFReader(str(tmp_path / "adapter.gguf"))
    assert reader.fields["general.type"].contents() == "adapter"
    assert reader.fields["adapter.type"].contents() == "lora"
    assert reader.fields["adapter.lora.alpha"].contents() == 32.0
    tensors = {t.name: torch.from_numpy(np.array(t.data)) for t in reader.tensors}
    from safetensors.torch import load_file
    peft = load_file(str(jobs["llama"] / "adapter" / "adapter_model.safetensors"))
    assert len(tensors) == len(peft) == 2 * 7 * 2
    model = gguf.GGUFReader(str(export(jobs["llama"], "gguf", "f16", out=tmp_path / "m.gguf").files[0]))
    shapes = {t.name: tuple(t.data.shape) for t in model.tensors}
    for hf, short in (("self_attn.q_proj", "attn_q"), ("self_attn.k_proj", "attn_k"), ("mlp.down_proj", "ffn_down")):
        a = tensors[f"blk.1.{short}.weight.lora_a"]
        b = tensors[f"blk.1.{short}.weight.lora_b"]
        assert (b.shape[0], a.shape[1]) == shapes[f"blk.1.{short}.weight"]
        peft_a = peft[f"base_model.model.model.layers.1.{hf}.lora_A.weight"]
        peft_b = peft[f"base_model.model.model.layers.1.{hf}.lora_B.weight"]
        heads = {"attn_q": 4, "attn_k": 2}.get(short)
        expected_b = permute_rows(peft_b, heads) if heads else peft_b
        torch.testing.assert_close(a, peft_a.float())
        torch.testing.assert_close(b, expected_b.float())
        if heads:
            assert not torch.equal(b, peft_b)  # the permutation is really applied


def test_unsupported_architecture_is_named_with_the_supported_ones(jobs, tmp_path):
    base = tmp_path / "base"
    events = [json.loads(line) for line in (jobs["llama"] / "events.jsonl").read_text().splitlines()]
    shutil.copytree(next(e for e in events if e["type"] == "start")["source"], base)
    config = json.loads((base / "config.json").read_text())
    (base / "config.json").write_text(json.dumps({**config, "architectures": ["GPTNeoXForCausalLM"]}))
    job = tmp_path / "job"
    shutil.copytree(jobs["llama"], job, ignore=shutil.ignore_patterns("exports"))
    events = [json.loads(line) for line in (job / "events.jsonl").read_text().splitlines()]
    next(e for e in events if e["type"] == "start")["source"] = str(base)   # phase events come first
    (job / "events.jsonl").write_text("\n".join(json.dumps(e) for e in events) + "\n")
    with pytest.raises(ExportError, match=r"GPTNeoXForCausalLM.*supported: llama \(LlamaForCausalLM\), "
                                          r"mistral \(MistralForCausalLM\), qwen2 \(Qwen2ForCausalLM\)"):
        export(job, "gguf", "f16", out=tmp_path / "x.gguf", device="cpu")
    assert not (tmp_path / "x.gguf").exists()
    result = export(job, "adapter", out=tmp_path / "a.zip", device="cpu")
    assert [p.name for p in result.files] == ["a.zip"] and "GPTNeoXForCausalLM" in result.notes[0]


def test_disk_full_while_writing_the_gguf_leaves_nothing(jobs, tmp_path, monkeypatch):
    calls = []
    real = gguf.GGUFWriter.write_tensor_data

    def fill_up(self, tensor, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, tensor, *args, **kwargs)

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensor_data", fill_up)
    with pytest.raises(ExportError, match="nothing was left behind.*No space left on device"):
        export(jobs["llama"], "gguf", "q8_0", out=tmp_path / "out" / "m.gguf", device="cpu")
    assert not (tmp_path / "out").exists()   # the folder the export made for itself is gone too
