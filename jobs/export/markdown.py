"""User text in a model card (markdown): a job name, a dataset path, a config holding a bot name
may carry backticks, quotes, backslashes, line breaks, emoji or right-to-left marks. Each is put
where markdown cannot read it as markup: a code span or code block whose fence is longer than any
backtick run inside (CommonMark, "Code spans" and "Fenced code blocks"), a heading on one line.
Python and YAML inside them are quoted by json.dumps and yaml.safe_dump."""
from __future__ import annotations

import re

_BACKTICKS = re.compile(r"`+")


def _longest_run(text: str) -> int:
    return max((len(run) for run in _BACKTICKS.findall(text)), default=0)


def one_line(text) -> str:
    """Text as one line (a heading, a list item): its line breaks as spaces."""
    return " ".join(str(text).splitlines()).strip()


def code(text) -> str:
    """Text as a code span, whatever backticks it holds (a space pads text that starts or ends
    with a backtick or a space, which CommonMark strips again)."""
    text = one_line(text) or " "
    fence = "`" * (_longest_run(text) + 1)
    pad = " " if text[0] in "` " or text[-1] in "` " else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def fenced(text: str, info: str = "") -> str:
    """A code block around `text` that no line of it can close."""
    fence = "`" * max(3, _longest_run(text) + 1)
    return f"{fence}{info}\n{text}\n{fence}"
