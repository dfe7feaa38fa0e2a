"""Test-wide setup. TRITON_INTERPRET must be set before triton is first imported, so that the
Triton kernels run on CPU tensors in CI (there is no GPU there)."""
import os
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see jobs/train/cli.py

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


import pytest  # noqa: E402

pytest_plugins = ("tests.suite_plan",)   # two xdist workers on CI: threads, work units, order


@pytest.fixture(autouse=True)
def _restore_environment():
    """Each test gets the environment it started with back: `jobs.train.cli.main` run in-process points
    the library caches at its data dir through os.environ, which must not leak into later tests."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="session")
def builtin_seed(tmp_path_factory):
    """The built-in model converted once per session, shared by the xdist workers (tests/builtin_home.py):
    `builtin_seed.home(dir)` makes `dir` a data dir that holds it, as a user's does after the first job."""
    from tests.builtin_home import BuiltinSeed, shared_root
    return BuiltinSeed(shared_root(tmp_path_factory))
