"""The method jobs the tests share: preference pairs a tiny model can learn, a GRPO job whose reward file
rewards one letter, and that GRPO job as an in-process Trainer (for cancel and budget tests)."""
import json

from jobs.io.events import EventWriter
from jobs.spec import JobSpec
from jobs.train.loop import Trainer

PAIRS = [{"prompt": f"What is {i} plus {i}?", "chosen": f"{2 * i}.",
          "rejected": f"Hmm, it could be {2 * i + 1}, or maybe not; hard to say."} for i in range(12)]

LETTER_REWARD = '''
def letter_e(prompts, completions, **columns):
    """The share of the completion's characters that are the letter e."""
    texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]
    return [t.count("e") / max(1, len(t)) for t in texts]
'''


def grpo_config(tmp_path, **overrides):
    data = tmp_path / "prompts.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": f"Tell me about item {i}.", "item": i}) for i in range(32)))
    rewards = tmp_path / "letter.py"
    rewards.write_text(LETTER_REWARD)
    return {"method": "grpo", "dataset": str(data), "reward_file": str(rewards), "max_steps": 20,
            "learning_rate": 2e-2, "batch_size": 2, "num_generations": 8, "max_completion_length": 16,
            "max_seq_length": 64, "save_steps": 0, "warmup_steps": 0, "beta": 0.0, **overrides}


def grpo_trainer(tmp_path, tiny_model, sinks=(), name="job", **overrides) -> Trainer:
    """An in-process GRPO Trainer on the letter-reward task (fp32, 2 completions of 8 tokens, 50 steps
    unless `overrides` say otherwise), its events written to tmp_path/NAME and to `sinks`."""
    job = tmp_path / name
    config = grpo_config(tmp_path, **{"max_steps": 50, "num_generations": 2, "max_completion_length": 8,
                                      "dtype": "fp32", "temperature": 1.0, **overrides})
    spec = JobSpec.from_dict({"model": str(tiny_model), "output_dir": str(job), **config})
    return Trainer(spec, job, EventWriter(job, sinks=list(sinks)), log=lambda line: None)
