"""How CI's two xdist workers share the suite (tests/suite_plan.py) and the suite-time record
(bench/suite_time.py): the browser tests in two units, each other module in one, the heaviest first."""
import json

import pytest

from bench import suite_time
from tests import suite_plan


class Item:
    """What `plan` reads of a collected test: its node id and its marks."""

    def __init__(self, nodeid: str, *marks):
        self.nodeid, self.marks = nodeid, list(marks)

    def get_closest_marker(self, name):
        return next((mark for mark in self.marks if mark.name == name), None)


def test_browser_tests_share_one_unit_and_modules_are_units_heaviest_first():
    items = [Item("tests/e2e/test_a.py::t1"), Item("tests/jobs/test_quick.py::t1"),
             Item("tests/jobs/test_quick.py::t2[x]"), Item("tests/e2e/test_b.py::t1"),
             Item("tests/jobs/test_new_demo.py::t1", pytest.mark.slow.mark), Item("tests/jobs/test_mid.py::t1"),
             Item("tests/x.py::Case::t1")]
    known = {"tests/e2e/test_a.py": 50.0, "tests/e2e/test_b.py": 100.0, "tests/jobs/test_mid.py": 30.0}
    suite_plan.plan(items, known)
    # e2e 150 s (known), the new slow demo 120 s (guessed), the known mid module, then 1-s units
    assert [item.nodeid for item in items] == [
        "tests/e2e/test_a.py::t1", "tests/e2e/test_b.py::t1", "tests/jobs/test_new_demo.py::t1",
        "tests/jobs/test_mid.py::t1", "tests/jobs/test_quick.py::t1", "tests/jobs/test_quick.py::t2[x]",
        "tests/x.py::Case::t1"]
    # a demo heavier than the browser tests still starts after them: the browser units go to the two
    # workers first (here one browser unit, as test_a and test_b are not on disk)
    demo = [Item("tests/jobs/test_demo.py::t"), Item("tests/e2e/test_a.py::t1")]
    suite_plan.plan(demo, {"tests/jobs/test_demo.py": 900.0, "tests/e2e/test_a.py": 50.0})
    assert [item.nodeid for item in demo] == ["tests/e2e/test_a.py::t1", "tests/jobs/test_demo.py::t"]
    units = {suite_plan.unit_of(item.nodeid) for item in items}
    assert units == {"e2e-1", "tests/jobs/test_quick.py", "tests/jobs/test_new_demo.py", "tests/jobs/test_mid.py",
                     "tests/x.py"}


def test_xdist_gets_the_units_as_its_scopes(pytestconfig, monkeypatch):
    monkeypatch.setattr(pytestconfig.option, "dist", "loadgroup", raising=False)
    monkeypatch.setattr(pytestconfig.option, "tx", ["2*popen"], raising=False)   # what `-n 2` sets
    scheduler = suite_plan.pytest_xdist_make_scheduler(pytestconfig, log=None)
    scope = scheduler._split_scope
    assert scope("tests/e2e/test_a.py::t1[x]") == scope("tests/e2e/test_b.py::t") == "e2e-1"
    assert scheduler._split_scope("tests/jobs/test_quick.py::Case::t2") == "tests/jobs/test_quick.py"
    monkeypatch.setattr(pytestconfig.option, "dist", "load")
    assert suite_plan.pytest_xdist_make_scheduler(pytestconfig, log=None) is None


def test_browser_modules_split_into_two_balanced_units():
    modules = ["tests/e2e/test_a.py", "tests/e2e/test_b.py", "tests/e2e/test_c.py", "tests/e2e/test_new.py"]
    known = {"tests/e2e/test_a.py": 300.0, "tests/e2e/test_b.py": 200.0, "tests/e2e/test_c.py": 150.0}
    # a (300) -> 1; b (200) -> 2; c (150) -> 2 (350); the new one (60 s guessed) -> 1 (360)
    assert suite_plan.split_browser_modules(modules, known) == {
        "tests/e2e/test_a.py": "e2e-1", "tests/e2e/test_b.py": "e2e-2", "tests/e2e/test_c.py": "e2e-2",
        "tests/e2e/test_new.py": "e2e-1"}
    # the real browser modules: every one in a unit, both units used (one studio and chromium each)
    real = suite_plan._browser_units()
    assert len(real) == len(list((suite_plan.ROOT / "tests" / "e2e").glob("test_*.py")))
    assert set(real.values()) == {"e2e-1", "e2e-2"}
    browser = "tests/e2e/test_browser.py"
    assert suite_plan.unit_of(f"{browser}::test_job_outlives_the_page") == real[browser]


def test_the_durations_file_names_existing_modules_with_seconds():
    known = json.loads(suite_plan.DURATIONS.read_text())
    root = suite_plan.DURATIONS.parents[1]
    assert known and all(isinstance(s, float) and s >= 0 for s in known.values())
    assert [m for m in known if not (root / m).is_file()] == [], "rerun with --save-durations"


LOG = """2 workers [1167 items]
........
============================= slowest 25 durations =============================
380.12s call     tests/jobs/train/test_grpo_builtin_task.py::test_reward@tests/jobs/train/test_grpo_builtin_task.py
12.00s setup    tests/e2e/test_a.py::test_one@e2e
====== 1 failed, 1160 passed, 5 skipped, 2 errors in 1800.40s (0:30:00) ======
suite total (install and tests): 1900 s
"""


def test_the_suite_time_line_reads_counts_seconds_workers_and_the_slowest():
    row = suite_time.parse(LOG)
    assert row["tests_s"] == 1800 and row["total_s"] == 1900 and row["workers"] == 2
    assert row["counts"] == {"failed": 1, "passed": 1160, "skipped": 5, "error": 2}
    assert row["slowest"][0] == ["tests/jobs/train/test_grpo_builtin_task.py::test_reward", 380]


def test_the_suite_time_line_reads_the_quiet_summary_that_starts_with_failed():
    # `pytest -q` (scripts/test.sh) writes the summary bare, no "=" fence; a failed run starts with "N failed"
    quiet = LOG.replace("====== 1 failed, 1160 passed, 5 skipped, 2 errors in 1800.40s (0:30:00) ======",
                        "6 failed, 1058 passed, 3 skipped, 1 warning in 2950.12s (0:49:10)")
    row = suite_time.parse(quiet)
    assert row["tests_s"] == 2950 and row["total_s"] == 1900
    assert row["counts"] == {"failed": 6, "passed": 1058, "skipped": 3}
    # -q hides xdist's "2 workers" line; the plan's own line names each worker (suite_plan.py)
    quiet = quiet.replace("2 workers [1167 items]", "bringing up nodes...") + "\nseconds of tests per worker: gw0 1730, gw1 1724\n"
    row = suite_time.parse(quiet)
    assert row["workers"] == 2 and row["worker_s"] == {"gw0": 1730, "gw1": 1724}


def test_the_suite_time_script_refuses_a_log_without_a_summary(tmp_path):
    log = tmp_path / "cut.log"
    log.write_text(LOG.split("======")[0])
    with pytest.raises(SystemExit, match="no pytest summary line"):
        suite_time.main([str(log)])
