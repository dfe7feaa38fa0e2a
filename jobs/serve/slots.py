"""Continuous batching on GRPO's static-cache loop (jobs/train/decode.py), so the GPU keeps its CUDA
graph: the cache is opened with `slots` rows (the free ones masked out and marked done) and room
for `SLOT_ROOM` more tokens than its first rows ask for. A joining request is prefilled apart (an
eager forward with its own DynamicCache), its K/V copied into a free row at the columns just before
the column the next step writes, and that row's mask, start column, position, next token and done
flag set in place; the captured step then decodes it with the others, unchanged (every tensor it
reads keeps its address). A finished row frees its slot; its stale K/V stay masked out.

The same idea as vLLM's slot mapping (a new sequence's K/V written into free cache slots, attention
masked to each sequence's own), on one fixed-shape cache instead of paged blocks.

A batch whose rows have all finished can be rewound and reused (`reusable`): its step counter is set
back so the next request's prompt ends at the column the next step writes, and the captured graph is
replayed for it as it is. The scheduler keeps such a batch a while (scheduler.IDLE_KEEP_S), so one
chat message after another pays the graph capture (~1 s on the H200, bench/NOTES.md) once, not each
time."""
from __future__ import annotations

import torch

from jobs.serve.rows import Row, Sampling
from jobs.train.decode import StaticDecoder, sample_next, start_decoder
from jobs.train.rollout import pad_left

SLOT_ROOM = 512   # tokens beyond the first rows' max_tokens, so that later requests can still join


class SlotDecoder(StaticDecoder):
    """A StaticDecoder whose rows each start decoding at their own column (`start`, [B, 1])."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.start = torch.full((self.out.shape[0], 1), self.P, dtype=torch.long, device=self.out.device)

    def decode_step(self) -> None:
        slot = self.step + self.P
        self.box["slots"] = slot
        allowed = self.valid | ((self.columns.unsqueeze(0) >= self.start) & (self.columns <= slot).unsqueeze(0))
        logits = self._forward(self.token, self.position, self._additive(allowed)[:, None, None, :])
        self._take(logits, self.step + 1)
        self.position.add_(1)
        self.step.add_(1)


class SlotBatch:
    """Rows of one adapter and sampling setting in a static cache of `slots` rows; see the module doc."""

    can_join = True
    reusable = True   # the scheduler may keep it after its last row ends (module doc)

    def __init__(self, model, sampling: Sampling, eos: set[int], pad_id: int, decode_text, adapter_on,
                 slots: int, room: int, log=None):
        self.model, self.sampling, self.eos, self.pad_id = model, sampling, eos, pad_id
        self.decode_text, self.adapter_on, self.slots, self.room, self.log = decode_text, adapter_on, slots, room, log
        self.device = next(model.parameters()).device
        self.rows: list[Row] = []
        self.decoder = None

    def _attention(self):
        from kernels.packed_attention import cached_decoding_attention
        return cached_decoding_attention(self.model)

    @torch.inference_mode()
    def admit(self, rows: list[Row]) -> None:
        if self.decoder is None:
            self._open(rows)
        else:
            if self.idle:
                self._rewind(self._rewind_column(rows))
            self._join(rows)
        self.rows += rows

    @property
    def idle(self) -> bool:
        """Opened, and every row it held has finished: the whole cache is free."""
        return self.decoder is not None and all(r is None or r.done for r in self.slot_rows)

    def _rewind_column(self, rows: list[Row]) -> int:
        """The step count to rewind to: as early as the longest prompt allows (it must end at the
        column the next step writes, P + steps)."""
        return max(0, max(len(r.prompt) for r in rows) - self.decoder.P)

    def _rewind(self, column: int) -> None:
        """Set the step counter back (in place: the captured graph reads the same tensor); the cache's
        old K/V stay masked out, as a finished row's do."""
        self.column = column
        self.decoder.step.fill_(column)

    def _open(self, rows: list[Row]) -> None:
        count = max(self.slots, len(rows))
        ids, mask = pad_left([r.prompt for r in rows] + [[self.pad_id]] * (count - len(rows)), self.pad_id,
                             self.device)
        mask[len(rows):] = 0
        self.max_new, self.column = max(r.max_tokens for r in rows) + self.room, 0
        with self.adapter_on(), self._attention():
            self.decoder, self._step = start_decoder(self.model, ids, mask, self.max_new, self.sampling.temperature,
                                                     self.sampling.top_p, self.eos, self.pad_id, log=self.log,
                                                     decoder_class=SlotDecoder)
        self.decoder.done[len(rows):] = True
        self.slot_rows: list[Row | None] = list(rows) + [None] * (count - len(rows))
        for row, token in zip(rows, self.decoder.out[:len(rows), 0].tolist()):
            row.take(token, self.eos, self.decode_text)

    def fits(self, rows: list[Row]) -> bool:
        """Free slots for `rows`, room before the current column for each prompt, and room after it
        for each answer."""
        if self.decoder is None:
            return True
        column = self._rewind_column(rows) if self.idle else self.column
        free = sum(r is None or r.done for r in self.slot_rows)
        return free >= len(rows) and all(len(r.prompt) <= self.decoder.P + column
                                         and column + r.max_tokens <= self.max_new for r in rows)

    def _join(self, rows: list[Row]) -> None:
        from transformers import DynamicCache
        d, column = self.decoder, self.decoder.P + self.column   # the column the next step writes
        ids, mask = pad_left([r.prompt for r in rows], self.pad_id, self.device)
        cache = DynamicCache()
        with self.adapter_on():
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0),
                             use_cache=True, logits_to_keep=1, **{d.cache_name: cache})
        first = sample_next(out.logits[:, -1, :], self.sampling.temperature, self.sampling.top_p)
        free = [i for i, r in enumerate(self.slot_rows) if r is None or r.done]
        for j, (row, slot) in enumerate(zip(rows, free)):
            n = len(row.prompt)
            for mine, new in zip(d.cache.layers, cache.layers):
                mine.keys[slot, :, column - n:column] = new.keys[j, :, -n:]
                mine.values[slot, :, column - n:column] = new.values[j, :, -n:]
            d.valid[slot] = False
            d.valid[slot, column - n:column] = True
            d.start[slot] = column
            d.position[slot] = n
            d.token[slot] = first[j]
            d.done[slot] = bool(first[j].item() in self.eos)
            self.slot_rows[slot] = row
            row.take(int(first[j]), self.eos, self.decode_text)

    @torch.inference_mode()
    def step(self) -> None:
        self.column += 1
        with self.adapter_on(), self._attention():
            self._step()
        tokens = self.decoder.out[:, self.column].tolist()
        for row, token in zip(self.slot_rows, tokens):
            if row is not None:
                row.take(token, self.eos, self.decode_text)

    def retire(self) -> None:
        self.rows = [row for row in self.rows if not row.done]
