"""Disk errors are recognised (also torch's and safetensors' own wording), reported with path and
free space, and a folder is written whole or not at all."""
import errno
import os
import subprocess
import sys

import pytest

from jobs.io.storage import StorageError, describe, is_disk_error, open_private, staged_dir, write_private_text
from tests.conftest import ROOT

TORCH_FULL_DISK = ("[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing file "
                   "data/0: file write failed")
SAFETENSORS_FULL_DISK = ('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: '
                         '"No space left on device" })')


def test_disk_errors_are_recognised_and_others_are_not():
    assert is_disk_error(OSError(errno.ENOSPC, "No space left on device"))
    assert is_disk_error(PermissionError(errno.EACCES, "Permission denied"))
    assert is_disk_error(RuntimeError(TORCH_FULL_DISK))
    assert is_disk_error(RuntimeError(SAFETENSORS_FULL_DISK))
    assert not is_disk_error(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not is_disk_error(FileNotFoundError(errno.ENOENT, "No such file or directory"))
    assert not is_disk_error(ValueError("No space left on device"))


def test_the_message_names_the_path_the_free_space_and_the_fix(tmp_path):
    text = describe(tmp_path / "x" / "optim.pt", OSError(errno.ENOSPC, "No space left on device"))
    assert text.startswith(f"cannot write {tmp_path / 'x' / 'optim.pt'}: No space left on device (")
    assert "free on that disk); free some space" in text and "\n" not in text
    error = StorageError(tmp_path, RuntimeError(TORCH_FULL_DISK))
    assert error.errno == errno.EIO and str(error).startswith(f"cannot write {tmp_path}: the write failed ([enf")
    assert StorageError(tmp_path, RuntimeError(SAFETENSORS_FULL_DISK)).errno == errno.ENOSPC


def test_a_staged_folder_replaces_the_old_one_only_when_complete(tmp_path):
    final, staging = tmp_path / "adapter", tmp_path / ".adapter.partial"
    with staged_dir(final, staging) as folder:
        (folder / "weights").write_text("one")
    assert (final / "weights").read_text() == "one" and not staging.exists()
    assert final.stat().st_mode & 0o777 == 0o700
    with pytest.raises(StorageError, match="No space left on device"):
        with staged_dir(final, staging) as folder:
            (folder / "weights").write_text("tw")
            raise OSError(errno.ENOSPC, "No space left on device", str(folder / "weights"))
    assert (final / "weights").read_text() == "one" and not staging.exists()
    with pytest.raises(KeyError):  # not a disk error: passes through unchanged, still cleaned up
        with staged_dir(final, staging):
            raise KeyError("bug")
    assert not staging.exists() and [p.name for p in tmp_path.iterdir()] == ["adapter"]


def test_private_files_are_0600_whatever_the_umask(tmp_path):
    write_private_text(tmp_path / "a.yaml", "x: 1\n")
    with open_private(tmp_path / "b.log", "ab") as fh:
        fh.write(b"line\n")
    assert {(p.stat().st_mode & 0o777) for p in tmp_path.iterdir()} == {0o600}


def test_a_rewrite_replaces_the_file_whole_so_a_reader_never_sees_it_truncated(tmp_path):
    """A job's ranks read config.yaml while rank 0 rewrites it: a reader that opened the file
    before the rewrite still reads the old text (a truncating write would have left it "")."""
    path = write_private_text(tmp_path / "config.yaml", "output_dir: /jobs/a\n")
    with open(path, encoding="utf-8") as reader:
        write_private_text(path, "output_dir: /jobs/a\ngpus: '0'\n")
        assert reader.read() == "output_dir: /jobs/a\n"
    assert path.read_text() == "output_dir: /jobs/a\ngpus: '0'\n" and (path.stat().st_mode & 0o777) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]   # no staging file left


def test_a_failed_rewrite_keeps_the_old_file_and_leaves_no_staging_file(tmp_path, monkeypatch):
    path = write_private_text(tmp_path / "config.yaml", "old\n")
    monkeypatch.setattr(os, "replace", lambda *_: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left on device")))
    with pytest.raises(OSError, match="No space"):
        write_private_text(path, "new\n")
    assert path.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["config.yaml"]


def test_a_real_failed_torch_save_is_a_storage_error(tmp_path):
    """torch's zip writer hitting a file size limit (EFBIG, like ENOSPC an error from write(2))
    raises its own RuntimeError; the staged folder turns it into a StorageError and cleans up."""
    script = """
import resource, signal, sys, torch
from pathlib import Path
from jobs.io.storage import StorageError, staged_dir
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
root = Path(sys.argv[1])
try:
    with staged_dir(root / "step-2", root / ".step-2.partial") as tmp:
        torch.save(torch.zeros(1_000_000), tmp / "optim.pt")
except StorageError as exc:
    print("StorageError:", exc)
print(sorted(p.name for p in root.iterdir()))
"""
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"StorageError: cannot write {tmp_path}/.step-2.partial" in proc.stdout
    assert "free on that disk" in proc.stdout and proc.stdout.strip().endswith("[]")
