"""The chat engine behind the Chat tab: load a base model (+ a job's LoRA adapter), stream replies.

Models come from jobs.models.load.load_for_chat and stay in a small LRU cache (loading is the slow
part; one model by default, since a training job may be sharing the GPU). With an adapter the model
is a PeftModel, and the base and tuned answers come from ONE batched generate: PEFT's mixed
adapter batches (``adapter_names``, where ``"__base__"`` runs a row without any adapter; PEFT docs,
"Inference with different LoRA adapters in the same batch") give each row its own adapter, so both
answers stream at the same time from one copy of the weights. `BatchStreamer` splits the batch's
tokens into one growing text per row (transformers' TextIteratorStreamer handles one row only).
One lock serialises generations: PEFT's per-call forward hooks and the global seed are
model/process state.
"""
from __future__ import annotations

import gc
import queue
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
from transformers.generation.streamers import BaseStreamer

from jobs.data.encode import ensure_chat_template

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

    def __init__(self, data_dir: Path, loader: Loader | None = None, capacity: int = 1,
                 base_tokenizer_loader: Callable[[str, Path], Any] | None = None):
        self.data_dir = Path(data_dir)
        self.capacity = max(1, capacity)
        self._loader = loader
        self._base_tokenizer_loader = base_tokenizer_loader or _load_base_tokenizer
        self._cache: OrderedDict[tuple[str, str | None], tuple[Any, Any]] = OrderedDict()
        self._cache_lock = threading.Lock()
        self._generate_lock = threading.Lock()
        self._base_tokenizers: dict[str, Any] = {}
        self.released_for = ""   # the job the models were last unloaded for (the Chat tab says so)

    def _load_fn(self) -> Loader:
        if self._loader is None:
            from jobs.models.load import load_for_chat  # heavy import, only when a chat happens
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

    def prompt(self, model_id: str, adapter_dir: str | None, messages: list[dict[str, str]],
               use_adapter: bool = True, base_template: bool = False) -> str:
        """The prompt text of one row. The tuned row uses the adapter's tokenizer (its default system
        line names the bot); the base row uses the base model's own tokenizer and template, so that
        the base answers as it would alone (issue 22 item 4: it was given the tuned system line).
        `base_template`: the tuned row too, as a serving stack loads the adapter (issue 42)."""
        _, tokenizer = self.load(model_id, adapter_dir)
        if adapter_dir and (not use_adapter or base_template):
            tokenizer = self.base_tokenizer(model_id)
        return render_prompt(tokenizer, messages)

    def base_tokenizer(self, model_id: str) -> Any:
        with self._cache_lock:
            if model_id not in self._base_tokenizers:
                tokenizer = self._base_tokenizer_loader(model_id, self.data_dir)
                ensure_chat_template(tokenizer)
                self._base_tokenizers[model_id] = tokenizer
            return self._base_tokenizers[model_id]

    # ---- the studio's share of the GPU (jobs/placement.StudioGpuUse, used by the runner) -------
    def held_gb(self) -> dict[int, float]:
        """GiB the chat models hold per GPU: the caching allocator's reserve on every GPU a cached
        model sits on (what unloading gives back; the CUDA context stays). Never waits for a load
        in progress (the runner asks every second)."""
        try:
            models = [model for model, _ in tuple(self._cache.values())]
        except RuntimeError:   # the cache changed while being read: ask again next time
            return {}
        devices = {p.device.index or 0 for model in models for p in list(model.parameters())[:1]
                   if p.device.type == "cuda"}
        return {index: torch.cuda.memory_reserved(index) / 2 ** 30 for index in sorted(devices)}

    def can_release(self) -> bool:
        """Not while a reply is being generated or a model is loading."""
        return not (self._generate_lock.locked() or self._cache_lock.locked())

    def release(self, reason: str) -> bool:
        """Unload every cached model to make room for `reason` (a job); False while a reply is
        being generated or a model loads. The next chat loads the model again and says why it
        had gone."""
        if not self._generate_lock.acquire(blocking=False):
            return False
        try:
            if not self._cache_lock.acquire(blocking=False):
                return False
            try:
                if not self._cache:
                    return True
                self._cache.clear()
                self.released_for = reason
            finally:
                self._cache_lock.release()
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            return True
        finally:
            self._generate_lock.release()

    def stream(self, model_id: str, adapter_dir: str | None, messages: list[dict[str, str]],
               sampling: Sampling, use_adapter: bool = True) -> Iterator[str]:
        """Yield one reply so far (cumulative text) as tokens arrive; use_adapter=False with an
        adapter_dir answers as the base model, from the same loaded PeftModel."""
        for texts in self.stream_batch(model_id, adapter_dir, [messages], sampling, [use_adapter]):
            yield texts[0]

    def reads_images(self, model_id: str, adapter_dir: str | None) -> bool:
        """Whether the chat model is a vision-language one (jobs/models/vision.py)."""
        model, _ = self.load(model_id, adapter_dir)
        return getattr(model.config, "vision_config", None) is not None

    def stream_batch(self, model_id: str, adapter_dir: str | None, conversations: list[list[dict[str, str]]],
                     sampling: Sampling, use_adapter: list[bool], image: str | None = None,
                     base_template: bool = False) -> Iterator[list[str]]:
        """Yield every reply so far (one cumulative text per conversation) as tokens arrive.

        All conversations run in one generate call, row i with the job's adapter when
        use_adapter[i] (and there is one), else as the base model. `image` (a vision-language
        model's): a picture every row's last user message shows the model. `base_template`: every
        row's prompt through the base model's own tokenizer and template ("served elsewhere").
        """
        model, tokenizer = self.load(model_id, adapter_dir)
        if image:
            from jobs.data.vision_encode import with_image
            conversations = [with_image(messages, image) for messages in conversations]
        prompts = [self.prompt(model_id, adapter_dir, messages, use, base_template)
                   for messages, use in zip(conversations, use_adapter)]
        inputs = (self._image_inputs(model_id, adapter_dir, tokenizer, prompts, image) if image
                  else _batch_inputs(tokenizer, prompts))
        inputs = {k: v.to(model.device) for k, v in inputs.items()}
        extra = {}
        if hasattr(model, "disable_adapter"):  # a PeftModel: pick each row's adapter
            active = model.active_adapter
            extra["adapter_names"] = [active if use else "__base__" for use in use_adapter]
        streamer = BatchStreamer(tokenizer, len(prompts), _eos_ids(model, tokenizer))
        stop, failure = threading.Event(), []
        worker = threading.Thread(target=self._generate, daemon=True,
                                  args=(model, tokenizer, inputs, streamer, sampling, extra, stop, failure))
        worker.start()
        try:
            yield from streamer
        finally:
            stop.set()  # a closed generator (client gone) stops generate at the next token
        worker.join()
        if failure:
            raise RuntimeError(f"generation failed: {failure[0]}") from failure[0]

    def _image_inputs(self, model_id: str, adapter_dir: str | None, tokenizer: Any, prompts: list[str],
                      image: str) -> dict:
        """The prompts' token ids with the image's tokens and patches (jobs/data/vision_encode.py); the
        image processor saved with the adapter, else the base model's."""
        from jobs.data.vision_encode import chat_inputs
        from jobs.models import vision
        from jobs.models.load import resolve_model
        folder = adapter_dir if adapter_dir and (Path(adapter_dir) / "preprocessor_config.json").is_file() \
            else resolve_model(model_id, self.data_dir, log=lambda _line: None)
        return chat_inputs(tokenizer, vision.load_image_processor(folder), prompts, image)

    def _generate(self, model: Any, tokenizer: Any, inputs: Any, streamer: "BatchStreamer",
                  sampling: Sampling, extra: dict[str, Any], stop: threading.Event,
                  failure: list[BaseException]) -> None:
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        try:
            with self._generate_lock:
                torch.manual_seed(int(sampling.seed))
                with torch.inference_mode():
                    model.generate(**inputs, streamer=streamer, pad_token_id=pad_id,
                                   stopping_criteria=StoppingCriteriaList([_StopWhenSet(stop)]),
                                   **extra, **sampling.generate_kwargs())
        except Exception as exc:  # reported by stream_batch() in the caller's thread
            failure.append(exc)
        finally:
            streamer.end()


def _load_base_tokenizer(model_id: str, data_dir: Path) -> Any:
    from jobs.models.load import load_tokenizer, resolve_model
    return load_tokenizer(resolve_model(model_id, data_dir, log=lambda _line: None))


def _batch_inputs(tokenizer: Any, prompts: list[str]) -> Any:
    """Token ids for the prompts, padded on the left so every row's answer starts at the end."""
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer(prompts, return_tensors="pt", add_special_tokens=False, padding=True,
                     padding_side="left")


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    configured = getattr(model.generation_config, "eos_token_id", None)
    ids = set(configured if isinstance(configured, (list, tuple)) else [configured])
    ids.add(tokenizer.eos_token_id)
    return {i for i in ids if i is not None}


class BatchStreamer(BaseStreamer):
    """generate()'s tokens for a batch, as one growing text per row.

    generate calls put() first with the prompt ids (skipped), then once per step with one new
    token per row; a row ends at its first end-of-sequence token (later ones are padding).
    Iterating yields the list of texts after every step, until end().
    """

    def __init__(self, tokenizer: Any, rows: int, eos_ids: set[int]):
        self.tokenizer, self.eos_ids = tokenizer, eos_ids
        self.tokens: list[list[int]] = [[] for _ in range(rows)]
        self.finished = [False] * rows
        self._prompt_seen = False
        self._queue: queue.Queue = queue.Queue()

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        step = value.reshape(len(self.tokens), -1)[:, -1].tolist()
        for row, token in enumerate(step):
            if self.finished[row]:
                continue
            if token in self.eos_ids:
                self.finished[row] = True
            else:
                self.tokens[row].append(int(token))
        self._queue.put(self.texts())

    def texts(self) -> list[str]:
        # a character split across tokens decodes as U+FFFD until its last byte arrives
        return [self.tokenizer.decode(ids, skip_special_tokens=True).removesuffix("\ufffd")
                for ids in self.tokens]

    def end(self) -> None:
        self._queue.put(None)

    def __iter__(self) -> Iterator[list[str]]:
        while True:
            texts = self._queue.get()
            if texts is None:
                return
            yield texts
