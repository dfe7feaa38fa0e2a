"""Generate one batch: every row on the same adapter and sampling settings, through the project's
decode loop (jobs/train/decode.py `start_decoder`: static KV cache, prefill once, one decode step per
token, a CUDA graph on the GPU). Each column of new tokens is read as it lands, so streams get their
text token by token and rows stop on their own stop strings and max_tokens; the batch ends when
every row has. Models the loop cannot run (`decode.unsupported_reason`) go through transformers'
`generate`, the whole answer at once."""
from __future__ import annotations

from contextlib import contextmanager

import torch

from jobs.serve.rows import Row, Sampling
from jobs.train import decode
from jobs.train.rollout import eos_ids_of, pad_left
from kernels.packed_attention import cached_decoding_attention


@contextmanager
def adapter_on(model, adapter: str | None):
    """The named adapter switched on, or (None) the base with every adapter off."""
    if adapter is None:
        with model.disable_adapter():
            yield
        return
    model.set_adapter(adapter)
    yield


def _text_config(model):
    config = model.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


class Engine:
    """Runs batches on one (PEFT) model; `on_column(rows)` is called after each token column."""

    def __init__(self, model, log=None):
        self.model, self.log = model, log
        self.device = next(model.parameters()).device

    @torch.inference_mode()
    def run(self, rows: list[Row], sampling: Sampling, adapter: str | None, tokenizer, on_column,
            cancelled=lambda: False) -> None:
        """Generate until every row is done (or `cancelled()` says every client is gone)."""
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        eos = eos_ids_of(self.model, tokenizer)
        decode_text = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)   # noqa: E731
        ids, mask = pad_left([r.prompt for r in rows], pad_id, self.device)
        max_new = max(r.max_tokens for r in rows)
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)   # a seeded request runs in a batch of its own (scheduler.py)
        reason = decode.unsupported_reason(_text_config(self.model), ids.shape[1] + max_new)
        with adapter_on(self.model, adapter):
            if reason:
                decode.log_once(self.log, f"serve: transformers' generate ({reason})")
                columns = self._generate(ids, mask, max_new, sampling, eos, pad_id)
                for column in columns:
                    self._take(rows, column, eos, decode_text, on_column)
                return
            with cached_decoding_attention(self.model):
                self._decode(rows, ids, mask, max_new, sampling, eos, pad_id, decode_text, on_column, cancelled)

    def _decode(self, rows, ids, mask, max_new, sampling, eos, pad_id, decode_text, on_column, cancelled):
        decoder, step = decode.start_decoder(self.model, ids, mask, max_new, sampling.temperature,
                                             sampling.top_p, eos, pad_id, log=self.log)
        for i in range(max_new):
            if i:
                step()
            self._take(rows, decoder.out[:, i].tolist(), eos, decode_text, on_column)
            if all(r.done for r in rows) or cancelled():
                return

    @staticmethod
    def _take(rows, column, eos, decode_text, on_column) -> None:
        for row, token in zip(rows, column):
            row.take(token, eos, decode_text)
        on_column(rows)

    def _generate(self, ids, mask, max_new, sampling, eos, pad_id) -> list[list[int]]:
        """transformers' generate for what the decode loop cannot run: token columns [max_new][B]."""
        greedy = sampling.temperature <= 0
        sample = {} if greedy else {"temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": 0}
        out = self.model.generate(input_ids=ids, attention_mask=mask, do_sample=not greedy,
                                  max_new_tokens=max_new, pad_token_id=pad_id,
                                  eos_token_id=sorted(eos) or None, **sample)
        new = out[:, ids.shape[1]:]
        return new.t().tolist()
