"""How the whole suite runs on CI's two cores (issue 41): `bash scripts/test.sh` starts two
pytest-xdist workers (`-n 2 --dist loadgroup --no-loadscope-reorder`), one CPU thread each.

- Thread count: two workers of one thread beat one process of two threads for these small models
  (the threads of one matmul wait on each other; two tests do not). Set before torch is imported,
  and inherited by the jobs, studios and chromiums a test starts.
- Work units: a test module is one unit (what `--dist loadscope` does), so its module fixtures are
  made once; the browser tests are BROWSER_UNITS units ("e2e-1", "e2e-2": whole modules, balanced
  by their seconds in the durations file), so that each worker runs one with its own studio and
  chromium (session fixtures: one per worker, made by its first browser test) instead of one worker
  clicking through ~30 minutes of pages while the other runs out of work.
  `pytest_xdist_make_scheduler` below gives xdist these units.
- Order: the browser units first (one to each worker), then the heaviest units, so that the run
  does not end on one worker finishing a 6-minute demo while the other idles. Weights come from
  tests/durations.json (seconds per module, written by `pytest --save-durations`); a module not in
  it weighs SLOW_GUESS_S per `slow` test, BROWSER_GUESS_S per browser test and 1 s per other.
  pytest-split (jerry-git/pytest-split) keeps such a file for the same reason.

Without xdist nothing here changes a run (targeted runs keep their order and threads)."""
from __future__ import annotations

import functools
import json
import os
from collections import defaultdict
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("durations.json")
ROOT = DURATIONS.parents[1]
SLOW_GUESS_S = 120.0   # a new `slow` test trains or loads the built-in model: minutes on 2 cores
BROWSER_GUESS_S = 60.0   # a new browser test clicks through the real studio, often a job too
OTHER_GUESS_S = 1.0
BROWSER_GROUP = "e2e"
BROWSER_UNITS = 2   # one per CI worker
WORKER = os.environ.get("PYTEST_XDIST_WORKER")   # set by xdist before a worker loads any conftest

if WORKER:
    for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_name, "1")


def pytest_addoption(parser):
    parser.addoption("--save-durations", action="store_true",
                     help=f"write each test module's seconds to {DURATIONS.name} (the xdist order's weights)")


def pytest_configure(config):
    if WORKER:
        import torch   # imported after OMP_NUM_THREADS was set; this covers a plugin that imported it first
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def unit_of(nodeid: str) -> str:
    """The work unit: a browser module is in one of the BROWSER_UNITS browser units, any other
    module is one."""
    module = module_of(nodeid)
    if not module.startswith("tests/e2e/"):
        return module
    return _browser_units().get(module, f"{BROWSER_GROUP}-1")


@functools.cache
def _browser_units() -> dict[str, str]:
    """The browser modules on disk, split by the durations file (the same on every worker and
    on the controller: they read the same files)."""
    known = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}
    modules = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "tests" / "e2e").glob("test_*.py"))
    return split_browser_modules(modules, known)


def split_browser_modules(modules: list[str], known: dict[str, float], units: int = BROWSER_UNITS) -> dict[str, str]:
    """module -> browser unit: heaviest module first into the lightest unit so far (the greedy
    longest-processing-time rule); a module not in `known` weighs BROWSER_GUESS_S."""
    loads = [0.0] * units
    split = {}
    for module in sorted(modules, key=lambda m: (-known.get(m, BROWSER_GUESS_S), m)):
        lightest = loads.index(min(loads))
        loads[lightest] += known.get(module, BROWSER_GUESS_S)
        split[module] = f"{BROWSER_GROUP}-{lightest + 1}"
    return split


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Under `--dist loadgroup`: xdist's scope scheduler with our units. (xdist 3.8 marks groups by
    rewriting `item._nodeid`, which pytest 9 no longer reads, so its own loadgroup ran every test
    as a unit of its own: a studio on each worker, module fixtures made twice.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)
    return UnitScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    if WORKER:
        known = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}
        plan(items, known)


def plan(items: list, known: dict[str, float]) -> None:
    """Sort the work units heaviest first, the browser units before all others (a stable sort: each
    unit's tests keep their written order). xdist hands the first unit to one worker and the second
    to the other, so the two browser units run side by side, each with its own studio and chromium,
    never one after the other on one worker. Every worker must get the same order: it reads only
    the file and the `slow` marks."""
    weight, counted = defaultdict(float), set()
    for item in items:
        unit, module = unit_of(item.nodeid), module_of(item.nodeid)
        if module not in known:
            weight[unit] += guess_s(item, unit)
        elif module not in counted:
            counted.add(module)
            weight[unit] += known[module]
    def order(item) -> tuple[bool, float]:
        unit = unit_of(item.nodeid)
        return not unit.startswith(BROWSER_GROUP), -weight[unit]
    items.sort(key=order)


def guess_s(item, group: str) -> float:
    if item.get_closest_marker("slow"):
        return SLOW_GUESS_S
    return BROWSER_GUESS_S if group.startswith(BROWSER_GROUP) else OTHER_GUESS_S


SECONDS: dict[str, float] = defaultdict(float)   # the controller's: module -> seconds this run
BUSY: dict[str, float] = defaultdict(float)      # and worker -> seconds of tests it ran


def pytest_runtest_logreport(report):
    """Seconds per module (setup, call and teardown, fixtures included), on the controller."""
    if not WORKER:
        SECONDS[module_of(report.nodeid)] += report.duration
        BUSY[_worker(report)] += report.duration


def _worker(report) -> str:
    node = getattr(report, "node", None)   # the controller's handle on the xdist worker that ran it
    return node.gateway.id if node is not None else "main"


def pytest_terminal_summary(terminalreporter):
    """Each worker's seconds of tests: a run that ends long after its total / 2 was badly balanced."""
    if not WORKER and len(BUSY) > 1:
        terminalreporter.write_line("seconds of tests per worker: " + ", ".join(
            f"{worker} {seconds:.0f}" for worker, seconds in sorted(BUSY.items())))


def pytest_sessionfinish(session):
    if WORKER or not session.config.getoption("--save-durations"):
        return
    # the modules this run measured replace their old seconds; the others keep theirs
    seconds = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}
    seconds.update({module: round(s, 1) for module, s in SECONDS.items()})
    kept = {m: s for m, s in sorted(seconds.items()) if s >= 2 * OTHER_GUESS_S and (ROOT / m).is_file()}
    DURATIONS.write_text(json.dumps(kept, indent=0) + "\n")
