"""The chat engine behind the Chat tab: load a base model (+ a job's LoRA adapter), stream replies.

Models come from jobs.models.load_for_chat and stay in a small LRU cache (loading is the slow
part; one model by default, since a training job may be sharing the GPU). With an adapter the model is a PeftModel; the base model's answer is generated from the
same weights inside ``model.disable_adapter()`` (PEFT's documented way to run the base), so a
comparison never holds two copies of the base. Generation runs in a worker thread feeding a
transformers TextIteratorStreamer (the pattern from the transformers streaming docs); one lock
serialises generations because disable_adapter and the global seed are model/process state.
"""
from __future__ import annotations

import contextlib
import gc
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
# The defining submodules, not the lazy top-level `transformers` names: app.py may be importing
# transformers in another thread at the same moment, and the lazy attribute lookup is not safe
# against that (seen as "cannot import name 'StoppingCriteria' from 'transformers'").
from transformers.generation.stopping_criteria import StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import TextIteratorStreamer

from jobs.encode import ensure_chat_template

Loader = Callable[[str, "str | None", Path], tuple[Any, Any]]


@dataclass
class Sampling:
    """The settings both answers share, so base and tuned are compared like for like."""

    temperature: float = 0.7
    top_p: float = 0.9
    max_new_tokens: int = 128
    seed: int = 0

    def generate_kwargs(self) -> dict[str, Any]:
        if self.temperature <= 0:
            return {"do_sample": False, "max_new_tokens": int(self.max_new_tokens)}
        return {"do_sample": True, "temperature": float(self.temperature),
                "top_p": float(self.top_p), "max_new_tokens": int(self.max_new_tokens)}


def message_text(content: Any) -> str:
    """The text of one Chatbot message content: a str or Gradio 6's list of typed parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        return str(content.get("text", "")) if content.get("type", "text") == "text" else ""
    if isinstance(content, (list, tuple)):
        return "".join(message_text(part) for part in content)
    return ""


def history_to_messages(history: list[dict[str, Any]], system: str = "") -> list[dict[str, str]]:
    """Chatbot history -> chat-template messages: role/content strings only, empty turns dropped,
    notices (messages with metadata, e.g. "loading model") left out."""
    messages = [{"role": "system", "content": system}] if system.strip() else []
    for message in history or []:
        if message.get("metadata") or message.get("role") not in ("user", "assistant", "system"):
            continue
        text = message_text(message.get("content"))
        if text.strip():
            messages.append({"role": message["role"], "content": text})
    return messages


def render_prompt(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    """The prompt text: the tokenizer's chat template, or a plain transcript if it has none."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    lines = [f"{m['role'].capitalize()}: {m['content']}" for m in messages]
    return "\n".join(lines + ["Assistant:"])


class _StopWhenSet(StoppingCriteria):
    """Stops generate() when the reader went away (browser closed, new prompt)."""

    def __init__(self, event: threading.Event):
        self.event = event

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        return torch.full((input_ids.shape[0],), self.event.is_set(), dtype=torch.bool,
                          device=input_ids.device)


class ChatEngine:
    """Loads, caches and streams from chat models. Thread-safe; nothing starts until used."""

    def __init__(self, data_dir: Path, loader: Loader | None = None, capacity: int = 1):
        self.data_dir = Path(data_dir)
        self.capacity = max(1, capacity)
        self._loader = loader
        self._cache: OrderedDict[tuple[str, str | None], tuple[Any, Any]] = OrderedDict()
        self._cache_lock = threading.Lock()
        self._generate_lock = threading.Lock()

    def _load_fn(self) -> Loader:
        if self._loader is None:
            from jobs.models import load_for_chat  # heavy import, only when a chat happens
            self._loader = load_for_chat
        return self._loader

    def is_loaded(self, model_id: str, adapter_dir: str | None) -> bool:
        return (model_id, adapter_dir or None) in self._cache

    def load(self, model_id: str, adapter_dir: str | None) -> tuple[Any, Any]:
        """(model, tokenizer), from the cache or loaded now; evicts the least recently used."""
        key = (model_id, adapter_dir or None)
        with self._cache_lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
            while len(self._cache) >= self.capacity:
                self._cache.popitem(last=False)
                gc.collect()
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
            model, tokenizer = self._load_fn()(model_id, adapter_dir or None, self.data_dir)
            model.eval()
            ensure_chat_template(tokenizer)  # the ChatML fallback training used for template-less models
            self._cache[key] = (model, tokenizer)
            return model, tokenizer

    def stream(self, model_id: str, adapter_dir: str | None, messages: list[dict[str, str]],
               sampling: Sampling, use_adapter: bool = True) -> Iterator[str]:
        """Yield the reply so far (cumulative text) as tokens arrive.

        use_adapter=False with an adapter_dir gives the base model's answer from the same
        loaded PeftModel, adapter switched off for this one generation.
        """
        model, tokenizer = self.load(model_id, adapter_dir)
        prompt = render_prompt(tokenizer, messages)
        inputs = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).to(model.device)
        streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
        stop, failure = threading.Event(), []
        worker = threading.Thread(
            target=self._generate, daemon=True,
            args=(model, tokenizer, inputs, streamer, sampling, use_adapter, stop, failure))
        worker.start()
        text = ""
        try:
            for piece in streamer:
                text += piece
                yield text
        finally:
            stop.set()  # a closed generator (client gone) stops generate at the next token
        worker.join()
        if failure:
            raise RuntimeError(f"generation failed: {failure[0]}") from failure[0]

    def _generate(self, model: Any, tokenizer: Any, inputs: Any, streamer: TextIteratorStreamer,
                  sampling: Sampling, use_adapter: bool, stop: threading.Event,
                  failure: list[BaseException]) -> None:
        base_only = not use_adapter and hasattr(model, "disable_adapter")
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        try:
            with self._generate_lock:
                torch.manual_seed(int(sampling.seed))
                switch = model.disable_adapter() if base_only else contextlib.nullcontext()
                with switch, torch.inference_mode():
                    model.generate(**inputs, streamer=streamer, pad_token_id=pad_id,
                                   stopping_criteria=StoppingCriteriaList([_StopWhenSet(stop)]),
                                   **sampling.generate_kwargs())
        except Exception as exc:  # reported by stream() in the caller's thread
            failure.append(exc)
        finally:
            streamer.end()
