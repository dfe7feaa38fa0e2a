import pytest

from jobs.store import JobStore


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
