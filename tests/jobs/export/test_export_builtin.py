"""The built-in model's round trip: its shipped GGUF -> fine-tune -> GGUF (+ merged folder), loaded
back by transformers and by the studio's chat loader, answering as the merged model does."""
import pytest
import torch

from jobs.models import builtin as smollm2
from jobs.export import export
from jobs.spec import BUILTIN_MODEL
from tests.jobs.export_jobs import train_job

pytestmark = pytest.mark.slow
PROMPT = [{"role": "user", "content": "What is the capital of France?"}]


def greedy(model, tokenizer, max_new_tokens=12):
    ids = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False)
    return out[0][ids["input_ids"].shape[1]:].tolist(), model(**ids).logits.float()


def test_builtin_gguf_finetune_gguf_round_trip(tmp_path, builtin_seed):
    import gguf
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from jobs.models.load import load_for_chat
    home = builtin_seed.home(tmp_path / "home")   # the model converted once a session
    job = train_job(tmp_path, BUILTIN_MODEL, "builtin", env={"FUSETUNE_HOME": str(home)}, max_steps=2,
                    batch_size=2, max_seq_length=48, learning_rate=1e-3)
    path = export(job, "gguf", "f16", out=tmp_path / "gguf" / "smol.gguf", data_dir=home).files[0]
    folder = export(job, "merged", out=tmp_path / "merged", data_dir=home).files[0]

    exported, shipped = gguf.GGUFReader(str(path)), gguf.GGUFReader(str(smollm2.gguf_path()))
    assert exported.fields["general.architecture"].contents() == "llama"
    assert exported.fields["general.base_model.0.name"].contents() == smollm2.HUB_ID
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.pre", "tokenizer.ggml.eos_token_id"):
        assert exported.fields[key].contents() == shipped.fields[key].contents(), key
    assert "<|im_start|>" in exported.fields["tokenizer.chat_template"].contents()

    merged = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    # transformers' own GGUF loader, its file parsed once for the weights, config and tokenizer (as the
    # studio's conversion does: the same model, without walking the 49k-token vocabulary three times)
    with smollm2._gguf_read_once():
        back = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
        back_tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    merged_tokens, merged_logits = greedy(merged, tokenizer)
    back_tokens, back_logits = greedy(back, back_tokenizer)
    # bf16 merged weights are exact in f16 but for values below f16's normal range (~6e-5)
    assert (back_logits - merged_logits).abs().max() < 0.05
    assert back_tokens == merged_tokens
    chat_model, chat_tokenizer = load_for_chat(str(path), None, home)  # the Chat tab's loader
    assert greedy(chat_model, chat_tokenizer)[0] == merged_tokens
    assert "Paris" in tokenizer.decode(merged_tokens)
