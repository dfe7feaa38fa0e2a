"""Job actions act only on the job asked about, only while it still fits the action; delete takes
the folder with it and refuses an active job."""
import pytest

from jobs.queue.runner import Runner, RunnerError
from jobs.spec import JobSpec
from jobs.queue.store import JobState
from studio import job_actions


class StillRunner(Runner):
    """The real runner without its reconcile step, so no trainer process ever starts here."""

    def reconcile(self):
        pass


@pytest.fixture
def runner(tmp_path):
    return StillRunner(tmp_path / "data")


def add_job(runner, job_id, state):
    """A job row and folder without a trainer process (the monitor is not started)."""
    job_dir = runner.data_dir / "jobs" / job_id
    (job_dir / "adapter").mkdir(parents=True)
    (job_dir / "train.log").write_text("log\n")
    runner.store.add(job_id, f"name {job_id}", job_dir, JobSpec().to_dict(), state=state)
    return job_dir


def test_actions_follow_the_state(runner):
    add_job(runner, "q", JobState.QUEUED)
    assert job_actions.actions_for(None) == ()
    assert job_actions.actions_for(runner.store.get("q")) == (job_actions.REMOVE,)
    for state, action in ((JobState.RUNNING, "cancel"), (JobState.DONE, "delete"), (JobState.FAILED, "delete"),
                          (JobState.CANCELLED, "delete")):
        runner.store.update("q", state=state)
        assert job_actions.actions_for(runner.store.get("q")) == (action,)


def test_question_names_the_job_and_folder(runner):
    job_dir = add_job(runner, "d", JobState.DONE)
    text = job_actions.question("delete", runner.store.get("d"), "en")
    assert "d (name d)" in text and str(job_dir) in text and "cannot be undone" in text
    assert "name d" in job_actions.question("delete", runner.store.get("d"), "zh-CN")


def test_delete_removes_row_and_folder(runner):
    job_dir = add_job(runner, "d", JobState.DONE)
    other = add_job(runner, "keep", JobState.DONE)
    assert job_actions.perform(runner, "delete", "d", "en") == ("ok", "Deleted job d and its folder.")
    assert runner.store.get("d") is None and not job_dir.exists()
    assert runner.store.get("keep") is not None and other.exists()
    level, message = job_actions.perform(runner, "delete", "d", "en")
    assert level == "warn" and "no longer exists" in message


def test_a_refused_delete_is_reported_not_raised(runner):
    add_job(runner, "d", JobState.DONE)

    def refuse(job_id):
        raise RunnerError(f"job {job_id!r} is running: cancel it first, then delete it")

    runner.delete = refuse
    level, message = job_actions.perform(runner, "delete", "d", "en")
    assert level == "error" and "was not deleted" in message and "cancel it first" in message


def test_remove_a_queued_job_deletes_it_before_it_starts(runner):
    job_dir = add_job(runner, "q", JobState.QUEUED)
    assert job_actions.perform(runner, "remove", "q", "en")[0] == "ok"
    assert runner.store.get("q") is None and not job_dir.exists()


def test_an_answer_after_the_state_moved_on_does_nothing(runner):
    """Asked "remove the queued job?", but it started meanwhile: nothing is cancelled or deleted."""
    job_dir = add_job(runner, "q", JobState.QUEUED)
    runner.store.update("q", state=JobState.RUNNING)
    calls = []
    runner.cancel = lambda job_id: calls.append(job_id)
    level, message = job_actions.perform(runner, "remove", "q", "en")
    assert level == "warn" and "now running" in message and calls == []
    assert job_dir.exists()
    level, message = job_actions.perform(runner, "cancel", "q", "zh-CN")
    assert level == "ok" and calls == ["q"] and "q" in message


def test_delete_refuses_in_words_while_an_export_runs_and_works_after(runner):
    """An export (here held in this process, as `python -m jobs.export` holds it) keeps its job
    folder: delete says why and leaves everything in place; once the export ends, delete works."""
    from jobs.export.busy import exporting
    job_dir = add_job(runner, "d", JobState.DONE)
    with exporting(job_dir):
        level, message = job_actions.perform(runner, job_actions.DELETE, "d", "en")
        assert level == "error"
        assert message == ("Job d was not deleted: job 'name d' is being exported right now: wait until the "
                           "export ends (the Export tab shows its progress), then delete it")
        assert job_dir.is_dir() and runner.get("d") is not None
    assert job_actions.perform(runner, job_actions.DELETE, "d", "en")[0] == "ok"
    assert not job_dir.exists() and runner.get("d") is None


def test_a_job_waiting_for_gpu_memory_offers_start_anyway(runner):
    job_dir = add_job(runner, "w", JobState.QUEUED)
    runner.store.update("w", reason="waiting for a free GPU: GPU 0: needs 20.0 GiB, 10.0 GiB free")
    assert job_actions.actions_for(runner.store.get("w")) == (job_actions.REMOVE, job_actions.START_ANYWAY)
    level, message = job_actions.perform(runner, job_actions.START_ANYWAY, "w", "en")
    assert level == "ok" and "may run out of memory" in message
    from jobs.queue import placement
    assert placement.read(job_dir)["start_anyway"] is True
    # waiting for our own running job (or the CPU queue): Start anyway would change nothing
    runner.store.update("w", reason="waiting for the running job to finish")
    assert job_actions.actions_for(runner.store.get("w")) == (job_actions.REMOVE,)
