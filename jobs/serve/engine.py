"""Opens the batches the scheduler runs on one (PEFT) model, on the named adapter:

- on the GPU a `SlotBatch` (jobs/serve/slots.py): GRPO's static-cache loop, its step replayed as a
  CUDA graph, on a cache of `slots` rows that requests join (in free rows) and leave. On the H200
  (bench/results/serve_decode.jsonl) it made 0.8-1.06x the tokens/s of the plain static loop and
  about 10x those of the eager DynamicCache step (a small model's eager step is launch-bound);
- on the CPU a `ContinuousBatch` (jobs/serve/batch.py): a DynamicCache that requests join and
  leave, no wasted rows (the slot cache's free rows cost compute where there is no graph);
- `StaticBatch`: the plain static loop for rows that all start together (`run`, jobs/evaluate's);
- for models no cache here holds (`decode.unsupported_reason`: a sliding window the answer
  outgrows, non-attention layers), a `WholeBatch` that transformers' `generate` answers at once.

`Engine(model, batching="slots" | "continuous" | "static")` overrides the device's choice."""
from __future__ import annotations

from contextlib import contextmanager
from functools import partial

import torch

from jobs.models.adapter_switch import base_model_only
from jobs.serve.batch import ContinuousBatch, StaticBatch, WholeBatch
from jobs.serve.rows import Row, Sampling
from jobs.serve.slots import SLOT_ROOM, SlotBatch
from jobs.train import decode
from jobs.train.rollout import eos_ids_of, pad_left
from kernels.arch import text_config


@contextmanager
def adapter_on(model, adapter: str | None):
    """The named adapter switched on, or (None) the base with every adapter off."""
    if adapter is None:
        with base_model_only(model):
            yield
        return
    if model.active_adapter != adapter:   # set_adapter walks every module: not once per token
        model.set_adapter(adapter)
    yield


SLOTS = 32   # rows of a GPU batch's static cache (scheduler.MAX_BATCH_ROWS)


class Engine:
    """Makes batches on one (PEFT) model; only the scheduler's thread uses it."""

    def __init__(self, model, log=None, batching: str | None = None, slots: int = SLOTS):
        self.model, self.log, self.slots = model, log, slots
        self.device = next(model.parameters()).device
        self.batching = batching or ("slots" if self.device.type == "cuda" else "continuous")

    def open(self, rows: list[Row], sampling: Sampling, adapter: str | None, tokenizer, batching: str | None = None):
        """A batch for `rows` (not admitted yet: the caller admits them); `batching` overrides the engine's."""
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        eos = eos_ids_of(self.model, tokenizer)
        decode_text = partial(tokenizer.decode, skip_special_tokens=True)
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)   # a seeded request runs in a batch of its own (scheduler.py)
        longest = max(len(r.prompt) for r in rows) + max(r.max_tokens for r in rows)
        reason = decode.unsupported_reason(text_config(self.model.config), longest)
        if reason:
            decode.log_once(self.log, f"serve: transformers' generate, no joining ({reason})")
            generate = partial(self._generate, sampling=sampling, eos=eos, pad_id=pad_id, adapter=adapter)
            return WholeBatch(generate, eos, decode_text)
        on, batching = partial(adapter_on, self.model, adapter), batching or self.batching
        if batching == "static":
            return StaticBatch(self.model, sampling, eos, pad_id, decode_text, on, log=self.log)
        if batching == "slots":
            return SlotBatch(self.model, sampling, eos, pad_id, decode_text, on, self.slots,
                             self._room(longest), log=self.log)
        return ContinuousBatch(self.model, sampling, eos, pad_id, decode_text, on)

    def _room(self, longest: int) -> int:
        """SLOT_ROOM where the model's positions (and sliding window) allow it, else none."""
        text = text_config(self.model.config)
        limit = getattr(text, "max_position_embeddings", None) or longest + SLOT_ROOM
        fits = longest + SLOT_ROOM <= limit and decode.unsupported_reason(text, longest + SLOT_ROOM) is None
        return SLOT_ROOM if fits else 0

    def run(self, rows: list[Row], sampling: Sampling, adapter: str | None, tokenizer, on_column,
            cancelled=lambda: False) -> None:
        """`rows` as one batch nobody joins, until each is done or `cancelled()` (jobs/evaluate's use);
        `on_column(rows)` after each token column."""
        batch = self.open(rows, sampling, adapter, tokenizer, batching="static")
        batch.admit(rows)
        batch.retire()
        on_column(rows)
        while batch.rows and not cancelled():
            batch.step()
            batch.retire()
            on_column(rows)

    def can_join(self, batch, rows: list[Row]) -> bool:
        """Whether `rows` may join the running `batch` (the cache can hold them as it grows)."""
        if not batch.can_join:
            return False
        if isinstance(batch, SlotBatch):
            return batch.fits(rows)
        longest = batch.width + max(len(r.prompt) for r in rows) + max(r.max_tokens for r in batch.rows + rows)
        return decode.unsupported_reason(text_config(self.model.config), longest) is None

    @torch.inference_mode()
    def _generate(self, rows, sampling, eos, pad_id, adapter) -> list[list[int]]:
        """transformers' generate for what the cache cannot hold: token columns [max_new][B]."""
        ids, mask = pad_left([r.prompt for r in rows], pad_id, self.device)
        greedy = sampling.temperature <= 0
        sample = {} if greedy else {"temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": 0}
        with adapter_on(self.model, adapter):
            out = self.model.generate(input_ids=ids, attention_mask=mask, do_sample=not greedy,
                                      max_new_tokens=max(r.max_tokens for r in rows), pad_token_id=pad_id,
                                      eos_token_id=sorted(eos) or None, **sample)
        return out[:, ids.shape[1]:].t().tolist()
