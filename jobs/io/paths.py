"""Where Fusetune keeps its state: ``--data-dir``, else ``$FUSETUNE_HOME``, else ``~/.fusetune``.

Everything the studio and its jobs write lives under the data dir: jobs.sqlite, jobs/<id>/,
uploaded datasets, the model cache, and the caches and temporary files of the libraries we use
(Hugging Face, Triton, torch, Gradio, matplotlib) under cache/, which `cache_env` points them to."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import MutableMapping

from jobs.io.storage import DIR_MODE, StorageError, make_private_dir

# Library cache and temp locations, each redirected to <data dir>/cache/<folder>.
CACHE_VARS = {
    "HF_HOME": "huggingface",
    "HF_DATASETS_CACHE": "huggingface/datasets",
    "TORCH_HOME": "torch",
    "TRITON_HOME": "triton",
    "TRITON_CACHE_DIR": "triton/cache",
    "TORCHINDUCTOR_CACHE_DIR": "torchinductor",
    "CUDA_CACHE_PATH": "nv",
    "GRADIO_TEMP_DIR": "gradio",
    "XDG_CACHE_HOME": "xdg",
    "MPLCONFIGDIR": "matplotlib",
    "TMPDIR": "tmp",
}
# A Hugging Face cache the user chose on purpose (to share downloaded models) is kept.
USER_CHOSEN = ("HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE")


def data_dir(explicit: str | os.PathLike | None = None) -> Path:
    """The data dir, created (private, 0700) if missing."""
    chosen = explicit or os.environ.get("FUSETUNE_HOME") or Path.home() / ".fusetune"
    path = Path(chosen).expanduser().resolve()
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    return path


def tighten(root: Path) -> str | None:
    """Make a data dir that others can read or enter private (0700); what was done, or why it could
    not be, as a line for the log (None when it already was private)."""
    mode = root.stat().st_mode & 0o777
    if not mode & 0o077:
        return None
    try:
        root.chmod(DIR_MODE)
    except OSError as exc:
        return (f"warning: the data dir {root} is readable by other users (mode {mode:04o}) and could not be made "
                f"private ({exc.strerror}): its owner can run `chmod 700 {root}`, or pass another --data-dir")
    return f"the data dir {root} was readable by other users (mode {mode:04o}); it is now private (0700)"


def check_writable(root: Path) -> None:
    """Raise a StorageError saying what to do when the data dir cannot be written."""
    try:
        probe = tempfile.NamedTemporaryFile(dir=root, prefix=".write-test-", delete=True)
        probe.close()
    except OSError as exc:
        raise StorageError(root, exc) from None


def jobs_dir(root: Path) -> Path:
    return _sub(root, "jobs")


def datasets_dir(root: Path) -> Path:
    return _sub(root, "datasets")


def model_cache_dir(root: Path) -> Path:
    return _sub(root, "models")


def cache_dir(root: Path) -> Path:
    return _sub(root, "cache")


def cache_env(root: Path, env: MutableMapping[str, str]) -> MutableMapping[str, str]:
    """Point the libraries' caches and temp files in `env` at <root>/cache/ (creating the folders).

    Overrides what `env` had, except a Hugging Face cache the user set on purpose (USER_CHOSEN).
    Without one, a login token saved in the default place is still found (read, never written)."""
    cache = cache_dir(root)
    keep_hf = any(env.get(name) for name in USER_CHOSEN)
    default_token = Path(env.get("HOME") or Path.home()) / ".cache" / "huggingface" / "token"
    for name, folder in CACHE_VARS.items():
        if keep_hf and name in USER_CHOSEN:
            continue
        env[name] = str(make_private_dir(cache / folder))
    if not keep_hf and "HF_TOKEN" not in env and "HF_TOKEN_PATH" not in env and default_token.is_file():
        env["HF_TOKEN_PATH"] = str(default_token)
    return env


def use_data_dir_caches(root: Path) -> None:
    """`cache_env` for this process; call it before torch, transformers or gradio are imported."""
    cache_env(root, os.environ)
    tempfile.tempdir = None  # forget a temp dir chosen before TMPDIR changed


def _sub(root: Path, name: str) -> Path:
    return make_private_dir(Path(root) / name)
