"""The lines `python -m jobs.export` prints, which the studio's Export tab reads back."""
from __future__ import annotations

import re

PROGRESS_LINE = re.compile(r"^\[\s*(\d+)%\] (.*)$")  # "[ 42%] wrote blk.3.ffn_up.weight (40/291)"
RESULT_PREFIX = "exported: "  # "exported: /path/model.gguf (8.5 GB)"
NOTE_PREFIX = "note: "
ERROR_PREFIX = "fusetune: export error: "  # on stderr, then exit 1


def progress_line(fraction: float, message: str) -> str:
    return f"[{round(100 * fraction):3d}%] {message}"
