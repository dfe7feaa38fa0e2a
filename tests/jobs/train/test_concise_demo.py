"""The built-in preference demo (issue 19 item 6): DPO on builtin:concise with the default settings on
the built-in model, in under a third of the default steps (STEPS), makes its answers to held-out
prompts shorter, and the facts stay ("Paris").

What a user does: Train tab, method dpo (the dataset becomes builtin:concise), Start; then Chat,
base beside tuned. Here: the same JobSpec through `python -m jobs.train`, then greedy answers of the
base (adapter off) and the tuned model to prompts it never trained on (concise.HELDOUT_PROMPTS)."""
import os
import statistics
import subprocess
import sys

import pytest
import torch
import yaml

from jobs.data.builtin.concise import HELDOUT_PROMPTS
from jobs.models.load import load_for_chat
from jobs.spec import BUILTIN_CONCISE, BUILTIN_MODEL
from tests.conftest import ROOT

pytestmark = pytest.mark.slow

# Issue 41: 18 steps (the default is 60) and 64 new tokens (was 96): the run was most of this test's
# minutes, and the base answers still run to the cap while the tuned ones end long before it.
# measured (2 shared CPU cores, one thread): mean 304 -> 129 characters (-58 %) at 18 steps, Paris kept;
# 304 -> 89 (-71 %) at 30 steps; 439 -> 92 (-79 %) at 60 steps and 96 tokens
# Each pair's prompt once in a padded row (jobs/data/shared_prefix.py): the same 304 -> 129, this test
# 109 -> 91 s.
STEPS = 18
MAX_NEW_TOKENS = 64
SHORTER_BY = 0.25   # the tuned answers' mean length is at least 25 % below the base model's


def answers(model, tokenizer, questions: list[str]) -> list[str]:
    """Greedy answers, one batch (left padding, as jobs/data/builtin/general.py generates)."""
    tokenizer.padding_side = "left"
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                           add_generation_prompt=True) for q in questions]
    inputs = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id)
    return [tokenizer.decode(row[inputs["input_ids"].shape[1]:], skip_special_tokens=True).strip() for row in out]


def test_dpo_on_the_builtin_set_shortens_answers_and_keeps_the_facts(tmp_path, builtin_seed):
    builtin_seed.home(tmp_path, answers=True)   # the model and its base answers, made once a session
    out = tmp_path / "concise-job"
    path = tmp_path / "concise.yaml"
    path.write_text(yaml.safe_dump({"output_dir": str(out), "method": "dpo", "dataset": BUILTIN_CONCISE,
                                    "max_steps": STEPS}))
    env = {**os.environ, "FUSETUNE_HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "jobs.train", str(path)], cwd=ROOT, timeout=3000,
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "builtin:concise:" in proc.stdout + proc.stderr   # the set says how many pairs it made

    model, tokenizer = load_for_chat(BUILTIN_MODEL, str(out / "adapter"), tmp_path)
    tuned = answers(model, tokenizer, HELDOUT_PROMPTS)
    with model.disable_adapter():
        base = answers(model, tokenizer, HELDOUT_PROMPTS)
    report = "\n".join(f"{q}\n  base ({len(b)}): {b}\n  tuned ({len(t)}): {t}"
                       for q, b, t in zip(HELDOUT_PROMPTS, base, tuned))
    print(report)   # seen with -s: what changed, prompt by prompt
    base_mean, tuned_mean = statistics.mean(map(len, base)), statistics.mean(map(len, tuned))
    assert tuned_mean <= (1 - SHORTER_BY) * base_mean, f"mean {tuned_mean:.0f} vs {base_mean:.0f}\n{report}"
    assert "Paris" in base[0] and "Paris" in tuned[0], report   # HELDOUT_PROMPTS[0]: the capital of France
    assert all(len(t) > 0 for t in tuned), report               # shorter, not silent
