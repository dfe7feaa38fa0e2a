"""Batches the engine opens (engine.py picks one; slots.py holds the GPU's): `ContinuousBatch`,
which rows join and leave between decode steps (continuous batching, on the CPU), `StaticBatch`
(GRPO's CUDA-graph loop, nobody joins) and `WholeBatch` (transformers' generate, for models no
cache here holds).

The KV cache is a transformers DynamicCache whose rows are left-padded to one width: a joining
request's prompt is prefilled on its own (its rows left-padded among themselves), then its K/V are
left-padded or the batch's are, to the wider of the two, and concatenated along the batch (the
2-D attention mask keeps every row blind to its padding, and each row has its own position ids).
A finished row leaves by `batch_select_indices` (the same cache call transformers' contrastive
search uses), and the columns no remaining row attends to are cut off the left. This is the
simplest form of what vLLM and TGI call continuous (in-flight) batching: TGI's first router also
concatenated and filtered padded per-request caches ("Batch.concatenate / filter"); vLLM's paged
blocks avoid the copies, transformers' own `generate_batch` (paged, one generation config and one
model state per manager) could not switch LoRA adapters or sampling per batch here.

A greedy row decodes as it would alone (padding is masked, positions are the row's own): the same
tokens in float32 on the CPU (tests/jobs/serve/test_continuous.py); in bf16 on a GPU another batch
shape can round differently, as in any batching server (bench/serve_decode.py counts the tokens).

Each step's K/V are appended by torch.cat (transformers' DynamicLayer), a copy of the cache per
token; a preallocated, per-row paged cache (vLLM) would avoid it."""
from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F

from jobs.serve.rows import Row, Sampling
from jobs.train.decode import sample_next
from jobs.train.rollout import pad_left
from kernels.loss_patch import find_causal_lm


def _pad_columns(t: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """`t` left-padded with zeros along `dim` (counted from the end) to `width`."""
    missing = width - t.shape[dim]
    if missing <= 0:
        return t
    pad = [0, 0] * (-dim - 1) + [missing, 0]
    return F.pad(t, pad)


class ContinuousBatch:
    """Rows of one adapter and one sampling setting; `admit` prefills new rows, `step` writes one
    token to every live row, `retire` drops the rows that are done."""

    can_join = True

    def __init__(self, model, sampling: Sampling, eos: set[int], pad_id: int, decode_text, adapter_on):
        self.model, self.sampling, self.eos, self.pad_id = model, sampling, eos, pad_id
        self.decode_text, self.adapter_on = decode_text, adapter_on
        self.device = next(model.parameters()).device
        decoder = find_causal_lm(model).model   # transformers renames past_key_values to cache (5.x)
        self.cache_name = "cache" if "cache" in inspect.signature(decoder.forward).parameters else "past_key_values"
        self.rows: list[Row] = []
        self.cache = self.mask = self.position = self.token = None

    @property
    def width(self) -> int:
        return 0 if self.mask is None else self.mask.shape[1]

    def _forward(self, ids, mask, positions, cache) -> torch.Tensor:
        with self.adapter_on():
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                             logits_to_keep=1, **{self.cache_name: cache})
        return sample_next(out.logits[:, -1, :], self.sampling.temperature, self.sampling.top_p)

    def _take(self, rows: list[Row], tokens: torch.Tensor) -> None:
        for row, token in zip(rows, tokens.tolist()):
            row.take(token, self.eos, self.decode_text)

    @torch.inference_mode()
    def admit(self, rows: list[Row]) -> None:
        """Prefill `rows` (their first token is taken) and add them to the batch."""
        from transformers import DynamicCache

        ids, mask = pad_left([r.prompt for r in rows], self.pad_id, self.device)
        positions = (mask.cumsum(1) - 1).clamp(min=0)
        cache = DynamicCache()
        first = self._forward(ids, mask, positions, cache)
        self._take(rows, first)
        self._merge(cache, mask, positions[:, -1:] + 1, first.unsqueeze(1))
        self.rows += rows

    def _merge(self, cache, mask, position, token) -> None:
        if self.cache is None:
            self.cache, self.mask, self.position, self.token = cache, mask, position, token
            return
        width = max(self.width, mask.shape[1])
        for mine, new in zip(self.cache.layers, cache.layers):
            mine.keys = torch.cat([_pad_columns(mine.keys, width, -2), _pad_columns(new.keys, width, -2)])
            mine.values = torch.cat([_pad_columns(mine.values, width, -2), _pad_columns(new.values, width, -2)])
        self.mask = torch.cat([_pad_columns(self.mask, width, -1), _pad_columns(mask, width, -1)])
        self.position = torch.cat([self.position, position])
        self.token = torch.cat([self.token, token])

    @torch.inference_mode()
    def step(self) -> None:
        """One decode step: each row's last token in, its next token out."""
        self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], dim=1)
        nxt = self._forward(self.token, self.mask, self.position, self.cache)
        self._take(self.rows, nxt)
        self.token = nxt.unsqueeze(1)
        self.position = self.position + 1

    def retire(self) -> None:
        """Drop finished rows from the cache, then the left columns no remaining row attends to."""
        keep = [i for i, row in enumerate(self.rows) if not row.done]
        if len(keep) == len(self.rows):
            return
        self.rows = [self.rows[i] for i in keep]
        if not keep:
            self.cache = self.mask = self.position = self.token = None
            return
        index = torch.tensor(keep, device=self.device)
        self.cache.batch_select_indices(index)
        self.mask, self.position, self.token = self.mask[index], self.position[index], self.token[index]
        unused = int(self.mask.any(dim=0).int().argmax())   # columns before the first one any row attends
        if unused:
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[..., unused:, :], layer.values[..., unused:, :]
            self.mask = self.mask[:, unused:]


class WholeBatch:
    """For models the cache above cannot hold (sliding windows longer prompts outgrow, hybrid layers:
    jobs.train.decode.unsupported_reason): transformers' `generate` answers the first rows whole,
    then `step` hands out one token column at a time; nobody joins."""

    can_join = False

    def __init__(self, generate, eos: set[int], decode_text):
        self.generate, self.eos, self.decode_text = generate, eos, decode_text
        self.rows: list[Row] = []        # the rows not done yet
        self.columns: list[list[int]] = []
        self._all: list[Row] = []        # the columns' order

    def admit(self, rows: list[Row]) -> None:
        self.rows, self._all = list(rows), list(rows)
        self.columns = self.generate(rows)
        self.step()

    def step(self) -> None:
        column = self.columns.pop(0) if self.columns else [None] * len(self._all)
        for row, token in zip(self._all, column):
            if token is None:
                row.finish_reason = row.finish_reason or "length"
            else:
                row.take(token, self.eos, self.decode_text)

    def retire(self) -> None:
        self.rows = [row for row in self.rows if not row.done]


class StaticBatch:
    """GRPO's static-cache loop (jobs/train/decode.py `start_decoder`: one decode step replayed as a
    CUDA graph) for the rows it opens with; nobody joins, since every row of its cache starts at the
    same step: `Engine.run`'s batches (jobs/evaluate). slots.py is the joinable variant."""

    can_join = False

    def __init__(self, model, sampling: Sampling, eos: set[int], pad_id: int, decode_text, adapter_on, log=None):
        self.model, self.sampling, self.eos, self.pad_id = model, sampling, eos, pad_id
        self.decode_text, self.adapter_on, self.log = decode_text, adapter_on, log
        self.rows: list[Row] = []
        self._all: list[Row] = []

    @torch.inference_mode()
    def admit(self, rows: list[Row]) -> None:
        from jobs.train.decode import start_decoder
        from kernels.packed_attention import cached_decoding_attention
        self.rows, self._all = list(rows), list(rows)
        ids, mask = pad_left([r.prompt for r in rows], self.pad_id, next(self.model.parameters()).device)
        self.max_new, self.column = max(r.max_tokens for r in rows), 0
        with self.adapter_on(), cached_decoding_attention(self.model):
            self.decoder, self._step = start_decoder(self.model, ids, mask, self.max_new, self.sampling.temperature,
                                                     self.sampling.top_p, self.eos, self.pad_id, log=self.log)
        self._take()

    @torch.inference_mode()
    def step(self) -> None:
        from kernels.packed_attention import cached_decoding_attention
        self.column += 1   # every row ends by its max_tokens <= max_new, so the column is in range
        with self.adapter_on(), cached_decoding_attention(self.model):
            self._step()
        self._take()

    def _take(self) -> None:
        for row, token in zip(self._all, self.decoder.out[:, self.column].tolist()):
            row.take(token, self.eos, self.decode_text)

    def retire(self) -> None:
        self.rows = [row for row in self.rows if not row.done]
