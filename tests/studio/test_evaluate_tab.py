"""The Evaluate tab: the form becomes an EvalConfig the CLI accepts, a refusal shows as one translated
line before anything is queued, an evaluation waiting in the queue says on what and Cancel takes it
out, and an evaluation's files become the base-vs-tuned table and the rows sorted by the change."""
import html
import json
from dataclasses import dataclass

from jobs.evaluate.config import EvalConfig
from jobs.io import gpus
from jobs.io.layout import JobLayout
from jobs.queue.runner import Runner
from jobs.queue.store import JobState
from jobs.spec import JobSpec
from studio.context import StudioContext
from studio.evaluate_tab import (PageEvaluations, downloads, eval_config, evaluate, evaluate_choices_update,
                                 results_frame, rows_frame)
from tests.jobs.fakes import starts, write_fake_trainer
from tests.jobs.queue.queue_jobs import gpu
from tests.studio.fakes import ListRunner
from tests.waiting import wait_for


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


def test_a_refused_evaluation_names_the_field_before_anything_is_queued(tmp_path):
    job = _finished_job(tmp_path / "job")
    rows = tmp_path / "rows.txt"
    rows.write_text("x")
    ctx = StudioContext(data_dir=tmp_path / "data", runner=ListRunner([Record("j1", str(job))]))
    (status, table, per_row, files), = evaluate(ctx, "j1", str(rows), 16, 5, False, lambda *_: None, "zh-CN",
                                                PageEvaluations())
    assert "eval_file" in status and "rows.txt" in status and files == [] and table.empty and per_row.empty
    (status, *_), = evaluate(ctx, None, None, 16, 5, False, lambda *_: None, "en", PageEvaluations())
    assert "Pick a finished job first." in status and not (job / "evaluations").exists()


def test_a_waiting_evaluation_says_on_what_and_cancel_takes_it_out(tmp_path, monkeypatch):
    """One GPU (made up), held by a running job: the page shows why its evaluation waits; its Cancel
    cancels it in the queue, and it never starts."""
    monkeypatch.setattr(gpus, "read_gpus", lambda: [gpu(0)])
    runner = Runner(tmp_path / "data", python=str(write_fake_trainer(tmp_path)))
    job = _finished_job(tmp_path / "data" / "jobs" / "trained")
    runner.store.add("trained", "tiny · chat", job, {"model": "x"}, state=JobState.DONE)
    busy = runner.submit(JobSpec(name="hang"))
    ctx, pages, progress = StudioContext(data_dir=tmp_path / "data", runner=runner), PageEvaluations(), []
    outputs = evaluate(ctx, "trained", None, 8, 0, False, lambda *shown: progress.append(shown), "en", pages, "page")
    status, *_ = next(outputs)
    status = html.unescape(status)
    assert "Waiting in the job queue: waiting for a free GPU: GPU 0 is in use by job 'hang'" in status
    assert progress[-1][0] == 0.0 and "GPU 0 is in use by job 'hang'" in progress[-1][1]
    assert pages.cancel(ctx, "page") and not pages.cancel(ctx, "another page")
    (status, table, per_row, files), = list(outputs)
    assert "Cancelled before it started" in status and table.empty and files == []
    (evaluation,) = runner.list_evaluations("trained")
    assert evaluation.state == "cancelled" and starts(evaluation.job_dir) == []
    runner.cancel(busy.id)
    wait_for(lambda: runner.get(busy.id).finished, timeout=60, interval=0.1)


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


def test_the_chosen_eval_file_is_named_beside_the_upload_button(tmp_path):
    from studio.evaluate_tab import chosen_file_html

    assert chosen_file_html(None, "en") == ""
    assert "Eval rows: eval rows.jsonl" in html.unescape(chosen_file_html(str(tmp_path / "eval rows.jsonl"), "en"))
    assert "评测数据：eval.csv" in chosen_file_html("/tmp/gradio/abc/eval.csv", "zh-CN")
