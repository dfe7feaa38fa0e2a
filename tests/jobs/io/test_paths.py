"""The data dir: created private, and every library cache and temp location pointed inside it."""
import pytest

from jobs.io import paths
from jobs.io.storage import StorageError


def test_caches_and_temp_files_go_under_the_data_dir(tmp_path):
    home = tmp_path / "home"
    (home / ".cache" / "huggingface").mkdir(parents=True)
    (home / ".cache" / "huggingface" / "token").write_text("hf_x")
    env = {"HOME": str(home), "TMPDIR": "/tmp", "XDG_CACHE_HOME": str(home / ".cache")}
    data = paths.data_dir(tmp_path / "data")
    paths.cache_env(data, env)
    for name, folder in paths.CACHE_VARS.items():
        assert env[name] == str(data / "cache" / folder), name
        assert (data / "cache" / folder).is_dir()
    assert env["HF_TOKEN_PATH"] == str(home / ".cache" / "huggingface" / "token")  # read, never written
    assert (data.stat().st_mode & 0o777, (data / "cache" / "tmp").stat().st_mode & 0o777) == (0o700, 0o700)


def test_a_hugging_face_cache_the_user_chose_is_kept(tmp_path):
    env = {"HF_HOME": "/shared/hf", "HOME": str(tmp_path)}
    paths.cache_env(tmp_path / "data", env)
    assert env["HF_HOME"] == "/shared/hf" and "HF_TOKEN_PATH" not in env
    assert env["TMPDIR"] == str(tmp_path / "data" / "cache" / "tmp")


def test_an_unwritable_data_dir_says_so(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(NotADirectoryError):
        paths.data_dir(blocker / "data")
    with pytest.raises(StorageError, match=f"cannot write {blocker}"):
        paths.check_writable(blocker)
