"""The Evaluate tab: the form becomes an EvalConfig the CLI accepts, the CLI's refusal shows as one
translated line, an evaluation's files become the base-vs-tuned table and the rows sorted by the
change, and Cancel stops the process group it started."""
import json
import sys
import time
from dataclasses import dataclass

from jobs.evaluate.config import EvalConfig
from jobs.io.layout import JobLayout
from studio.context import StudioContext
from studio.evaluate_tab import (EvalRuns, downloads, eval_config, evaluate_choices_update, results_frame,
                                 rows_frame, start_evaluation)
from tests.studio.fakes import ListRunner


@dataclass
class Record:
    id: str
    job_dir: str
    name: str = "tiny · chat"
    state: str = "done"


def _finished_job(folder):
    (folder / "adapter").mkdir(parents=True)
    (folder / "config.yaml").write_text("model: x\ndataset: builtin:identity\n")
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        (folder / "adapter" / name).write_text("{}")
    return folder


def test_the_form_is_a_config_the_cli_accepts(tmp_path):
    job = _finished_job(tmp_path / "job")
    config = EvalConfig.from_dict(eval_config(str(job), None, 32, 10, benchmark=True))
    assert (config.max_new_tokens, config.limit, config.tasks) == (32, 10, ["fusetune_tiny_qa"])
    assert config.name.startswith("page-") and config.eval_file == ""


def test_an_uploads_path_is_written_as_plain_text(tmp_path):
    import yaml

    class UploadPath(str):   # Gradio hands an upload's path as a str subclass
        pass

    job = _finished_job(tmp_path / "job")
    written = yaml.safe_load(yaml.safe_dump(eval_config(str(job), UploadPath("/up/eval.jsonl"), 8, 0, False)))
    assert written["eval_file"] == "/up/eval.jsonl"


def test_a_refused_evaluation_shows_the_clis_line(tmp_path):
    job = _finished_job(tmp_path / "job")
    rows = tmp_path / "rows.txt"
    rows.write_text("x")
    ctx = StudioContext(data_dir=tmp_path / "data", runner=ListRunner([Record("j1", str(job))]))
    status, table, per_row, files = start_evaluation(ctx, "j1", str(rows), 16, 5, False, lambda *_: None, "zh-CN",
                                                     EvalRuns())
    assert "eval_file" in status and "rows.txt" in status and files == [] and table.empty and per_row.empty
    status, *_ = start_evaluation(ctx, None, None, 16, 5, False, lambda *_: None, "en", EvalRuns())
    assert "Pick a finished job first." in status


def test_results_and_rows_from_an_evaluations_files(tmp_path):
    layout = JobLayout(tmp_path).evaluation("e1")
    layout.root.mkdir(parents=True)
    entry = {"metric": "bleu", "rows": 2, "base": 10.0, "tuned": 20.0, "difference": 10.0, "ci_low": 5.0, "ci_high": 15.0}
    layout.results.write_text(json.dumps({"table": [entry], "benchmarks": {
        "fusetune_tiny_qa": {"acc": {"base": 0.5, "tuned": 0.75, "difference": 0.25}}}}))
    records = [{"row": n, "prompt": [{"role": "user", "content": f"q{n}"}], "reference": "r", "base": "b", "tuned": "t",
                "scores": {}, "change": {"bleu": change}} for n, change in ((1, -5.0), (2, 30.0))]
    layout.rows.write_text("".join(json.dumps(r) + "\n" for r in records))
    table = results_frame(layout)
    assert table.values.tolist() == [["bleu", 2, 10.0, 20.0, 10.0, "[+5.000, +15.000]"],
                                     ["fusetune_tiny_qa/acc", "", 0.5, 0.75, 0.25, ""]]
    rows = rows_frame(layout)
    assert rows["row"].tolist() == [2, 1] and rows.columns[-1] == "change bleu"
    assert rows["prompt"].tolist()[0] == "user: q2"
    assert downloads(layout) == [str(layout.results), str(layout.rows)]


def test_only_finished_jobs_are_offered(tmp_path):
    runner = ListRunner([Record("new", str(_finished_job(tmp_path / "a"))),
                         Record("running", str(tmp_path / "b"), state="running")])
    update = evaluate_choices_update(StudioContext(data_dir=tmp_path / "data", runner=runner), None)
    assert [value for _, value in update["choices"]] == ["new"] and update["value"] == "new"


def test_cancel_stops_the_process_group(tmp_path):
    runs = EvalRuns()
    proc = runs.start("page", [sys.executable, "-c", "import time; time.sleep(60)"])
    started = time.monotonic()
    assert runs.cancel("page") and proc.wait(timeout=10) != 0
    assert time.monotonic() - started < 10 and not runs.cancel("other")
