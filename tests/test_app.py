"""app.py's start-up: the password from FUSETUNE_AUTH first, and a data dir it cannot use is one
line naming the path and the fix, before anything heavy loads."""
import subprocess
import sys

import pytest

import app
from tests.conftest import ROOT


def test_the_password_comes_from_the_environment_first(capsys):
    assert app.choose_auth(None, "me:env") == "me:env"
    assert capsys.readouterr().err == ""
    assert app.choose_auth("me:cli", None) == "me:cli"
    assert "visible" not in (err := capsys.readouterr().err) and "`ps`" in err and "FUSETUNE_AUTH" in err
    assert app.choose_auth("me:cli", "me:env") == "me:env"
    assert "--auth is ignored" in capsys.readouterr().err
    assert app.parse_auth("me:env") == ("me", "env")
    with pytest.raises(SystemExit, match="USER:PASS"):
        app.parse_auth("no-colon")


def test_an_unusable_data_dir_stops_the_studio_with_one_line(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    proc = subprocess.run([sys.executable, "app.py", "--data-dir", str(blocker / "data")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"fusetune: cannot use the data dir: {blocker / 'data'}: Not a directory")
    assert "--data-dir" in line


def test_a_damaged_job_database_stops_the_studio_with_one_line(tmp_path):
    (tmp_path / "jobs.sqlite").write_bytes(b"this is not a database" * 100)
    proc = subprocess.run([sys.executable, "app.py", "--data-dir", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"fusetune: cannot open the job database {tmp_path / 'jobs.sqlite'}: file is not a database")


def test_a_busy_port_stops_the_studio_with_one_line_naming_it_and_the_option(tmp_path):
    import socket
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run([sys.executable, "app.py", "--port", str(port), "--data-dir", str(tmp_path)],
                              cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line == (f"fusetune: port {port} on 127.0.0.1 is already in use (another studio or program is serving "
                    f"there): stop it, or pass --port with a free port (e.g. --port {port + 1})")
