"""One studio (the real app on a fresh data dir) and one browser for the browser tests of a session:
under CI's two xdist workers, one of each per worker (tests/suite_plan.py splits the browser modules
into two units)."""
from pathlib import Path

import pytest

from jobs.queue.runner import Runner
from jobs.queue.store import JobState
from tests.e2e.browser import CHROMIUM, chromium_browser, new_context
from tests.e2e.studio_page import running_app
from tests.tiny import make_tiny_model


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/e2e/" in str(item.fspath) and not CHROMIUM.exists():
            item.add_marker(pytest.mark.skip(reason=f"{CHROMIUM} is missing (apt-get install chromium)"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed browser test shows the end of the studio's log beside its traceback: what the
    server did meanwhile is the half of the story a CI log otherwise lacks."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed or "studio" not in item.fixturenames:
        return
    log = Path(item.funcargs["studio"][2]).parent / "app.log"
    if log.is_file():
        report.sections.append(("the studio's log, its end", log.read_text(errors="replace")[-4000:]))


@pytest.fixture(scope="session")
def studio(tmp_path_factory, builtin_seed):
    """(url, tiny model dir, data dir): the real app on a fresh data dir."""
    root = tmp_path_factory.mktemp("e2e")
    model_dir = make_tiny_model(root / "tiny")
    # the studio reads only its data dir and the folders the operator allows (jobs/checks/access.py)
    with running_app(root, "--allow-dir", str(model_dir), seed=builtin_seed) as (url, _):
        yield url, model_dir, root / "data"


@pytest.fixture(scope="session")
def browser():
    with chromium_browser() as chromium:
        yield chromium


@pytest.fixture(scope="session")
def browser_context(browser):
    """An English browser (navigator.language en-US)."""
    context = new_context(browser, "en-US")
    yield context
    context.close()


@pytest.fixture(scope="session")
def shots(tmp_path_factory):
    return tmp_path_factory.mktemp("shots")


class CancelOnlyRunner(Runner):
    """The runner's cancel on the studio's data dir, without reconcile: it never claims or starts
    a job from the test process (the studio's own runner finishes the cancelled ones)."""

    def reconcile(self):
        pass


@pytest.fixture(autouse=True)
def no_job_left_running(studio):
    """A test that fails half-way leaves no long job to block the next test's queue."""
    yield
    runner = CancelOnlyRunner(studio[2])
    for record in runner.store.list(states=(JobState.QUEUED, JobState.RUNNING)):
        runner.cancel(record.id)
