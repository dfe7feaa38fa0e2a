"""bench/page_check.py's smoke mode on CPU: the studio started as `python app.py`, driven through
the endpoints its page calls (start, follow, chat base and tuned, export adapter and GGUF, a second
job after chatting), every stage passing and recorded as a JSON line."""
import json

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow


def test_the_page_check_passes_in_smoke_mode(tmp_path, monkeypatch, builtin_seed):
    monkeypatch.syspath_prepend(str(ROOT))
    from bench import page_check
    out = tmp_path / "page_check.jsonl"
    # a data dir after the built-in model's first job (tests/builtin_home.py): the check is of the
    # page, not of the one-time conversion and base answers (tests/jobs/models/test_builtin.py)
    data_dir = builtin_seed.home(tmp_path / "data", answers=True)
    code = page_check.main(["--smoke", "--out", str(out), "--job-timeout", "1500", "--data-dir", str(data_dir)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    stages = {row["stage"]: row for row in rows}
    failed = {name: row for name, row in stages.items() if not row["ok"]}
    assert code == 0 and not failed, json.dumps(failed, indent=1)[:3000]
    assert {"start_job", "follow_job", "chat_base_and_tuned", "export_adapter", "export_gguf",
            "second_job_after_chat", "all"} <= set(stages)
    assert stages["follow_job"]["loss_points"] > 0 and stages["chat_base_and_tuned"]["tuned"]
    assert any(name.endswith(".gguf") for name in stages["export_gguf"]["files"])
    assert all(row["seconds"] >= 0 for row in rows)
