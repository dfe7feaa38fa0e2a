"""One converted built-in model (and its answers to the general prompts) for the whole test session.

Converting the GGUF takes ~40 s and generating the base answers ~3 min on CI's two cores; several
tests need a fresh data dir holding them (the identity and concise demos, the GRPO task, the page
check, the export round trip, the browser studio). Each gets its own data dir whose `models/`
folder is hard-linked from the one seed: the same files a user's data dir would hold after the
first job, made once. The cached files are only ever replaced (written beside and renamed), never
written in place, so a test cannot change the seed through a link.

Under pytest-xdist (tests/suite_plan.py) the seed lives in the run's folder that every worker
shares, and is made by whichever worker asks first: the conversion holds its own file lock
(jobs/models/builtin.py), the answers hold `answers.lock` (filelock, as huggingface_hub locks its
downloads), so the other worker waits for them instead of making them again.

The base answers are not generated in a test run at all while tests/builtin-answers/ holds them for
the current prompts and settings (the cache file itself, named by its key: general.cache_file): a
snapshot made by this same code (`python -m tests.builtin_home` writes a new one when the prompts
or settings change; test_builtin.py fails until then, and the seed generates meanwhile). That saves
~4 CPU-minutes a run (issue 41: "base answers cached").

The conversion itself and the generation stay tested where they are the subject
(tests/jobs/models/test_builtin.py: the conversion, and general.generate on the built-in model for
a few prompts; tests/jobs/data/test_identity.py: the cache)."""
from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

from filelock import FileLock

ANSWERS = Path(__file__).with_name("builtin-answers")   # snapshots of the built-in model's general answers


class BuiltinSeed:
    """A data dir converted once; `home(dest)` gives a test its own data dir built from it."""

    def __init__(self, root: Path):
        self.root = Path(root).resolve()
        self._lock = threading.Lock()

    @property
    def model_cache(self) -> Path:
        from jobs.io import paths
        return paths.model_cache_dir(paths.data_dir(self.root))

    def model_folder(self) -> Path:
        from jobs.models.load import resolve_model
        from jobs.spec import BUILTIN_MODEL
        with self._lock:
            return Path(resolve_model(BUILTIN_MODEL, self.root, log=lambda _line: None))

    def with_answers(self) -> None:
        """The base model's greedy answers to the general prompts, cached as a first identity or
        concise job would (jobs/data/builtin/general.py, keyed by the model's path in the cache)."""
        from jobs.data.builtin import general
        source = self.model_folder()
        # the snapshot, else generated on the first call (of any worker); read from the cache after
        with self._lock, FileLock(self.root / "answers.lock"):
            target = general.cache_file(self.model_cache, str(source))
            snapshot = ANSWERS / target.name
            if snapshot.is_file() and not target.is_file():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(snapshot, target.with_suffix(".tmp"))
                os.replace(target.with_suffix(".tmp"), target)
            general.base_answers(self.model_cache, str(source), log=lambda _line: None)

    def home(self, dest: Path, answers: bool = False) -> Path:
        """`dest` as a data dir holding the converted model (and, with `answers`, its general
        answers); returns dest."""
        self.with_answers() if answers else self.model_folder()
        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)
        target = dest / self.model_cache.relative_to(self.root)
        shutil.copytree(self.model_cache, target, copy_function=_link_or_copy, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("*.lock", ".*.lock"))
        return dest


def shared_root(tmp_path_factory) -> Path:
    """The seed's folder: the session's own, or under xdist the run's folder above the workers'
    (the pytest-xdist docs' recipe for a session fixture made once)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return tmp_path_factory.mktemp("builtin-seed")
    root = tmp_path_factory.getbasetemp().parent / "builtin-seed"
    root.mkdir(exist_ok=True)
    return root


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:   # another file system
        shutil.copy2(src, dst)


def write_answers_snapshot(root: Path) -> Path:
    """Generate the built-in model's general answers in data dir `root` and keep them as the
    snapshot for the current prompts and settings (the old snapshots are removed)."""
    from jobs.data.builtin import general
    seed = BuiltinSeed(root)
    for old in ANSWERS.glob("*.json"):
        old.unlink()
    seed.with_answers()
    source = str(seed.model_folder())
    ANSWERS.mkdir(exist_ok=True)
    snapshot = ANSWERS / general.cache_file(seed.model_cache, source).name
    shutil.copyfile(general.cache_file(seed.model_cache, source), snapshot)
    return snapshot


if __name__ == "__main__":   # python -m tests.builtin_home: a new snapshot (minutes)
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        print(write_answers_snapshot(Path(tmp)))
