"""app.py's start-up: the password from FUSETUNE_AUTH first, and a data dir it cannot use is one
line naming the path and the fix, before anything heavy loads."""
import subprocess
import sys
import time

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


def test_the_cluster_the_jobs_tab_shows_comes_from_the_flag_or_the_environment(monkeypatch):
    monkeypatch.setenv("FUSETUNE_CLUSTER", "http://head-node:8265")
    assert app.check_cluster(app.parse_args([]).cluster) == "http://head-node:8265"
    assert app.parse_args(["--cluster", "http://10.0.0.5:8265"]).cluster == "http://10.0.0.5:8265"
    with pytest.raises(SystemExit, match="--cluster 'head-node:8265' is not a Ray dashboard address"):
        app.check_cluster("head-node:8265")


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


def test_the_password_leaves_the_environment_before_any_child_starts(tmp_path, monkeypatch):
    """main() takes FUSETUNE_AUTH out of os.environ before the runner exists, so no trainer,
    export or preflight child inherits it; the runner's job environment drops it as well."""
    import os

    from jobs.queue.runner import Runner
    monkeypatch.setenv("FUSETUNE_AUTH", "me:secret")
    stop = SystemExit("stopped after reading the password")
    monkeypatch.setattr(app, "refuse_busy_port", lambda host, port: (_ for _ in ()).throw(stop))
    old_umask = os.umask(0o022)
    try:
        with pytest.raises(SystemExit, match="stopped after"):
            app.main(["--data-dir", str(tmp_path)])
    finally:
        os.umask(old_umask)
    assert "FUSETUNE_AUTH" not in os.environ
    monkeypatch.setenv("FUSETUNE_AUTH", "me:secret")  # a runner used without app.py
    record = type("Record", (), {"id": "j1"})()
    assert "FUSETUNE_AUTH" not in Runner(tmp_path / "data")._env(record)
    assert [m.cls.__name__ for m in app.guards(("me", "secret"))] == ["LoginGuard"] and app.guards(None) == []


def test_a_data_dir_readable_by_others_is_made_private(tmp_path, capsys):
    import os
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    os.chmod(data, 0o755)
    app.open_data_dir(str(data))
    assert (data.stat().st_mode & 0o777) == 0o700
    told = capsys.readouterr().err
    assert f"the data dir {data} was readable by other users (mode 0755); it is now private (0700)" in told
    app.open_data_dir(str(data))
    assert "readable" not in capsys.readouterr().err


def test_the_running_studio_slows_failed_logins_and_sets_lax_cookies(tmp_path):
    """The real app.py with a password: wrong guesses from one client wait longer after the first
    few, even when each names another client in X-Forwarded-For (uvicorn believes it from no one
    without --trusted-proxy), the right password still logs in, and its cookies are SameSite=Lax."""
    import os
    import socket
    import time

    import httpx
    from studio.login_guard import FREE_FAILURES
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "FUSETUNE_AUTH": "me:secret"}
    proc = subprocess.Popen([sys.executable, "app.py", "--port", str(port), "--data-dir", str(tmp_path)], cwd=ROOT,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/login"
    try:
        deadline = time.time() + 240
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/", timeout=5)
                break
            except httpx.HTTPError:
                assert time.time() < deadline and proc.poll() is None
                time.sleep(1)
        took = []
        for attempt in range(FREE_FAILURES + 2):
            began = time.time()
            assert httpx.post(url, data={"username": "me", "password": "wrong"}, timeout=60,
                              headers={"x-forwarded-for": f"203.0.113.{attempt}"}).status_code == 400
            took.append(time.time() - began)
        # lower bounds only: on a loaded machine any request can be slow, never faster than its delay
        assert took[FREE_FAILURES] >= 1.0 and took[FREE_FAILURES + 1] >= 2.0
        assert took[FREE_FAILURES + 1] > min(took[:FREE_FAILURES]) + 1.0
        ok = httpx.post(url, data={"username": "me", "password": "secret"}, timeout=60)
        assert ok.status_code == 200
        cookies = ok.headers.get_list("set-cookie")
        assert cookies and all("samesite=lax" in c.lower() for c in cookies)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_the_built_in_models_warm_up_on_a_full_disk_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    import errno

    import jobs.models.load
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "models" / "x.safetensors"))
    monkeypatch.setattr(jobs.models.load, "resolve_model", full)
    app.warm_builtin_model(tmp_path)  # no exception: the warm-up thread would have printed a traceback
    (line,) = capsys.readouterr().err.strip().splitlines()
    target = tmp_path / "models" / "x.safetensors"
    assert line.startswith(f"[studio] built-in model not prepared: cannot write {target}: No space left on device (")
    assert "free some space on that disk" in line


def test_the_launch_check_waits_for_a_page_slower_than_gradios_three_seconds(monkeypatch):
    """On a loaded 2-core machine the page took over 3 s to render and Gradio's one-shot check failed
    the start ("When localhost is not accessible ..."); the studio's check waits for it."""
    import http.server
    import threading
    from gradio import networking

    class Slow(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):
            time.sleep(3.5)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(networking, "url_ok", networking.url_ok)   # put back after the test
    try:
        app.patient_launch_check(limit_s=30)
        assert networking.url_ok(f"http://127.0.0.1:{server.server_address[1]}/") is True
    finally:
        server.shutdown()
