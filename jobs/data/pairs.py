"""Preference training data: rows -> encoded units (two sequences each) -> micro-batches.

A unit is what one loss term is computed over, and what the loss is normalised by:
- a pair (DPO, ORPO, SimPO): `first` = prompt + chosen, `second` = prompt + rejected;
- a KTO example: `first` = prompt + completion, `second` = the same prompt + another example's
  completion (the mismatched pair the KL estimate is taken over; TRL's KTOTrainer builds its KL
  dataset by shifting completions by one the same way, `_get_kl_dataset`).

Both sequences of a unit go through the model in ONE forward: padded (2 x units rows), padded with
the prompt once (a row per unit: the shared prompt, then each answer under a 4-D mask; off the GPU,
jobs/data/shared_prefix.py) or packed (the unit's two sequences side by side in a row, as separate
documents: `cu_seq_lens` keeps attention inside each), with the prompt once there too on a kernel
that takes keys apart from queries (`collate_units_packed_shared`: the prefix, then the rest of each
sequence, whose attention keys are the prefix's then its own, kernels/packed_attention.py). The
batch carries, host-made so the step never syncs, the flat indices of the label tokens (after the
causal shift), their targets and the sequence each belongs to, so only label rows reach the LM head
(kernels/ops/fused_linear_logprobs.py).

No gradient reaches a KTO KL completion (its log-prob only enters the detached KL estimate; TRL's
KTOTrainer takes it under no_grad), so KTO's training batches may carry the halves apart (`KTOBatch`,
the KL completions then run in a forward without grad) or, packed, put the KL completions last
(`collate_units_riding`: checkpointed layers recompute the rest alone); jobs/train/methods/preference.py KTO.
"""
from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

import torch

from jobs.data import shared_prefix
from jobs.messages import say
from jobs.data.conversation import DataError
from jobs.data.dataset import Problems, Rows, _raise_for, _read
from jobs.data.encode import IGNORE_INDEX, Example, collate
from jobs.data.packing import Batch, BatchPlan, collate_packed, pack
from jobs.data.preference import UNPAIRED_FORMAT, PreferenceRow, csv_rows, encode_answer, preference_format, read_row
from kernels import checkpoint_rows


@dataclass
class PairUnit:
    first: Example
    second: Example
    label: bool = True       # KTO: desirable?  (pairs: always True)
    index: int = 0           # place in its dataset (precomputed reference log-probs are kept by it)

    @property
    def input_ids(self) -> list[int]:   # the length BatchPlan packs and sorts by: both sequences
        return self.first.input_ids + self.second.input_ids


def read_preference_rows(rows: Rows, unpaired: bool, method: str, problems: Problems,
                         wheres: list[str] | None = None) -> list[PreferenceRow]:
    """Every row read; a row of the wrong kind for `method` (or unreadable) is a named problem.
    `wheres` (optional) gets each read row's place ("row 3 (line 5)"), one for one."""
    out, text_labels = [], csv_rows(rows)
    for number, where, row in zip(rows.numbers, rows.wheres, rows):
        fmt = preference_format(row)
        if fmt is None:
            problem = say("not_preference_fields_kto" if unpaired else "not_preference_fields",
                          fields=", ".join(sorted(row)), method=method)
            problems.add(say("row_problem", where=where, problem=problem), number)
            continue
        if (fmt == UNPAIRED_FORMAT) != unpaired:
            need = "prompt/completion/label rows" if unpaired else "chosen/rejected pairs"
            kind = "unpaired (prompt/completion/label)" if fmt == UNPAIRED_FORMAT else "a pair"
            problems.add(say("row_problem", where=where, problem=say("method_needs_other_rows", method=method,
                                                                     need=need, kind=kind)), number)
            continue
        try:
            out.append(read_row(row, fmt, text_labels))
            if wheres is not None:
                wheres.append(where)
        except DataError as exc:
            problems.add(say("row_problem", where=f"{where} ({fmt})", problem=exc), number)
    return out


def encode_units(tokenizer, rows: list[PreferenceRow], max_length: int, seed: int, log=print) -> list[PairUnit]:
    """Encoded units; a unit whose answer has no token left within max_length is dropped (said)."""
    units = []
    if rows and rows[0].rejected is None:   # KTO: each prompt also with another row's completion
        order = list(range(len(rows)))
        random.Random(seed).shuffle(order)
        partner = {order[i]: order[(i + 1) % len(order)] for i in range(len(order))}
    for i, row in enumerate(rows):
        first = encode_answer(tokenizer, row.prompt, row.chosen, max_length)
        if row.rejected is None:
            other = rows[partner[i]].chosen if len(rows) > 1 else row.chosen
            units.append(PairUnit(first, encode_answer(tokenizer, row.prompt, other, max_length), bool(row.label), i))
        else:
            units.append(PairUnit(first, encode_answer(tokenizer, row.prompt, row.rejected, max_length), True, i))
    kept = [u for u in units if u.first.trained_tokens and u.second.trained_tokens]
    if len(kept) < len(units):
        log(f"warning: {len(units) - len(kept)} of {len(units)} rows have an answer with no token within "
            f"max_seq_length={max_length} and are skipped; raise max_seq_length to keep them")
    if not kept:
        raise DataError(say("no_row_answer_tokens", length=max_length))
    for index, unit in enumerate(kept):
        unit.index = index
    return kept


def load_units(spec, tokenizer, data_dir=None, key: str = "dataset", log=print) -> list[PairUnit]:
    """spec.dataset (or eval_dataset) as encoded units, or one DataError naming the bad rows."""
    rows, problems = _read(spec, key, data_dir, True, None, log)  # True: builtin:concise may generate (once)
    unpaired = spec.method == "kto"
    read = read_preference_rows(rows, unpaired, spec.method, problems)
    _raise_for(rows, problems)
    return encode_units(tokenizer, read, spec.max_seq_length, spec.seed, log=log)


def _label_positions(labels: torch.Tensor, seq_index: torch.Tensor) -> dict[str, torch.Tensor]:
    """For every position t whose next token is a label: its flat index over [rows, width] (the
    hidden state that predicts it), the label, and the sequence the label belongs to."""
    row, t = (labels[:, 1:] != IGNORE_INDEX).nonzero(as_tuple=True)
    return {"pref_rows": row * labels.shape[1] + t, "pref_targets": labels[row, t + 1],
            "pref_seq": seq_index[row, t + 1].long()}


def collate_units(units: list[PairUnit], pad_id: int, packed_rows: list[list[int]] | None = None,
                  row_length: int = 0) -> Batch:
    """One forward's tensors for `units`: sequence 2k is unit k's first, 2k + 1 its second.
    `packed_rows`: positions in `units` per packed row (else one sequence a padded row)."""
    if packed_rows is None:
        sequences = [seq for unit in units for seq in (unit.first, unit.second)]
        tensors = collate(sequences, pad_id)
        seq_index = torch.arange(len(sequences)).unsqueeze(1).expand_as(tensors["labels"])
        batch = Batch(tensors, {}, sum(len(s.input_ids) for s in sequences), len(units))
    else:
        rows = [[seq for k in row for seq in (units[k].first, units[k].second)] for row in packed_rows]
        batch = collate_packed(rows, row_length, pad_id)
        seq_index = torch.full((len(rows), row_length), -1, dtype=torch.long)
        for r, row in enumerate(packed_rows):
            offset = 0
            for k in row:
                for j, seq in enumerate((units[k].first, units[k].second)):
                    seq_index[r, offset:offset + len(seq.input_ids)] = 2 * k + j
                    offset += len(seq.input_ids)
        batch.label_tokens = len(units)
    batch.tensors.update(_label_positions(batch.tensors["labels"], seq_index))
    return _with_units(batch, units)


def _with_units(batch: Batch, units: list[PairUnit]) -> Batch:
    batch.tensors["pref_units"] = torch.tensor([u.index for u in units], dtype=torch.long)
    batch.tensors["pref_label"] = torch.tensor([float(u.label) for u in units])
    batch.tensors["pref_valid"] = torch.ones(len(units))
    return batch


def collate_half(units: list[PairUnit], j: int, pad_id: int, packed: bool) -> Batch:
    """Sequence `j` of every unit alone (0: KTO's completions, 1: their KL completions), still numbered
    2k + j as in `collate_units`, so the two halves' sums add up to the whole batch's. Packed: one row
    of exactly their tokens (no padding tail: nothing here needs fixed shapes); else padded rows."""
    sequences = [(unit.first, unit.second)[j] for unit in units]
    real = sum(len(seq.input_ids) for seq in sequences)
    if packed:
        batch = collate_packed([sequences], real, pad_id)
        batch.label_tokens = len(units)   # collate_packed counts label tokens; a unit batch counts units
        seq_index = torch.repeat_interleave(2 * torch.arange(len(sequences)) + j,
                                            torch.tensor([len(seq.input_ids) for seq in sequences]))[None]
    else:
        tensors = collate(sequences, pad_id)
        seq_index = (2 * torch.arange(len(sequences)) + j)[:, None].expand_as(tensors["labels"])
        batch = Batch(tensors, {}, real, len(units))
    batch.tensors.update(_label_positions(batch.tensors["labels"], seq_index))
    return _with_units(batch, units)


def units_only(units: list[PairUnit], cuts: list[int] | None) -> Batch:
    """A KTO training batch's whole when its reference sums are precomputed: the step reads only its
    units' indices, labels and validity (the policy runs on the halves, the reference is looked up),
    so its token tensors are neither built nor copied. `real_tokens` stays the whole's (`cuts`: the
    shared prefixes it would hold once, or None)."""
    real = sum(len(u.input_ids) for u in units) - sum(cuts or ())
    return _with_units(Batch({}, {}, real, len(units)), units)


@dataclass
class KTOBatch(Batch):
    """A KTO micro-batch with its halves apart (module doc): `halves` = (completions, KL completions).
    The whole batch stays for the reference pass (with precompute_reference only what the loss reads
    of it: `units_only`); on the device `to` gives the model kwargs of the whole with the halves'
    under "kto_halves"."""

    halves: tuple = ()

    def pinned(self) -> "KTOBatch":
        whole = Batch.pinned(self)
        return KTOBatch(whole.tensors, whole.ints, self.real_tokens, self.label_tokens,
                        tuple(half.pinned() for half in self.halves))

    def to(self, device: torch.device) -> dict:
        return {**Batch.to(self, device), "kto_halves": tuple(half.to(device) for half in self.halves)}


def with_halves(batch: Batch, units: list[PairUnit], pad_id: int, packed: bool) -> KTOBatch:
    halves = tuple(collate_half(units, j, pad_id, packed) for j in (0, 1))
    return KTOBatch(batch.tensors, batch.ints, batch.real_tokens, batch.label_tokens, halves)


def collate_units_shared(units: list[PairUnit], pad_id: int, cuts: list[int]) -> Batch:
    """`collate_units`' padded batch with one row per unit: the prefix its two sequences share (the
    prompt, and any first answer tokens both have) once, then the rest of each, under a 4-D mask
    keeping them apart (jobs/data/shared_prefix.py). The label indices point at the hidden states
    that predict each label: an answer's first token is predicted by the shared prefix's last.
    `cuts`: each unit's shared prefix length (`shared_cuts`)."""
    tensors, starts = shared_prefix.branch_rows(
        [u.first.input_ids[:n] for u, n in zip(units, cuts)],
        [[u.first.input_ids[n:], u.second.input_ids[n:]] for u, n in zip(units, cuts)], pad_id)
    width = tensors["input_ids"].shape[1]
    rows, targets, seqs = [], [], []
    for k, (unit, n) in enumerate(zip(units, cuts)):
        for j, seq in enumerate((unit.first, unit.second)):
            moved = k * width + starts[k][j] - n   # a position past the prefix, as a flat index
            for p in range(1, len(seq.labels)):
                if seq.labels[p] != IGNORE_INDEX:
                    rows.append(k * width + p - 1 if p - 1 < n else moved + p - 1)
                    targets.append(seq.labels[p])
                    seqs.append(2 * k + j)
    tensors.update(pref_rows=torch.tensor(rows, dtype=torch.long), pref_targets=torch.tensor(targets, dtype=torch.long),
                   pref_seq=torch.tensor(seqs, dtype=torch.long))
    real = sum(len(u.first.input_ids) + len(u.second.input_ids) - n for u, n in zip(units, cuts))
    return _with_units(Batch(tensors, {}, real, len(units)), units)


def _packed_answer(packed: shared_prefix.PackedDocuments, seq: Example, n: int, prefix: list[int], number: int,
                   labels: tuple[list, list, list]) -> None:
    """Sequence `number`'s rest after its shared prefix (`n` tokens at flat `prefix`) as a query document
    behind that prefix, and its label rows: the flat index of the hidden state that predicts each label
    (an answer's first token is predicted by the prefix's last), the label, the sequence."""
    start, rest = len(packed.ids), seq.input_ids[n:]
    if rest:   # an answer that is all prefix has no document (its labels are the prefix's)
        packed.document(rest, n, prefix)
    for p in range(1, len(seq.labels)):
        if seq.labels[p] != IGNORE_INDEX:
            labels[0].append(prefix[p - 1] if p - 1 < n else start + p - 1 - n)
            labels[1].append(seq.labels[p])
            labels[2].append(number)


def _with_labels(tensors: dict, labels: tuple[list, list, list]) -> dict:
    rows, targets, seqs = (torch.tensor(column, dtype=torch.long) for column in labels)
    tensors.update(pref_rows=rows, pref_targets=targets, pref_seq=seqs)
    return tensors


def collate_units_packed_shared(units: list[PairUnit], pad_id: int, packed_rows: list[list[int]], row_length: int,
                                cuts: list[int]) -> Batch:
    """`collate_units`' packed batch with each unit's shared prefix once: in a row, per unit its prefix
    then the rest of each sequence (positions continuing from the prefix), each a query document;
    `kv_index` lists every document's keys (the prefix's own; a rest's prefix then its own) and
    `cu_seq_lens_k` bounds them (kernels/packed_attention.py); a row's padding tail is a document of its
    own. The label indices point at the hidden states that predict each label, as in
    `collate_units_shared`. `cuts`: the shared prefix length of each unit (`shared_cuts`)."""
    packed, labels = shared_prefix.PackedDocuments(), ([], [], [])
    for row in packed_rows:
        row_end = len(packed.ids) + row_length
        for k in row:
            unit, n = units[k], cuts[k]
            prefix = packed.document(unit.first.input_ids[:n]) if n else []
            for j, seq in enumerate((unit.first, unit.second)):
                _packed_answer(packed, seq, n, prefix, 2 * k + j, labels)
        if len(packed.ids) < row_end:   # the padding tail: attends to itself only
            packed.document([pad_id] * (row_end - len(packed.ids)))
    tensors, ints = packed.tensors(len(packed_rows))
    real = sum(len(u.first.input_ids) + len(u.second.input_ids) - n for u, n in zip(units, cuts))
    return _with_units(Batch(_with_labels(tensors, labels), ints, real, len(units)), units)


def collate_units_riding(units: list[PairUnit], pad_id: int, length: int, cuts: list[int],
                         bucket: int | None = None) -> Batch:
    """A KTO training batch whose KL completions ride along: one packed row of `length` tokens holding,
    per unit, its prefix and its completion, then every unit's KL completion behind its prefix, then the
    padding. The leading part is what trains; `kto_rows` (kernels/checkpoint_rows.py BackwardRows) says
    where it ends, in tokens, documents, attention keys and label rows (the KL completions' labels come
    after all the completions'), so checkpointed layers recompute and backpropagate it alone, rounded up
    into the KL completions to a multiple of `bucket` tokens (checkpoint_rows.BUCKET; exact, more work)."""
    packed, labels, prefixes = shared_prefix.PackedDocuments(), ([], [], []), []
    for k, (unit, n) in enumerate(zip(units, cuts)):
        prefixes.append(packed.document(unit.first.input_ids[:n]) if n else [])
        _packed_answer(packed, unit.first, n, prefixes[k], 2 * k, labels)
    trained, trained_labels = len(packed.ids), len(labels[0])
    for k, (unit, n) in enumerate(zip(units, cuts)):
        _packed_answer(packed, unit.second, n, prefixes[k], 2 * k + 1, labels)
    if len(packed.ids) < length:
        packed.document([pad_id] * (length - len(packed.ids)))
    bucket = bucket or checkpoint_rows.BUCKET
    tokens = min(-(-trained // bucket) * bucket, len(packed.ids))
    rows = checkpoint_rows.BackwardRows(tokens, *packed.leading(tokens), trained_labels)
    tensors, ints = packed.tensors(1)
    real = sum(len(u.first.input_ids) + len(u.second.input_ids) - n for u, n in zip(units, cuts))
    return _with_units(Batch(_with_labels(tensors, labels), {**ints, "kto_rows": rows}, real, len(units)), units)


def shared_cuts(units: list[PairUnit]) -> list[int]:
    """How many leading tokens each unit's two sequences share (the prompt, at least)."""
    return [shared_prefix.common_prefix(u.first.input_ids, u.second.input_ids) for u in units]


def shared_pays(units: list[PairUnit], cuts: list[int], model_size: tuple[int, int]) -> bool:
    """Whether `collate_units_shared` costs fewer FLOPs than two padded rows a unit
    (shared_prefix.pays; `model_size`: the model's hidden and MLP sizes)."""
    shared = max(len(u.first.input_ids) + len(u.second.input_ids) - n for u, n in zip(units, cuts))
    padded = max(max(len(u.first.input_ids), len(u.second.input_ids)) for u in units)
    return shared_prefix.pays(len(units), shared, 2 * len(units), padded, *model_size)


class PairPlan(BatchPlan):
    """BatchPlan over units: the same packing, length grouping, epochs, resume and ranks; a batch
    holds both sequences of each unit. `label_tokens` of a batch counts its units (the loss is
    normalised per pair, so the loop divides by the global batch's units). `pass_units`: at most
    this many units (packed rows, or pairs) a forward; a larger micro-batch becomes `Passes`.
    `reference_given`: the reference sums are precomputed, so KTO's training batches need no whole
    token tensors beside their halves (`units_only`). `kto_kl`: how KTO's training batches hold the KL
    completions: "halves" (also apart, KTOBatch), "riding" (packed with shared prompts: last,
    `collate_units_riding`) or "whole" (as the pairs' second sequences)."""

    def __init__(self, *args, shared: tuple[int, int] | None = None, kto_kl: str = "whole",
                 reference_given: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.kto_kl = kto_kl
        self.reference_given = reference_given
        # (hidden, MLP size): padded units hold their prompt once where that pays; packed ones always
        # (collate_units_packed_shared), and rows are packed by what a unit then holds
        self.shared = shared
        self.cuts = shared_cuts(self.examples) if shared and self.packed else None
        if self.cuts is not None:
            self.lengths = [len(u.first.input_ids) + len(u.second.input_ids) - n
                            for u, n in zip(self.examples, self.cuts)]
            self.rows = pack(self.lengths, self.row_length, self.seed)

    def _collate_one(self, group: list[int]) -> Batch:
        units, where, cuts = self._layout(group)
        if self.kto_kl == "riding" and where is not None and cuts is not None:
            return collate_units_riding(units, self.pad_id, len(where) * self.row_length, cuts)
        if self.kto_kl != "halves":
            return self._collate_whole(units, where, cuts)
        whole = units_only(units, cuts) if self.reference_given else self._collate_whole(units, where, cuts)
        return with_halves(whole, units, self.pad_id, self.packed)

    def _layout(self, group: list[int]) -> tuple[list[PairUnit], list[list[int]] | None, list[int] | None]:
        """(the units of `group`; packed, each row's positions among them, else None; each unit's
        shared prefix when the batch holds it once, else None)."""
        if self.packed:
            members = [self.rows[r] for r in group]
            ends = itertools.accumulate(len(row) for row in members)
            where = [list(range(end - len(row), end)) for row, end in zip(members, ends)]
            flat = [i for row in members for i in row]
            cuts = [self.cuts[i] for i in flat] if self.cuts is not None else None
            return [self.examples[i] for i in flat], where, cuts
        units = [self.examples[i] for i in group]
        cuts = shared_cuts(units) if self.shared else None
        return units, None, cuts if cuts is not None and shared_pays(units, cuts, self.shared) else None

    def _collate_whole(self, units: list[PairUnit], where: list[list[int]] | None, cuts: list[int] | None) -> Batch:
        if where is not None:
            if cuts is not None:
                return collate_units_packed_shared(units, self.pad_id, where, self.row_length, cuts)
            return collate_units(units, self.pad_id, where, self.row_length)
        if cuts is not None:
            return collate_units_shared(units, self.pad_id, cuts)
        return collate_units(units, self.pad_id)

    def completion_bounds(self, micro_batches: int) -> tuple[int, ...]:
        """KTO's pass with grad (`collate_half` j = 0) in the memory plan (jobs/models/fit_kto.py): entry
        k - 1 is how many more completion tokens a pass of k units may hold than one of k - 1, over the
        first `micro_batches` micro-batches of this plan (each epoch's order), so the first k summed
        bound every such pass. A pass packs its units' completions into one row of exactly their tokens
        (the k largest summed bound it), or pads k rows to the longest completion. One process's passes
        (pass_units) and stand-in are units of one micro-batch; with several, `deal` re-cuts the
        micro-batches of a step (up to `accumulation` of them), so the pool is each run of that many."""
        window = self.accumulation if self.world > 1 else 1
        most, epoch = [0] * self.batch_size, 0
        while micro_batches > 0:
            groups = self.epoch_batches(epoch)[:micro_batches]
            for start in range(len(groups)):
                pool = [unit for group in groups[start:start + window] for unit in group]
                counts = sorted((self._completions(unit) for unit in pool), reverse=True)[:self.batch_size]
                held = 0
                for k, count in enumerate(counts):
                    held = held + count if self.packed else (k + 1) * counts[0]
                    most[k] = max(most[k], held)
            micro_batches, epoch = micro_batches - self.per_epoch, epoch + 1
        return tuple(most[:1] + [b - a for a, b in zip(most, most[1:])])

    def _completions(self, unit: int) -> int:
        """Completion tokens of a unit of a micro-batch: a packed row's, or an example's."""
        members = self.rows[unit] if self.packed else [unit]
        return sum(len(self.examples[i].first.input_ids) for i in members)

    def _stand_in(self, unit: int) -> Batch:
        batch = self._collate_one([unit])    # runs like the others (DDP, FSDP), adds nothing
        batch.tensors["pref_valid"].zero_()
        batch.label_tokens = 0
        return batch
