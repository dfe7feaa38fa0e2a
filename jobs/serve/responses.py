"""Response bodies in OpenAI's shapes: `chat.completion` / `chat.completion.chunk` and
`text_completion` (whole and streamed), with `usage` counted in tokens."""
from __future__ import annotations

import json
import time
import uuid


class Answer:
    """What one request has produced so far, from the scheduler's events (scheduler.Generation)."""

    def __init__(self, kind: str, model: str, choices: int, prompt_tokens: int):
        self.kind, self.model = kind, model          # kind: "chat" or "completion"
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.texts = [""] * choices
        self.finish: list[str | None] = [None] * choices
        self.tokens = [0] * choices
        self.prompt_tokens = prompt_tokens

    def add(self, index: int, text: str, finish: str | None, tokens: int) -> None:
        self.texts[index] += text
        self.finish[index] = finish or self.finish[index]
        self.tokens[index] = tokens

    @property
    def usage(self) -> dict:
        completion = sum(self.tokens)
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion,
                "total_tokens": self.prompt_tokens + completion}

    def _head(self, streamed: bool) -> dict:
        kind = {"chat": "chat.completion", "completion": "text_completion"}[self.kind]
        if streamed and self.kind == "chat":
            kind += ".chunk"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def body(self) -> dict:
        """The whole (non-streamed) response."""
        if self.kind == "chat":
            choices = [{"index": i, "message": {"role": "assistant", "content": text}, "logprobs": None,
                        "finish_reason": self.finish[i]} for i, text in enumerate(self.texts)]
        else:
            choices = [{"index": i, "text": text, "logprobs": None, "finish_reason": self.finish[i]}
                       for i, text in enumerate(self.texts)]
        return {**self._head(False), "choices": choices, "usage": self.usage}

    def chunk(self, index: int, text: str | None, finish: str | None, role: bool = False) -> str:
        """One server-sent event carrying a piece of choice `index`."""
        if self.kind == "chat":
            delta = ({"role": "assistant", "content": ""} if role else {}) | ({"content": text} if text else {})
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": index, "text": text or "", "logprobs": None, "finish_reason": finish}
        return sse({**self._head(True), "choices": [choice]})

    def usage_chunk(self) -> str:
        return sse({**self._head(True), "choices": [], "usage": self.usage})


def sse(payload: dict | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n"
