"""scripts/setup.sh (what start.sh and test.sh run first) says what its minutes go to: a newcomer's
first run was silent for the two minutes of pip (issue 40)."""
import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_setup_says_what_it_installs_before_the_long_pip_run(tmp_path):
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    for name in ("requirements.txt", "requirements-builtin.txt"):
        (tmp_path / name).write_text("")
    fake = tmp_path / "python3.11"   # stands in for the interpreter: `-m venv` makes a .venv whose python logs
    fake.write_text("#!/bin/sh\nif [ \"$1\" = -m ] && [ \"$2\" = venv ]; then mkdir -p \"$3/bin\"; "
                    "printf '#!/bin/sh\\necho \"pip $*\" >> %s\\n' > \"$3/bin/python\"; chmod +x \"$3/bin/python\"; "
                    "else echo 'Python 3.11.7'; fi\n" % (tmp_path / "calls.log"))
    fake.chmod(0o755)
    env = {**os.environ, "PYTHON": str(fake)}
    first = subprocess.run(["bash", "scripts/setup.sh"], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=60)
    assert first.returncode == 0, first.stderr
    lines = first.stdout.splitlines()
    assert lines[0].startswith("[setup ") and "creating .venv with Python 3.11.7" in lines[0]
    assert "first run: about 2.8 GB" in lines[1] and lines[-1].endswith("requirements ready")
    assert "install -q -r requirements.txt" in (tmp_path / "calls.log").read_text()
    again = subprocess.run(["bash", "scripts/setup.sh"], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=60)
    assert "creating" not in again.stdout and "first run" not in again.stdout and "requirements ready" in again.stdout
