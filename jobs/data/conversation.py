"""The two names jobs/data/dataset.py and jobs/data/encode.py share: a chat message and the data error.

Kept apart so that data.py (reading rows) and encode.py (tokenizing them) can import each other's
users without an import circle."""
from __future__ import annotations

Message = dict[str, str]


class DataError(ValueError):
    """Bad training data; the message says where (file, row, field) and how to fix it."""
