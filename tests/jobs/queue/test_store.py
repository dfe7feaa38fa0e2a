import pytest

from jobs.queue.store import JobStore


def test_add_get_list_update(tmp_path):
    store = JobStore(tmp_path / "jobs.sqlite")
    a = store.add("a", "first", tmp_path / "a", {"lora_r": 4})
    b = store.add("b", "second", tmp_path / "b", {"lora_r": 8})
    assert store.get("a").spec == {"lora_r": 4} and store.get("a").state == "queued"
    assert [r.id for r in store.list()] == ["b", "a"] or b.created_at == a.created_at
    store.update("a", state="running", pid=123, started_at=1.0)
    assert store.get("a").pid == 123 and not store.get("a").finished
    assert [r.id for r in store.list(states=("running",))] == ["a"]
    assert store.get("zzz") is None


def test_transition_is_compare_and_set(tmp_path):
    store = JobStore(tmp_path / "jobs.sqlite")
    store.add("a", "n", tmp_path, {})
    assert store.transition("a", ("queued",), state="running")
    assert not store.transition("a", ("queued",), state="running")
    assert store.transition("a", ("running",), state="done", finished_at=2.0)
    assert store.get("a").finished


def test_bad_updates_are_refused(tmp_path):
    store = JobStore(tmp_path / "jobs.sqlite")
    store.add("a", "n", tmp_path, {})
    with pytest.raises(ValueError):
        store.update("a", state="exploded")
    with pytest.raises(ValueError):
        store.update("a", spec="{}")


def test_state_survives_a_new_store_on_the_same_file(tmp_path):
    JobStore(tmp_path / "jobs.sqlite").add("a", "n", tmp_path, {"x": 1})
    assert JobStore(tmp_path / "jobs.sqlite").get("a").spec == {"x": 1}


def test_an_old_database_gains_the_owner_column(tmp_path):
    import sqlite3
    path = tmp_path / "jobs.sqlite"
    with sqlite3.connect(path) as db:  # the schema before owners were recorded
        db.execute("CREATE TABLE jobs (id TEXT PRIMARY KEY, name TEXT NOT NULL, state TEXT NOT NULL, "
                   "created_at REAL NOT NULL, started_at REAL, finished_at REAL, pid INTEGER, "
                   "job_dir TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '', spec TEXT NOT NULL)")
        db.execute("INSERT INTO jobs (id, name, state, created_at, job_dir, spec) VALUES "
                   "('old', 'n', 'queued', 1.0, '/x', '{}')")
    store = JobStore(path)
    assert store.get("old").owner == ""
    assert store.claim_next("me", max_running=1).owner == "me"
    JobStore(path)  # opening a migrated database again changes nothing


def test_claims_take_the_oldest_queued_job_within_the_running_limit(tmp_path):
    store = JobStore(tmp_path / "jobs.sqlite")
    for job_id in ("a", "b", "c"):
        store.add(job_id, job_id, tmp_path / job_id, {})
    first = store.claim_next("one", max_running=2)
    assert (first.id, first.state, first.owner, first.pid) == ("a", "running", "one", None)
    assert store.claim_next("two", max_running=2).id == "b"
    assert store.claim_next("two", max_running=2) is None  # two running: no room
    assert not store.set_pid("a", "two", 99)  # only the owner records its trainer
    assert store.set_pid("a", "one", 99) and store.get("a").pid == 99
    assert store.transition("a", ("running",), state="done")
    assert store.claim_next("two", max_running=2).id == "c"


def test_delete_is_compare_and_delete(tmp_path):
    store = JobStore(tmp_path / "jobs.sqlite")
    store.add("a", "n", tmp_path, {})
    assert not store.delete("a", ("done", "failed", "cancelled"))
    assert store.transition("a", ("queued",), state="cancelled")
    assert store.delete("a", ("done", "failed", "cancelled")) and store.get("a") is None


def test_the_database_file_is_private(tmp_path):
    JobStore(tmp_path / "jobs.sqlite").add("a", "n", tmp_path, {})
    assert all(p.stat().st_mode & 0o077 == 0 for p in tmp_path.glob("jobs.sqlite*"))


def test_a_claim_can_choose_which_queued_job_starts(tmp_path):
    store = JobStore(tmp_path / "jobs.sqlite")
    for job_id, gpus in (("a", "0"), ("b", "1"), ("c", "0")):
        store.add(job_id, job_id, tmp_path / job_id, {"gpus": gpus})

    def free_gpu(running, queued):  # e.g. a GPU-aware queue: the oldest job whose GPU is free
        busy = {r.spec["gpus"] for r in running}
        return next((q.id for q in queued if q.spec["gpus"] not in busy), None)
    assert [store.claim("me", free_gpu).id for _ in range(2)] == ["a", "b"]
    assert store.claim("me", free_gpu) is None and store.get("c").state == "queued"
    assert store.claim("me", lambda running, queued: "a") is None  # "a" is not queued: nothing claimed


def test_a_full_disk_is_a_storage_error_and_the_store_recovers_by_itself(tmp_path, monkeypatch):
    """SQLite's "database or disk is full" (here: a page limit, as a full disk gives it) is the
    one-line full-disk message naming the database, the free space and the fix; once writes fit
    again, the same store works without a restart (issue 23 item 3)."""
    import sqlite3

    from jobs.io.storage import StorageError
    store = JobStore(tmp_path / "jobs.sqlite")
    store.add("a", "A", tmp_path / "a", {"k": "v"})
    real_connect = JobStore._connect

    def full(self, autocommit=False):
        conn = real_connect(self, autocommit)
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {pages}")
        return conn

    monkeypatch.setattr(JobStore, "_connect", full)
    with pytest.raises(StorageError) as refused:
        store.add("b", "B" * 50_000, tmp_path / "b", {"big": "x" * 200_000})
    message = str(refused.value)
    assert message.startswith(f"cannot write {tmp_path / 'jobs.sqlite'}: No space left on device (")
    assert "free on that disk); free some space on that disk" in message
    assert isinstance(refused.value.__cause__, sqlite3.OperationalError)
    assert [r.id for r in store.list()] == ["a"]  # reads still work
    monkeypatch.setattr(JobStore, "_connect", real_connect)  # space is free again
    store.add("b", "B", tmp_path / "b", {})
    assert sorted(r.id for r in store.list()) == ["a", "b"]
