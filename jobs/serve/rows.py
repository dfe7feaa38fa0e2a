"""One answer being generated: its tokens, its text so far, and when it ends (EOS, a stop string,
max_tokens, or the client gone). The text sent out is held back while it could still be the start
of a stop string or ends inside a multi-byte character, so a stream never shows what a stop string
will cut (vLLM's detokenizer holds back the same way)."""
from __future__ import annotations

from dataclasses import dataclass, field

PARTIAL_CHAR = "\ufffd"   # what decoding shows for a character whose bytes have not all come yet


@dataclass
class Sampling:
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 16
    stop: list[str] = field(default_factory=list)
    seed: int | None = None


@dataclass
class Row:
    """Choice `index` of a request: feeds tokens in, says which text is new and when it finished."""

    index: int
    prompt: list[int]
    max_tokens: int
    stop: list[str]
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    sent: int = 0                      # characters of `text` already handed out
    finish_reason: str | None = None   # "stop" (EOS or a stop string), "length", or "cancelled"
    reported: bool = False             # the finish has been handed out

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def take(self, token: int, eos: set[int], decode_text) -> None:
        """Add one generated token (ignored once finished)."""
        if self.done:
            return
        self.tokens.append(token)
        if token in eos:
            self.finish_reason = "stop"
        else:
            self.text = decode_text([t for t in self.tokens if t not in eos])
            self._cut_at_stop()
        if not self.done and len(self.tokens) >= self.max_tokens:
            self.finish_reason = "length"

    def _cut_at_stop(self) -> None:
        hits = [self.text.find(s) for s in self.stop if s and s in self.text]
        if hits:
            self.text = self.text[:min(hits)]
            self.finish_reason = "stop"

    def new_text(self) -> str:
        """The text not handed out yet that can safely go out now."""
        end = len(self.text)
        if not self.done:
            end -= max((len(s) - 1 for s in self.stop), default=0)
            while end > self.sent and self.text[end - 1] == PARTIAL_CHAR:
                end -= 1
        if end <= self.sent:
            return ""
        piece, self.sent = self.text[self.sent:end], end
        return piece
