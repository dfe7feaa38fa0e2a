"""What the studio may read (issue 12): uploads and --allow-dir folders only, no escapes by absolute
paths, `..` or symlinks, hub ids that never name a local path, and one message for missing and
forbidden alike."""
import json
import os

import pytest

from jobs.data import dataset as data
from jobs.checks.access import ALLOW_DIRS_ENV, AccessError, DataAccess, hub_id_problem, use_allowed_dirs
from jobs.spec import JobSpec

ROW = {"instruction": "Add", "input": "2+2", "output": "4"}


@pytest.fixture
def studio(tmp_path):
    """A data dir with one upload, a folder the operator allowed and a secret outside both."""
    root = tmp_path / "data"
    (root / "datasets").mkdir(parents=True)
    (root / "datasets" / "train.jsonl").write_text(json.dumps(ROW))
    allowed = tmp_path / "shared"
    allowed.mkdir()
    (allowed / "team.jsonl").write_text(json.dumps(ROW))
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "keys.jsonl").write_text(json.dumps({"text": "password"}))
    return root, allowed, secret, DataAccess.for_studio(root, [allowed])


def _message(exc_info, value):
    return str(exc_info.value).replace(value, "<value>")


def test_uploads_and_allowed_folders_are_readable(studio):
    root, allowed, _, access = studio
    upload = str(root / "datasets" / "train.jsonl")
    assert access.dataset(upload) == os.path.realpath(upload)
    assert access.dataset("train.jsonl") == os.path.realpath(upload)  # a bare name is an upload
    assert access.dataset(str(allowed / "team.jsonl")) == os.path.realpath(allowed / "team.jsonl")
    assert access.dataset("builtin:identity") == "builtin:identity"
    assert access.dataset("owner/name") == "owner/name"


@pytest.mark.parametrize("make_value", [
    lambda root, secret: str(secret / "keys.jsonl"),                              # absolute
    lambda root, secret: "../../secret/keys.jsonl",                               # relative escape
    lambda root, secret: str(root / "datasets" / ".." / ".." / "secret" / "keys.jsonl"),
    lambda root, secret: "/etc/passwd.json",
])
def test_paths_outside_are_refused_like_missing_files(studio, make_value):
    root, _, secret, access = studio
    value = make_value(root, secret)
    with pytest.raises(AccessError) as refused:
        access.dataset(value)
    missing = str(root / "datasets" / "no-such-file.jsonl")
    with pytest.raises(AccessError) as absent:
        access.dataset(missing)
    assert refused.value.key == "dataset"
    assert _message(refused, value) == _message(absent, missing)  # reveals nothing about existence


def test_a_symlink_out_of_the_uploads_is_refused(studio):
    root, _, secret, access = studio
    link = root / "datasets" / "innocent.jsonl"
    link.symlink_to(secret / "keys.jsonl")
    with pytest.raises(AccessError, match="not available to the studio"):
        access.dataset(str(link))
    folder_link = root / "datasets" / "more"
    folder_link.symlink_to(secret, target_is_directory=True)
    with pytest.raises(AccessError):
        access.dataset(str(folder_link / "keys.jsonl"))


@pytest.mark.parametrize("value", ["bench/../../../dir", "a/b/c", "../owner/name", "owner/..", "-x/y",
                                   "owner/name/", "owner name/x", "x"])
def test_malformed_hub_ids_are_refused(studio, value):
    with pytest.raises(AccessError):
        studio[3].dataset(value)
    assert hub_id_problem(value)


def test_a_hub_id_that_names_a_local_folder_is_refused(studio, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "owner" / "name").mkdir(parents=True)
    (tmp_path / "owner" / "name" / "notes.txt").write_text("private")
    with pytest.raises(AccessError, match="names a local path"):
        studio[3].dataset("owner/name")
    with pytest.raises(AccessError, match="names a local path"):
        studio[3].model("owner/name")


def test_the_data_layer_never_gives_a_local_folder_to_load_dataset(tmp_path, monkeypatch):
    """Also outside the studio: datasets.load_dataset would read a local folder of that name."""
    import datasets
    calls = []
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: calls.append(a) or [])
    monkeypatch.chdir(tmp_path)
    (tmp_path / "owner" / "name").mkdir(parents=True)
    for value in ("bench/../../../dir", "owner/name"):
        spec = JobSpec.from_dict({"dataset": value})
        with pytest.raises(data.DataError, match="not a hub id|names a local path"):
            data.load_rows(spec)
    assert calls == []


def test_models_and_checkpoints_follow_the_same_rule(studio):
    root, allowed, secret, access = studio
    (root / "models" / "tiny").mkdir(parents=True)
    (root / "jobs" / "j1" / "checkpoints" / "step-2").mkdir(parents=True)
    assert access.model(str(root / "models" / "tiny")).endswith("tiny")
    assert access.model("builtin:smollm2-135m-instruct") == "builtin:smollm2-135m-instruct"
    assert access.model("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"
    assert access.checkpoint(str(root / "jobs" / "j1" / "checkpoints" / "step-2"))
    for bad in (str(secret), str(secret / "x.gguf"), "/", "~/model"):
        with pytest.raises(AccessError) as refused:
            access.model(bad)
        assert refused.value.key == "model"
    with pytest.raises(AccessError) as refused:
        access.checkpoint(str(secret))
    assert refused.value.key == "resume_from"


def test_the_chat_tab_reads_models_and_the_jobs_exports_only(studio):
    root, allowed, secret, access = studio
    export = root / "jobs" / "j1" / "exports" / "tiny-ft-q8_0.gguf"
    export.parent.mkdir(parents=True)
    export.write_bytes(b"GGUF")
    (root / "jobs" / "j1" / "exports" / "merged").mkdir()
    (allowed / "base").mkdir()
    assert access.chat_model(str(export)) == os.path.realpath(export)
    assert access.chat_model(str(root / "jobs" / "j1" / "exports" / "merged")).endswith("merged")
    assert access.chat_model(str(allowed / "base")).endswith("base")
    assert access.chat_model("builtin:smollm2-135m-instruct") == "builtin:smollm2-135m-instruct"
    assert access.chat_model("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"
    (secret / "model.gguf").write_bytes(b"GGUF")
    for bad in (str(secret), str(secret / "model.gguf"), str(root / "jobs" / "j1" / ".." / ".." / ".." / "secret"),
                "/etc", "~/model"):
        with pytest.raises(AccessError) as refused:
            access.chat_model(bad)
        assert refused.value.key == "model" and "--allow-dir" in str(refused.value)


def test_check_spec_names_the_field_and_uses_real_paths(studio):
    root, allowed, secret, access = studio
    spec = JobSpec.from_dict({"dataset": str(root / "datasets" / "train.jsonl"),
                              "eval_dataset": str(allowed / "team.jsonl")})
    checked = access.check_spec(spec)
    assert checked.eval_dataset == os.path.realpath(allowed / "team.jsonl")
    bad = JobSpec.from_dict({"dataset": str(root / "datasets" / "train.jsonl"),
                             "eval_dataset": str(secret / "keys.jsonl")})
    with pytest.raises(AccessError) as refused:
        access.check_spec(bad)
    assert refused.value.key == "eval_dataset"


def test_allow_dir_reaches_the_policy_through_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv(ALLOW_DIRS_ENV, raising=False)
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir(), two.mkdir()
    (two / "d.jsonl").write_text(json.dumps(ROW))
    use_allowed_dirs([str(one), str(two)])
    access = DataAccess.for_studio(tmp_path / "data")
    assert access.dataset(str(two / "d.jsonl"))
    with pytest.raises(SystemExit, match="--allow-dir .*missing: not a folder"):
        use_allowed_dirs([str(tmp_path / "missing")])


def test_app_accepts_repeated_allow_dir(tmp_path):
    import app
    args = app.parse_args(["--allow-dir", str(tmp_path), "--allow-dir", "/srv/data"])
    assert args.allow_dir == [str(tmp_path), "/srv/data"]


def test_preview_with_the_studio_policy_reads_nothing_outside(studio, tiny_model):
    root, _, secret, access = studio
    spec = JobSpec.from_dict({"model": str(tiny_model), "dataset": str(secret / "keys.jsonl")})
    with pytest.raises(AccessError, match="not available to the studio"):
        data.preview_rows(spec, n=1, data_dir=root, access=access)


def test_raw_values_are_checked_before_jobspec_can_tell_missing_from_existing(studio):
    """JobSpec.from_dict says "does not exist" only for a missing file; the studio checks the raw
    values first, so an existing and a missing file outside get the same answer."""
    root, _, secret, access = studio
    answers = []
    for path in (secret / "keys.jsonl", secret / "nothing-here.jsonl"):
        with pytest.raises(AccessError) as refused:
            access.check_values({"dataset": str(path), "lora_r": "8"})
        answers.append(_message(refused, str(path)))
    assert answers[0] == answers[1]
    checked = access.check_values({"dataset": "train.jsonl", "model": "builtin:smollm2-135m-instruct"})
    assert checked["dataset"] == os.path.realpath(root / "datasets" / "train.jsonl")
    assert JobSpec.from_dict(checked).dataset == checked["dataset"]
