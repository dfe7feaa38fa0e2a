"""Micro-batches for the training loop: packed rows, or length-grouped padded rows.

Packing (`packing: on`, or `auto` where it helps): examples are placed into rows of max_seq_length
by best-fit decreasing (longest first, each into the fullest row that still has room; Johnson's
classic bin-packing heuristic, the strategy TRL's `pack_dataset(strategy="bfd")` uses), with ties
between equal lengths broken by a seeded shuffle so the packing is reproducible. The packing is
computed once; each epoch shuffles the order of the rows (seed, epoch), so a resume from
`micro_index` replays exactly the same batches.

A packed row keeps every example separate:
- `position_ids` restart at 0 for each example (RoPE as if it were alone);
- `cu_seq_lens_q/k` (int32 cumulative lengths over the flattened batch) and `max_length_q/k` tell
  the attention where documents begin (kernels/packed_attention.py): nothing attends across them;
- the first label of each example is ignored, so the previous example's last token never learns
  to predict it (one by one, the causal shift drops that label too); only answer tokens train;
- the row's unused tail is padding: its own document, label -100.

Without packing, batches are length-grouped (transformers' `LengthGroupedSampler` idea): a seeded
shuffle, then within windows of 50 batches the examples are sorted by length, so a batch pads
little, and the batch order is shuffled again so long and short batches alternate at random.
"""
from __future__ import annotations

import bisect
import random
from dataclasses import dataclass, field

import torch

from jobs.data.encode import IGNORE_INDEX, Example, collate

GROUP_WINDOW = 50          # batches per length-sorting window (the sampler's "mega-batch")
AUTO_MIN_SAVING = 0.10     # auto packs when it needs at least this share fewer rows than examples


@dataclass
class Batch:
    """One micro-batch on the host, ready to copy: tensors, host-side ints, and its counts."""

    tensors: dict[str, torch.Tensor]
    ints: dict[str, int] = field(default_factory=dict)
    real_tokens: int = 0      # non-pad tokens
    label_tokens: int = 0     # tokens the loss is taken over (after the causal shift)

    def pinned(self) -> "Batch":
        return Batch({k: v.pin_memory() for k, v in self.tensors.items()}, self.ints,
                     self.real_tokens, self.label_tokens)

    def to(self, device: torch.device) -> dict:
        """Model kwargs on `device` (non-blocking: from pinned memory the copy is asynchronous)."""
        moved = {k: v.to(device, non_blocking=True) for k, v in self.tensors.items()}
        return {**moved, **self.ints}


@dataclass
class Passes(Batch):
    """A micro-batch that trains in several forward + backward passes, its `parts` (within
    max_gpu_memory_gb: jobs/models/fit_passes.py); its counts are the parts' sums."""

    parts: list[Batch] = field(default_factory=list)

    def pinned(self) -> "Passes":
        return Passes({}, {}, self.real_tokens, self.label_tokens, [part.pinned() for part in self.parts])


def passes_of(batch: Batch) -> list[Batch]:
    """The batches one micro-batch trains as: its parts, or itself."""
    return batch.parts if isinstance(batch, Passes) else [batch]


def _seeded_order(lengths: list[int], seed: int) -> list[int]:
    order = list(range(len(lengths)))
    random.Random(seed).shuffle(order)
    return sorted(order, key=lambda i: -lengths[i])   # stable: equal lengths keep the seeded order


def pack(lengths: list[int], capacity: int, seed: int = 0) -> list[list[int]]:
    """Best-fit decreasing: lists of example indices whose lengths sum to at most `capacity`."""
    bins: list[list[int]] = []
    free: list[tuple[int, int]] = []        # (room left, bin id), sorted
    for index in _seeded_order(lengths, seed):
        size = lengths[index]
        if size > capacity:
            raise ValueError(f"example {index} has {size} tokens, more than the row length {capacity}")
        slot = bisect.bisect_left(free, (size, -1))
        if slot < len(free):
            room, bin_id = free.pop(slot)
        else:
            room, bin_id = capacity, len(bins)
            bins.append([])
        bins[bin_id].append(index)
        if room - size > 0:
            bisect.insort(free, (room - size, bin_id))
    return bins


def length_grouped(lengths: list[int], batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """Padded micro-batches of similar lengths (module doc), in a seeded order."""
    rng = random.Random(seed * 1000 + epoch)
    order = list(range(len(lengths)))
    rng.shuffle(order)
    window = batch_size * GROUP_WINDOW
    batches = []
    for start in range(0, len(order), window):
        chunk = sorted(order[start:start + window], key=lambda i: -lengths[i])
        batches += [chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size)]
    rng.shuffle(batches)
    return batches


def resolve_packing(mode: str, device_type: str, lengths: list[int], capacity: int,
                    softcap: float | None = None, seed: int = 0) -> tuple[bool, str]:
    """Whether to pack, and the sentence the log gets. `auto` packs on a GPU when examples are
    shorter than max_seq_length, i.e. packing needs at least 10 % fewer rows than examples (then a
    micro-batch of batch_size rows carries more examples and fewer pad tokens); on CPU it keeps one
    example a row (length-grouped), so CPU jobs keep their meaning of batch_size and epochs."""
    if mode == "on":
        return True, "packing: on"
    if mode == "off":
        return False, "packing: off (length-grouped batches)"
    if device_type != "cuda":
        return False, "packing: auto -> off on CPU (length-grouped batches; set packing: on to pack)"
    if softcap:
        return False, ("packing: auto -> off: this model soft-caps attention logits, which the varlen "
                       "kernel cannot do (set packing: on to pack with exact per-document attention)")
    rows = len(pack(lengths, capacity, seed))
    if rows <= (1 - AUTO_MIN_SAVING) * len(lengths):
        return True, f"packing: auto -> on ({len(lengths):,} examples in {rows:,} rows of {capacity})"
    return False, f"packing: auto -> off (examples already fill max_seq_length: {rows:,} rows for {len(lengths):,})"


def _label_tokens(labels: list[int]) -> int:
    return sum(1 for label in labels[1:] if label != IGNORE_INDEX)


def collate_packed(rows: list[list[Example]], row_length: int, pad_id: int,
                   fixed: tuple[int, int] | None = None) -> Batch:
    """[rows, row_length] tensors of packed examples (module doc). `fixed` = (rows, boundaries):
    the same shapes for every batch (a captured step, jobs/train/graph_steps.py): missing rows are all
    padding, `cu_seq_lens` is padded with empty documents to `boundaries` entries, and
    `max_length` is the row length."""
    if fixed is not None:
        rows = rows + [[] for _ in range(fixed[0] - len(rows))]
    shape = (len(rows), row_length)
    ids = torch.full(shape, pad_id, dtype=torch.long)
    labels = torch.full(shape, IGNORE_INDEX, dtype=torch.long)
    positions = torch.zeros(shape, dtype=torch.long)
    starts, longest, real, counted = [], 1, 0, 0
    for r, row in enumerate(rows):
        offset = 0
        for example in row:
            n = len(example.input_ids)
            ids[r, offset:offset + n] = torch.tensor(example.input_ids)
            labels[r, offset + 1:offset + n] = torch.tensor(example.labels[1:], dtype=torch.long)
            positions[r, offset:offset + n] = torch.arange(n)
            starts.append(r * row_length + offset)
            longest, real, counted = max(longest, n), real + n, counted + _label_tokens(example.labels)
            offset += n
        if offset < row_length:   # the padding tail is a document of its own
            positions[r, offset:] = torch.arange(row_length - offset)
            starts.append(r * row_length + offset)
            longest = max(longest, row_length - offset)
    bounds = starts + [len(rows) * row_length]
    if fixed is not None:
        if len(bounds) > fixed[1]:
            raise ValueError(f"{len(bounds) - 1} documents do not fit the fixed {fixed[1] - 1}")
        bounds, longest = bounds + [bounds[-1]] * (fixed[1] - len(bounds)), row_length
    cu = torch.tensor(bounds, dtype=torch.int32)
    tensors = {"input_ids": ids, "labels": labels, "position_ids": positions,
               "cu_seq_lens_q": cu, "cu_seq_lens_k": cu}
    return Batch(tensors, {"max_length_q": longest, "max_length_k": longest}, real, counted)


def collate_padded(examples: list[Example], pad_id: int) -> Batch:
    """Right-padded rows with an attention mask (one example a row: `encode.collate`)."""
    real = sum(len(e.input_ids) for e in examples)
    counted = sum(_label_tokens(e.labels) for e in examples)
    return Batch(collate(examples, pad_id), {}, real, counted)


def _untrained(batch: Batch) -> Batch:
    """A stand-in batch that runs forward and backward like the others (DDP needs every rank's
    gradients) but has no label tokens, so it adds nothing to the loss or the gradients."""
    batch.tensors["labels"].fill_(IGNORE_INDEX)
    return Batch(batch.tensors, batch.ints, 0, 0)


def deal(groups: list[list[int]], cost, rank: int, world: int) -> list[list[int]]:
    """This process's micro-batches of one optimizer step, given the step's global micro-batches.

    The step's units (examples, or packed rows) are sorted by `cost` (real tokens, longest first)
    and cut again into global micro-batches of the same sizes, so each holds similar lengths (little
    padding). Within each, the longest unit goes to the process with the fewest tokens of the step
    so far, the next to the next fewest, and so on (Graham's LPT rule), one unit per process a
    round: every process gets the same number of units per micro-batch (or one fewer), and their
    real tokens a step never differ by more than the step's longest unit (the ranks wait for each
    other once a step, in the gradient all-reduce). Which units a step trains on is unchanged, and
    the loss is normalised over the whole step, so the update equals one process's."""
    units = sorted((unit for group in groups for unit in group), key=lambda unit: -cost(unit))
    totals, mine, start = [0] * world, [], 0
    for size in (len(group) for group in groups):
        dealt: list[list[int]] = [[] for _ in range(world)]
        for round_start in range(start, start + size, world):
            lightest = sorted(range(world), key=lambda r: (totals[r], r))
            for unit, taker in zip(units[round_start:min(start + size, round_start + world)], lightest):
                dealt[taker].append(unit)
                totals[taker] += cost(unit)
        mine.append(dealt[rank])
        start += size
    return mine


def example_lengths(examples) -> list[int]:
    """Tokens of each example; a lazy store (jobs/data/cache.py TokenStore) has them precomputed."""
    known = getattr(examples, "lengths", None)
    return list(known) if known is not None else [len(e.input_ids) for e in examples]


class BatchPlan:
    """The micro-batches of every epoch for a set of examples: which examples, in which order."""

    def __init__(self, examples: list[Example], batch_size: int, row_length: int, packed: bool,
                 seed: int, pad_id: int, shuffle: bool = True, accumulation: int = 1,
                 rank: int = 0, world: int = 1, pass_units: int | None = None):
        """`batch_size` is the global micro-batch (per process x `world` processes); with several
        processes this one (`rank`) builds its share of every optimizer step (`deal`). `pass_units`:
        at most this many units (packed rows, or examples) a forward; a larger micro-batch becomes
        `Passes` (within max_gpu_memory_gb: jobs/models/fit_passes.py). Which units make a
        micro-batch does not depend on it, so neither does the data order a checkpoint records."""
        self.examples, self.batch_size, self.row_length = examples, batch_size, row_length
        self.pass_units = pass_units
        self.accumulation, self.rank, self.world = accumulation, rank, world
        self.packed, self.seed, self.pad_id, self.shuffle = packed, seed, pad_id, shuffle
        self.lengths = example_lengths(examples)
        self.rows = pack(self.lengths, row_length, seed) if packed else None
        self._epoch, self._order = None, []
        self._mine_epoch, self._mine = None, []
        self.fixed: tuple[int, int] | None = None

    def fix_shapes(self) -> None:
        """Every packed batch from now on has the same tensor shapes (`collate_packed`'s `fixed`):
        batch_size rows and room for the most documents batch_size rows can hold."""
        if not self.packed:
            raise ValueError("fixed batch shapes need packed rows")
        most = max(len(row) + 1 for row in self.rows)   # + the padding tail, a document of its own
        rows = min(self.pass_units or self.batch_size, self.batch_size)   # a pass's rows (passes_of)
        self.fixed = (rows, rows * most + 1)

    @property
    def per_epoch(self) -> int:
        units = len(self.rows) if self.packed else len(self.examples)
        return max(1, -(-units // self.batch_size))

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """Example-index groups (packed: rows of indices, grouped batch_size at a time)."""
        if self._epoch != epoch:
            if self.packed:
                rows = list(range(len(self.rows)))
                if self.shuffle:
                    random.Random(self.seed * 1000 + epoch).shuffle(rows)
                self._order = [rows[i:i + self.batch_size] for i in range(0, len(rows), self.batch_size)]
            elif self.shuffle:   # grouped per optimizer step, so bs 4 x 1 and bs 2 x 2 see the same rows
                steps = length_grouped(self.lengths, self.batch_size * self.accumulation, self.seed, epoch)
                self._order = [s[i:i + self.batch_size] for s in steps for i in range(0, len(s), self.batch_size)]
            else:
                order = sorted(range(len(self.examples)), key=lambda i: -self.lengths[i])
                self._order = [order[i:i + self.batch_size] for i in range(0, len(order), self.batch_size)]
            self._epoch = epoch
        return self._order

    def unit_tokens(self, unit: int) -> int:
        """Real tokens of an example (packed: of a row)."""
        return sum(self.lengths[i] for i in self.rows[unit]) if self.packed else self.lengths[unit]

    def my_batches(self, epoch: int) -> list[tuple[list[int], int]]:
        """(this process's units, a unit of the global micro-batch) for every micro-batch of an
        epoch; every micro-batch of the epoch that belongs to one optimizer step is dealt at once."""
        groups = self.epoch_batches(epoch)
        if self.world == 1:
            return [(group, group[0]) for group in groups]
        if self._mine_epoch != epoch:
            self._mine, first, i = [], epoch * self.per_epoch, 0
            while i < len(groups):  # a step may straddle two epochs: each part is dealt apart
                end = min(len(groups), i + self.accumulation - (first + i) % self.accumulation)
                dealt = deal(groups[i:end], self.unit_tokens, self.rank, self.world)
                self._mine += [(mine, group[0]) for mine, group in zip(dealt, groups[i:end])]
                i = end
            self._mine_epoch = epoch
        return self._mine

    def build(self, mine: list[int], stand_in: int) -> Batch:
        # this process's share of an epoch's short last batch may be empty: a stand-in runs instead
        batch = self._collate(mine) if mine else self._stand_in(stand_in)
        return self._even_passes(batch, stand_in)

    def _stand_in(self, unit: int) -> Batch:
        """A pass that runs like the others (DDP, FSDP) and adds nothing (`_untrained`)."""
        return _untrained(self._collate_one([unit]))

    def _even_passes(self, batch: Batch, stand_in: int) -> Batch:
        """With several processes and `pass_units`, every rank runs as many passes as a full
        micro-batch takes: FSDP gathers each layer in every forward, so a rank that ran one pass
        fewer would leave the others waiting. Only an epoch's short last micro-batch, dealt unevenly,
        has fewer; stand-ins make up the count."""
        if self.world == 1 or not self.pass_units:
            return batch
        parts, want = passes_of(batch), -(-(self.batch_size // self.world) // self.pass_units)
        if len(parts) >= want:
            return batch
        parts = parts + [self._stand_in(stand_in) for _ in range(want - len(parts))]
        return Passes({}, {}, batch.real_tokens, batch.label_tokens, parts)

    def _collate(self, group: list[int]) -> Batch:
        step = self.pass_units
        if step and len(group) > step:
            parts = [self._collate_one(group[i:i + step]) for i in range(0, len(group), step)]
            return Passes({}, {}, sum(p.real_tokens for p in parts), sum(p.label_tokens for p in parts), parts)
        return self._collate_one(group)

    def _collate_one(self, group: list[int]) -> Batch:
        if self.packed:
            rows = [[self.examples[i] for i in self.rows[r]] for r in group]
            return collate_packed(rows, self.row_length, self.pad_id, self.fixed)
        return collate_padded([self.examples[i] for i in group], self.pad_id)

    def batch_at(self, micro_index: int) -> tuple[float, Batch]:
        """(epoch progress after this batch, the batch) for the micro_index-th micro-batch overall."""
        epoch, index = divmod(micro_index, self.per_epoch)
        return epoch + (index + 1) / self.per_epoch, self.build(*self.my_batches(epoch)[index])

    def all_batches(self):
        """Every batch of one pass, in order (evaluation)."""
        for mine, stand_in in self.my_batches(0):
            yield self.build(mine, stand_in)
