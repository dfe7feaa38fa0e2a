"""What the studio may read: uploads in its data dir, folders the operator allowed, hub ids.

A studio is a web page anyone who reaches its port can use, so a path typed into it must not open
the server's files: a dataset, eval dataset, model or checkpoint path given through the studio
resolves (symlinks and `..` followed) inside `<data dir>/datasets`, the data dir's model cache or
jobs, or a folder started with `--allow-dir` / $FUSETUNE_ALLOW_DIRS, and nowhere else. A hub id must
look like `owner/name` and is never allowed to name a local path (datasets.load_dataset would read
a local folder of that name). A refused path and a missing one get the same message, so the answers
do not reveal which files exist. The CLI (`python -m jobs.train`, run by a user on their own
machine) is not restricted by this module, except that hub ids are checked the same way."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from jobs.spec import (BUILTIN_DATASET, BUILTIN_DATASETS, BUILTIN_MODEL, DATASET_SUFFIXES, JobSpec, SpecError,  # noqa: F401
                       hub_id_problem, is_local_reference)

from jobs.checks.reward_code import (ALLOW_REWARD_CODE_ENV, reward_code_problem,  # noqa: F401
                                     reward_uploads_allowed)

ALLOW_DIRS_ENV = "FUSETUNE_ALLOW_DIRS"


class AccessError(SpecError):
    """A reference the studio may not read (or that does not exist: the same answer for both)."""


def use_allowed_dirs(dirs: list[str] | None) -> None:
    """app.py --allow-dir: check the folders and hand them to every DataAccess.for_studio in this
    process through $FUSETUNE_ALLOW_DIRS. SystemExit naming a folder that does not exist."""
    if not dirs:
        return
    for folder in dirs:
        if not Path(folder).expanduser().is_dir():
            raise SystemExit(f"fusetune: --allow-dir {folder}: not a folder")
    os.environ[ALLOW_DIRS_ENV] = os.pathsep.join(os.path.realpath(os.path.expanduser(d)) for d in dirs)


def allowed_dirs_from_env() -> list[Path]:
    raw = os.environ.get(ALLOW_DIRS_ENV, "")
    return [Path(part) for part in raw.split(os.pathsep) if part.strip()]


@dataclass(frozen=True)
class DataAccess:
    """The read policy of one studio. `DataAccess.for_studio(data_dir)` is the studio's policy."""

    data_dir: Path
    allowed: tuple[Path, ...] = field(default=())

    @classmethod
    def for_studio(cls, data_dir: str | os.PathLike, allow_dirs: list[str | os.PathLike] | None = None
                   ) -> "DataAccess":
        """The data dir plus the operator's folders: `allow_dirs`, else $FUSETUNE_ALLOW_DIRS."""
        chosen = allow_dirs if allow_dirs is not None else allowed_dirs_from_env()
        allowed = []
        for folder in chosen:
            real = Path(os.path.realpath(os.path.expanduser(folder)))
            if not real.is_dir():
                raise ValueError(f"--allow-dir {folder}: not a folder")
            allowed.append(real)
        return cls(Path(os.path.realpath(data_dir)), tuple(allowed))

    # ---- the roots a kind of reference may come from -----------------------------------
    def dataset_roots(self) -> tuple[Path, ...]:
        return (self.data_dir / "datasets", *self.allowed)

    def model_roots(self) -> tuple[Path, ...]:
        return (self.data_dir / "models", *self.allowed)

    def reward_roots(self) -> tuple[Path, ...]:
        """Reward files are code the job runs: only the data dir's rewards/ (uploads, which need
        app.py --allow-reward-code) and the operator's folders."""
        return (self.data_dir / "rewards", *self.allowed)

    def reward_file(self, value: str, key: str = "reward_file") -> str:
        """An allowed reward file's real path. The rule for code (jobs/checks/reward_code.py) comes
        first, on the resolved path: a file the studio wrote is refused even inside an --allow-dir
        folder that contains the data dir, whether or not it exists."""
        value = value.strip()
        candidate = value if os.path.isabs(value) else str(self.reward_roots()[0] / value)
        problem = reward_code_problem(candidate, self.data_dir)
        if problem:
            raise AccessError(key, problem)
        return str(self._inside(value, self.reward_roots(), key, want_dir=False))

    def checkpoint_roots(self) -> tuple[Path, ...]:
        return (self.data_dir / "jobs", *self.allowed)

    # ---- checks ------------------------------------------------------------------------
    def dataset(self, value: str, key: str = "dataset") -> str:
        """The dataset reference to use (an allowed file's real path, builtin or a hub id)."""
        value = value.strip()
        if value in BUILTIN_DATASETS:
            return value
        if is_local_reference(value, DATASET_SUFFIXES):
            return str(self._inside(value, self.dataset_roots(), key, want_dir=False))
        return self._hub_id(value, key)

    def model(self, value: str, key: str = "model") -> str:
        return self._model(value, key, self.model_roots())

    def chat_model(self, value: str, key: str = "model") -> str:
        """A model the Chat tab may load: one a job may train on, or an export of one of the
        studio's jobs (a merged folder or a GGUF file under `<data dir>/jobs`)."""
        return self._model(value, key, (*self.model_roots(), self.data_dir / "jobs"))

    def checkpoint(self, value: str, key: str = "resume_from") -> str:
        """A checkpoint folder of one of the studio's jobs (or inside an allowed folder)."""
        return str(self._inside(value.strip(), self.checkpoint_roots(), key, want_dir=True))

    def check_values(self, values: dict) -> dict:
        """The form's (or a YAML's) raw values with every reference checked, before JobSpec sees
        them: JobSpec's own validation says "does not exist" only for missing files, so calling
        it first would tell a visitor which files exist. Raises AccessError naming the field;
        paths come back as their real paths, so what is checked is what the job opens."""
        checks = {"dataset": self.dataset, "eval_dataset": self.dataset, "model": self.model,
                  "resume_from": self.checkpoint, "reward_file": self.reward_file}
        out = dict(values)
        for key, check in checks.items():
            value = out.get(key)
            if isinstance(value, str) and value.strip():
                out[key] = check(value, key=key)
        return out

    def check_spec(self, spec: JobSpec) -> JobSpec:
        """check_values on a JobSpec, in place (for callers that already hold one)."""
        for key, value in self.check_values(spec.to_dict()).items():
            setattr(spec, key, value)
        return spec

    def _model(self, value: str, key: str, roots: tuple[Path, ...]) -> str:
        value = value.strip()
        if value == BUILTIN_MODEL:
            return value
        if is_local_reference(value, (".gguf",)):
            return str(self._inside(value, roots, key, want_dir=not value.endswith(".gguf")))
        return self._hub_id(value, key)

    @staticmethod
    def _hub_id(value: str, key: str) -> str:
        problem = hub_id_problem(value)
        if problem:
            raise AccessError(key, problem)
        return value

    def _inside(self, value: str, roots: tuple[Path, ...], key: str, want_dir: bool) -> Path:
        """The real path of `value` if it is an existing file (or folder) under one of `roots`.
        A relative path is taken relative to the first root (the uploads folder)."""
        candidate = Path(value) if os.path.isabs(value) else roots[0] / value
        real = Path(os.path.realpath(candidate))
        inside = any(real.is_relative_to(Path(os.path.realpath(root))) for root in roots)
        exists = real.is_dir() if want_dir else real.is_file()
        if not (inside and exists):
            where = {"resume_from": "a checkpoint of one of its jobs",
                     "reward_file": "a reward file in its data dir's rewards/ folder"}.get(key, "an uploaded file")
            extra = f" or a file inside {', '.join(str(p) for p in self.allowed)}" if self.allowed else ""
            raise AccessError(key, f"{value!r} is not available to the studio: use {where}{extra}. The "
                              "studio reads only its data dir and folders the operator allows "
                              "(app.py --allow-dir DIR)")
        return real

