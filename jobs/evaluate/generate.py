"""Base and tuned answers to the same prompts, and the log-probabilities of given answers, on the model
the API server loads (jobs/serve/served.py: the job's base once, its adapter on it, switched off for the
base) and its batch engine (jobs/serve/engine.py: the project's decode loop, jobs/train/decode.py, that
GRPO samples with; greedy at temperature 0)."""
from __future__ import annotations

import torch

from jobs.data.encode import IGNORE_INDEX
from jobs.data.preference import encode_answer
from jobs.data.prompts import render
from jobs.serve.engine import Engine, adapter_on
from jobs.serve.rows import Row, Sampling
from jobs.serve.served import Served, ServedModel


def prompt_ids(tokenizer, prompt, room: int) -> list[int]:
    """The prompt's tokens as the model sees it (chat messages through its template), its last `room`
    tokens when longer, as jobs/data/prompts.py encode_prompts keeps a GRPO prompt's end."""
    if isinstance(prompt, str) or not getattr(tokenizer, "chat_template", None):
        text = prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt)
        ids = tokenizer(text)["input_ids"]
    else:
        ids = tokenizer(render(tokenizer, prompt), add_special_tokens=False)["input_ids"]
    return ids[-room:]


class Generator:
    """Answers of one served model id (the base or the tuned adapter) for a batch of prompts."""

    def __init__(self, served: Served, max_new_tokens: int, temperature: float, seed: int, log=None):
        self.served, self.engine = served, Engine(served.model, log=log)
        self.sampling = Sampling(temperature=temperature, top_p=1.0, max_tokens=max_new_tokens,
                                 seed=seed if temperature > 0 else None)
        self.room = max(1, served.context - max_new_tokens)

    def answers(self, model: ServedModel, prompts: list, cancelled=lambda: False) -> list[tuple[str, int]]:
        """(text, generated tokens) per prompt; EOS ends an answer, max_new_tokens cuts it."""
        rows = [Row(i, prompt_ids(model.tokenizer, p, self.room), self.sampling.max_tokens, [])
                for i, p in enumerate(prompts)]
        self.engine.run(rows, self.sampling, model.adapter, model.tokenizer, on_column=lambda _rows: None,
                        cancelled=cancelled)
        return [(r.text, len(r.tokens)) for r in rows]

    @torch.inference_mode()
    def answer_logprob(self, model: ServedModel, prompt: list, answer: list) -> float:
        """Sum of the log-probabilities of the answer's tokens after the prompt (what DPO's implicit
        reward compares, TRL's `concatenated_forward`)."""
        example = encode_answer(model.tokenizer, prompt, answer, self.served.context)
        ids = torch.tensor([example.input_ids], device=self.served.device)
        with adapter_on(self.served.model, model.adapter):
            logits = self.served.model(input_ids=ids).logits[0, :-1].float()
        labels = torch.tensor(example.labels[1:], device=logits.device)
        keep = labels != IGNORE_INDEX
        picked = logits.log_softmax(-1)[keep].gather(1, labels[keep].unsqueeze(1))
        return float(picked.sum())

    def margin(self, model: ServedModel, prompt: list, chosen: list, rejected: list) -> float:
        """log p(chosen) - log p(rejected): above 0 the model prefers the chosen answer."""
        return self.answer_logprob(model, prompt, chosen) - self.answer_logprob(model, prompt, rejected)
