"""The job folder's layout: a new folder is claimed by mkdir, so a clash between two studios draws again."""
import itertools
import stat

import pytest

from jobs.io import layout as layout_mod
from jobs.io.layout import new_job_folder


def test_a_clashing_id_draws_again_and_never_reuses_a_folder(tmp_path, monkeypatch):
    tails = itertools.chain(["abcdef", "abcdef", "abcdef"], itertools.repeat("123456"))
    monkeypatch.setattr(layout_mod.secrets, "token_hex", lambda n: next(tails))
    monkeypatch.setattr(layout_mod.time, "strftime", lambda fmt: "20261201-120000")
    first_id, first = new_job_folder(tmp_path)
    second_id, second = new_job_folder(tmp_path)
    assert first_id == "20261201-120000-abcdef" and second_id == "20261201-120000-123456"
    assert first.root.is_dir() and second.root.is_dir()
    assert stat.S_IMODE(first.root.stat().st_mode) == 0o700


def test_it_gives_up_after_its_tries_with_the_os_error(tmp_path, monkeypatch):
    monkeypatch.setattr(layout_mod.secrets, "token_hex", lambda n: "000000")
    new_job_folder(tmp_path)
    with pytest.raises(FileExistsError):
        new_job_folder(tmp_path, tries=3)
