"""Encode many rows fast: the chat template rendered once per shape of conversation, not per row.

Why: `apply_chat_template` costs about half a millisecond a call in Python (Jinja, plus transformers'
checks), and answer-only labels need two renders a row (jobs/data/encode.py segments), which for
800k rows is most of the time before step 1. Most templates paste each message's content in
verbatim, so the rendered pieces of a conversation are the same for every conversation with the same
roles, with only the contents changed. `Encoder` renders the pieces once per role sequence with
sentinel contents, then fills in each row's contents; the tokenizer's Rust backend then encodes all
pieces of a chunk in one `encode_batch_fast` call (the same ids as `encode_batch` without the character
offsets nothing here reads: 263 -> 214 ms a chunk of 2,000 short chats under the tiny test tokenizer).

Safety: a sentinel has spaces and a newline around it, so a template that strips, escapes or repeats
content (or drops it) is detected (the sentinel is not found exactly once, verbatim) and that role
sequence goes the slow way (`encode.encode`). The first row of every role sequence, and every
VERIFY_EVERY-th row, is also encoded the slow way and compared; a difference turns the fast way off
for that role sequence. What this cannot see is a template that branches on a content's text in rows
it did not verify (e.g. on a '<think>' inside an answer); CACHE_VERSION in cache.py is the lever.

Constant text is tokenized once: a tokenizer splits its input at special tokens before anything else
(HF tokenizers' added-vocabulary pass), so the pieces between two special tokens are tokenized apart
and the ones holding no content (a default system prompt, "<|im_start|>assistant\n"'s specials) are
the same ids in every row. Each shape's pieces are cut there once, the constant parts kept as ids,
and only the parts with a content go to the tokenizer per row (about a third of the tokens of a short
chat under SmolLM2's default system prompt). A shape whose cut pieces do not give the ids of the
uncut text on a probe is not cut; the row checks above still compare with the slow way."""
from __future__ import annotations

import re

from jobs.data import encode
from jobs.data.encode import IGNORE_INDEX, Example

VERIFY_EVERY = 500
_SENTINEL = re.compile(r"  \x00ft(\d+)\x00 \n")


def _sentinel(i: int) -> str:
    return f"  \x00ft{i}\x00 \n"


class Encoder:
    """encode.encode for many rows of one tokenizer (see module doc)."""

    def __init__(self, tokenizer, max_length: int):
        self.tokenizer, self.max_length = tokenizer, max_length
        self.backend = getattr(tokenizer, "backend_tokenizer", None)
        self._shapes: dict[tuple[str, ...], list | None] = {}
        self._seen = 0
        self._ok: set[tuple[str, ...]] = set()   # shapes whose first row matched the slow way
        self._splitter = _special_splitter(tokenizer)
        if self.backend is not None and not _backend_agrees(tokenizer, self.backend):
            self.backend = None

    def encode_many(self, conversations: list) -> list[Example]:
        """Examples in order: every content part of the chunk tokenized in one backend call."""
        plans = [self._pieces(c) for c in conversations]
        texts = [part for plan in plans if plan is not None for parts, _trained in plan
                 for part in parts if isinstance(part, str)]
        ids = iter(self._tokenize(texts))
        out = []
        for conversation, plan in zip(conversations, plans):
            if plan is None:
                out.append(encode.encode(self.tokenizer, conversation, self.max_length))
                continue
            input_ids: list[int] = []
            labels: list[int] = []
            for parts, trained in plan:
                piece: list[int] = []
                for part in parts:
                    piece += next(ids) if isinstance(part, str) else part
                input_ids += piece
                labels += piece if trained else [IGNORE_INDEX] * len(piece)
            out.append(Example(input_ids[:self.max_length], labels[:self.max_length]))
        return self._verified(conversations, plans, out)

    def _tokenize(self, texts: list[str]) -> list[list[int]]:
        if self.backend is not None:
            # encode_batch_fast came with tokenizers 0.21; an older backend encodes the same ids slower
            encode = getattr(self.backend, "encode_batch_fast", self.backend.encode_batch)
            return [e.ids for e in encode(texts, add_special_tokens=False)]
        return [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]

    def _pieces(self, conversation) -> list[tuple[list, bool]] | None:
        """This row's (parts, trained) pieces from its shape's template, or None: the slow way. A part
        is a text to tokenize (it holds a content) or the ids of constant text."""
        if isinstance(conversation, str):
            return None
        shape = tuple(m["role"] for m in conversation)
        if shape not in self._shapes:
            pieces = _shape_pieces(self.tokenizer, shape)
            self._shapes[shape] = None if pieces is None else [(self._cut(text), trained) for text, trained in pieces]
        template = self._shapes[shape]
        if template is None:
            return None
        contents = [m["content"] for m in conversation]
        return [([part.fill(contents) if isinstance(part, _Slots) else part for part in parts], trained)
                for parts, trained in template]

    def _cut(self, text: str) -> list:
        """A template piece as parts (module doc): at special tokens, constant runs as ids; [text]
        when the cut parts do not give the uncut text's ids on a probe content."""
        if self._splitter is None:
            return [_Slots(text)]
        pattern, ids_of = self._splitter
        parts: list = []
        for k, run in enumerate(pattern.split(text)):
            if k % 2:
                parts.append([ids_of[run]])
            elif run:
                parts.append(_Slots(run) if _SENTINEL.search(run) else self._tokenize([run])[0])
        probe = ["Hello, wörld\n 2  spaces"] * (max((int(n) for n in _SENTINEL.findall(text)), default=0) + 1)
        cut = [t for part in parts for t in (self._tokenize([part.fill(probe)])[0] if isinstance(part, _Slots) else part)]
        return parts if cut == self._tokenize([_Slots(text).fill(probe)])[0] else [_Slots(text)]

    def _verified(self, conversations: list, plans: list, examples: list[Example]) -> list[Example]:
        """Spot checks against encode.encode (module doc); a failed shape goes the slow way."""
        for i, (conversation, plan) in enumerate(zip(conversations, plans)):
            self._seen += 1
            if plan is None:
                continue
            shape = tuple(m["role"] for m in conversation)
            if self._shapes.get(shape) is None:   # failed earlier in this chunk: already redone
                continue
            if shape in self._ok and self._seen % VERIFY_EVERY:
                continue
            slow = encode.encode(self.tokenizer, conversation, self.max_length)
            if (slow.input_ids, slow.labels) == (examples[i].input_ids, examples[i].labels):
                self._ok.add(shape)
                continue
            self._shapes[shape], examples = None, [
                encode.encode(self.tokenizer, c, self.max_length)
                if p is not None and tuple(m["role"] for m in c) == shape else e
                for c, p, e in zip(conversations, plans, examples)]
        return examples


class _Slots:
    """A template text with its sentinels found once: literal runs and content numbers, alternating."""
    __slots__ = ("runs",)

    def __init__(self, text: str):
        self.runs = [run if k % 2 == 0 else int(run) for k, run in enumerate(_SENTINEL.split(text))]

    def fill(self, contents: list[str]) -> str:
        runs = self.runs
        if len(runs) == 3:   # one content between two literals: most parts
            return runs[0] + contents[runs[1]] + runs[2]
        return "".join([run if k % 2 == 0 else contents[run] for k, run in enumerate(runs)])


def _special_splitter(tokenizer):
    """(a regex with the special tokens as its one group, their ids) for the special tokens that match
    their own text exactly (no stripping of the spaces beside them), or None when there is none."""
    table = getattr(tokenizer, "added_tokens_decoder", None) or {}
    exact = {tok.content: i for i, tok in table.items()
             if getattr(tok, "special", False) and not (getattr(tok, "lstrip", False) or getattr(tok, "rstrip", False)
                                                        or getattr(tok, "single_word", False))}
    if not exact:
        return None
    alternatives = "|".join(re.escape(t) for t in sorted(exact, key=len, reverse=True))
    return re.compile(f"({alternatives})"), exact


def _shape_pieces(tokenizer, shape: tuple[str, ...]) -> list[tuple[str, bool]] | None:
    """The segments of a conversation of these roles with sentinel contents; None if the template
    does not paste every content in verbatim, exactly once."""
    messages = [{"role": role, "content": _sentinel(i)} for i, role in enumerate(shape)]
    try:
        pieces = encode.segments(tokenizer, messages)
    except Exception:  # a template that refuses a shape is named by the slow way, row by row
        return None
    found = [int(n) for text, _trained in pieces for n in _SENTINEL.findall(text)]
    if sorted(found) != list(range(len(shape))):
        return None
    return pieces


def _backend_agrees(tokenizer, backend) -> bool:
    probe = "<|im_start|>user\nHello, wörld 名字 😀!\n  two  spaces\n"
    return backend.encode(probe, add_special_tokens=False).ids == tokenizer(probe, add_special_tokens=False)["input_ids"]
