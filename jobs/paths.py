"""Where Fusetune keeps its state: ``--data-dir``, else ``$FUSETUNE_HOME``, else ``~/.fusetune``."""
from __future__ import annotations

import os
from pathlib import Path


def data_dir(explicit: str | os.PathLike | None = None) -> Path:
    """The data dir, created if missing."""
    chosen = explicit or os.environ.get("FUSETUNE_HOME") or Path.home() / ".fusetune"
    path = Path(chosen).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def jobs_dir(root: Path) -> Path:
    return _sub(root, "jobs")


def datasets_dir(root: Path) -> Path:
    return _sub(root, "datasets")


def model_cache_dir(root: Path) -> Path:
    return _sub(root, "models")


def _sub(root: Path, name: str) -> Path:
    path = Path(root) / name
    path.mkdir(parents=True, exist_ok=True)
    return path
