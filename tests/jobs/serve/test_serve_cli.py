"""`python -m jobs.serve` refuses what it cannot serve with one line and an exit code, before serving:
a folder that is not a job, two jobs of one folder name, a port already taken, a negative keep time."""
import shutil
import socket

from jobs.serve.cli import main


def test_a_folder_that_is_not_a_job_exits_2_with_one_line(tmp_path, capsys):
    assert main([str(tmp_path), "--port", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(tmp_path) in err and "Traceback" not in err


def test_two_jobs_of_one_folder_name_exit_2(tiny_job, tmp_path, capsys):
    twin = tmp_path / tiny_job.name
    shutil.copytree(tiny_job / "adapter", twin / "adapter")
    assert main([str(tiny_job), str(twin), "--port", "0"]) == 2
    assert "different folder names" in capsys.readouterr().err


def test_a_taken_port_exits_1_naming_it(tmp_path, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main([str(tmp_path), "--port", str(port)]) == 1
    assert f"127.0.0.1:{port}" in capsys.readouterr().err


def test_a_negative_keep_time_exits_2_naming_the_option(tmp_path, capsys):
    assert main([str(tmp_path), "--port", "0", "--keep-batches-s", "-1"]) == 2
    assert "--keep-batches-s" in capsys.readouterr().err
