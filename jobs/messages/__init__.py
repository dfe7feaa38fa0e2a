"""The sentences jobs/ writes for a person, by name: one English template each, with {placeholders},
kept in this package's modules by where they are said (data.py, runs.py, models_and_cluster.py,
evaluate.py).

Code builds such text with ``say("row_not_json", where=..., detail=...)``, which returns the plain
English str. Such text crosses process boundaries (events.jsonl, the preflight child's JSON, the
queue's SQLite reason) as plain text anyway, so the studio translates by the templates themselves:
studio/server_text.py derives a pattern from each one and renders ``msg.<key>`` from
studio/locales/zh-CN.json. jobs/ knows no language but English: add a template to one of them and its
Chinese there, in the same commit (tests/studio/test_job_messages.py checks both).

Placeholder names carry meaning for that pattern: ``where`` is a row's place ("row 3 (line 5)"),
row/line/count-like names (also rank, step, index) and ``{x:,}`` are numbers, ``problems`` is a
"; "-joined list of row problems, ``findings`` one of "key: message" pieces and ``gpu_reasons`` one of
per-GPU reasons, ``field`` is a JobSpec key and ``config_file`` a job's config.yaml path,
``problem``/``message`` hold another message; a placeholder's value that is itself one of these
messages is translated too. On the lowest floor of jobs/ (tests/test_layout.py): every package may
import it."""
from __future__ import annotations

from typing import Any

from jobs.messages import data, evaluate, models_and_cluster, runs


# one dict, in the order the templates were written (studio/server_text.py tries them in order)
MESSAGES: dict[str, str] = {**data.MESSAGES, **runs.MESSAGES, **models_and_cluster.MESSAGES,
                             **evaluate.MESSAGES}


def say(key: str, /, **params: Any) -> str:
    """The English sentence `key` with its placeholders filled: a plain str, as it would cross a
    process boundary anyway (and rows keep their `where` by the million: no extra object each).
    An unknown key is a KeyError, so a typo shows in the first test that reaches it."""
    return MESSAGES[key].format(**params)
