"""HTML rendering: data preview marking and escaping, progress bar, log box."""
import re

from studio import render


def test_preview_marks_prompt_and_answer_in_order_and_escapes():
    rows = [{"segments": [("<|user|>\n<script>alert(1)</script>", False), ("A & B", True),
                          ("<|user|> again", False), ("second <b>answer</b>", True)], "tokens": 12}]
    out = render.preview_html(rows)
    assert "<script>" not in out and "&lt;script&gt;alert(1)&lt;/script&gt;" in out
    assert "<b>answer" not in out and "second &lt;b&gt;answer&lt;/b&gt;" in out
    spans = re.findall(r'class="(ft-prompt|ft-answer)"[^>]*>(.*?)</span>', out, re.S)
    assert [kind for kind, _ in spans] == ["ft-prompt", "ft-answer", "ft-prompt", "ft-answer"]
    assert spans[1][1] == "A &amp; B"
    assert "12 tokens" in out


def test_prompt_answer_form_equals_two_segments():
    flat = {"prompt": "Q: hi\n", "answer": "hello", "tokens": 5}
    assert render.row_segments(flat) == [("Q: hi\n", False), ("hello", True)]
    assert render.preview_html([flat]) == render.preview_html(
        [{"segments": [("Q: hi\n", False), ("hello", True)], "tokens": 5}])


def test_empty_preview_says_so():
    assert "no rows" in render.preview_html([])


def test_progress_bar_width_state_and_eta():
    running = render.progress_html("running", 15, 60, 0.25, 125, 40)
    assert "width:25.0%" in running and "ETA 2:05" in running and 'data-step="15"' in running
    assert "step 15/60" in running
    done = render.progress_html("done", 60, 60, 0.98, None, 300)
    assert "width:100.0%" in done and "ETA" not in done
    clamped = render.progress_html("running", 70, 60, 1.7, 0, 1)
    assert "width:100.0%" in clamped
    assert 'data-state="&lt;x&gt;"' in render.progress_html("<x>", 0, None, None, None, None)
    chinese = render.progress_html("running", 15, 60, 0.25, 125, 40, lang="zh-CN")
    assert "运行中 · 第 15/60 步 · 25% · 预计剩余 2:05" in chinese and 'data-state="running"' in chinese


def test_format_duration():
    assert render.format_duration(None) == "–"
    assert render.format_duration(59.6) == "1:00"
    assert render.format_duration(3725) == "1:02:05"
    assert render.format_duration(float("nan")) == "–"


def test_log_and_notice_escape():
    assert "&lt;img" in render.log_html("<img src=x onerror=alert(1)>")
    assert "<img" not in render.log_html("<img src=x onerror=alert(1)>")
    assert "no output yet" in render.log_html("")
    assert "暂无输出" in render.log_html("", lang="zh-CN")
    assert "&lt;b&gt;" in render.notice_html("<b>", "error")
