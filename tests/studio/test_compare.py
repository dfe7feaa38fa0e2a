"""Compare runs: curves of several jobs in one frame (eval loss too), configs side by side with
the differing keys marked."""
import re

import gradio as gr

from jobs.io.events import EventWriter, summarize
from jobs.spec import JobSpec
from jobs.queue.store import JobRecord
from studio import compare
from studio.compare_tab import comparison
from studio.context import StudioContext
from tests.studio.fakes import ListRunner


def run(tmp_path, job_id, losses, evals=(), **spec):
    job_dir = tmp_path / job_id
    writer = EventWriter(job_dir)
    for step, loss in enumerate(losses, start=1):
        writer.emit("step", step=step, max_steps=len(losses), loss=loss)
    for step, loss in evals:
        writer.emit("eval", step=step, eval_loss=loss)
    return JobRecord(id=job_id, name="tiny · identity", state="done", created_at=1.7e9, job_dir=str(job_dir),
                     spec=JobSpec(output_dir=str(job_dir), **spec).to_dict())


def test_curves_of_several_runs_share_one_frame(tmp_path):
    a = run(tmp_path, "a", [3.0, 2.0, 1.5], evals=[(2, 2.2), (3, 1.9)])
    b = run(tmp_path, "b", [3.1, 2.9])
    frame = compare.curves_frame([(compare.run_label(a), summarize(a.job_dir)),
                                  (compare.run_label(b), summarize(b.job_dir))])
    series = {name: group[["step", "loss"]].values.tolist() for name, group in frame.groupby("series")}
    assert series == {"tiny · identity (a) · training loss": [[1, 3.0], [2, 2.0], [3, 1.5]],
                      "tiny · identity (a) · eval loss": [[2, 2.2], [3, 1.9]],
                      "tiny · identity (b) · training loss": [[1, 3.1], [2, 2.9]]}
    assert frame["step"].dtype.kind == "i" and compare.curves_frame([]).empty


def test_config_rows_mark_differing_keys():
    specs = [JobSpec(lora_r=8, target_modules=["q_proj", "v_proj"]).to_dict(), JobSpec(lora_r=16).to_dict(),
             {**JobSpec(lora_r=8).to_dict(), "output_dir": "/elsewhere"}]
    rows = {key: (values, differs) for key, values, differs in compare.config_rows(specs)}
    assert rows["lora_r"] == (["8", "16", "8"], True)
    assert rows["target_modules"] == (["q_proj, v_proj", "all-linear", "all-linear"], True)
    assert rows["learning_rate"] == (["0.0002"] * 3, False)
    assert "output_dir" not in rows  # one folder per job: always different, never informative
    assert [key for key, _, _ in compare.config_rows(specs)][:2] == ["name", "model"]  # JobSpec order


def test_config_table_html_escapes_and_filters(tmp_path):
    specs = [JobSpec(name="<b>x</b>").to_dict(), JobSpec(name="y").to_dict()]
    table = compare.config_table_html(["<i>A</i>", "B"], specs)
    assert "<b>x" not in table and "&lt;b&gt;x&lt;/b&gt;" in table and "&lt;i&gt;A" in table
    assert re.search(r'class="ft-diff" data-key="name"', table) and 'class="ft-same" data-key="seed"' in table
    assert f"1 of {len(JobSpec.field_names()) - 1} keys differ" in table
    only = compare.config_table_html(["A", "B"], specs, only_diff=True, lang="zh-CN")
    assert "ft-same" not in only and 'data-key="name"' in only and "个不同" in only


def test_comparison_for_picked_jobs(tmp_path):
    a, b = run(tmp_path, "a", [2.0, 1.0], lora_r=4), run(tmp_path, "b", [2.5], lora_r=32)
    ctx = StudioContext(data_dir=tmp_path, runner=ListRunner([a, b]))
    curves, legend, table = comparison(ctx, ["b", "a", "gone"], False, "en")
    assert list(dict.fromkeys(curves["series"])) == ["tiny · identity (b) · training loss",
                                                     "tiny · identity (a) · training loss"]
    assert 'data-key="lora_r"' in table and "ft-diff" in table
    # issue 40 item 10: the legend names every series in full, in the chart's colours, and wraps
    assert legend.count('class="ft-legend-item"') == 2 and "flex-wrap:wrap" in legend
    assert "tiny · identity (b) · training loss" in legend and "#e66100" in legend and "#0072b2" in legend
    empty_curves, no_legend, hint = comparison(ctx, [], False, "en")
    assert empty_curves.empty and no_legend == "" and "Pick jobs" in hint


def test_preference_runs_overlay_their_reward_margin_and_accuracy(tmp_path):
    from studio.compare_tab import reward_comparison
    dpo, sft = run(tmp_path, "dpo", [0.69, 0.6]), run(tmp_path, "sft", [3.0, 2.5])
    writer = EventWriter(dpo.job_dir)
    for step, margin in ((1, 0.1), (2, 0.5)):
        writer.emit("step", step=step, max_steps=2, loss=0.6, reward_margin=margin, reward_accuracy=step / 2)
    writer.emit("eval", step=2, eval_loss=0.6, eval_reward_margin=0.3, eval_reward_accuracy=0.75)
    ctx = StudioContext(data_dir=tmp_path, runner=ListRunner([dpo, sft]))
    update = reward_comparison(ctx, ["dpo", "sft"], "en")
    assert update["visible"] is True
    series = {name: group[["step", "value"]].values.tolist() for name, group in update["value"].groupby("series")}
    assert series == {"tiny · identity (dpo) · reward margin": [[1, 0.1], [2, 0.5]],
                      "tiny · identity (dpo) · reward accuracy": [[1, 0.5], [2, 1.0]],
                      "tiny · identity (dpo) · eval reward margin": [[2, 0.3]],
                      "tiny · identity (dpo) · eval reward accuracy": [[2, 0.75]]}
    assert reward_comparison(ctx, ["sft"], "en")["visible"] is False


def _evaluated(job_dir, name, table, cancelled=False, written_at=None):
    """An evaluation folder as `python -m jobs.evaluate` leaves it (only its results.json matters here)."""
    import json
    import os
    from jobs.io.layout import JobLayout
    layout = JobLayout(job_dir).evaluation(name)
    layout.root.mkdir(parents=True)
    layout.results.write_text(json.dumps({"table": table, "cancelled": cancelled, "benchmarks": None}))
    if written_at is not None:
        os.utime(layout.results, (written_at, written_at))


def _entry(metric, base, tuned, rows=4):
    return {"metric": metric, "rows": rows, "base": base, "tuned": tuned, "difference": tuned - base,
            "ci_low": tuned - base - 1, "ci_high": tuned - base + 1}


def test_the_latest_evaluations_of_the_picked_jobs_metric_by_metric(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    _evaluated(a, "older", [_entry("bleu", 1.0, 2.0)], written_at=1_000)
    _evaluated(a, "newer", [_entry("chrf", 30.0, 40.0), _entry("bleu", 10.0, 20.0)], written_at=2_000)
    _evaluated(b, "stopped", [_entry("bleu", 10.0, 12.5, rows=2)], cancelled=True)
    c.mkdir()
    frame, missing = compare.evaluations_frame([("A", str(a)), ("B", str(b)), ("C", str(c))])
    assert list(frame.columns) == ["metric", "job", "evaluation", "rows", "base", "tuned", "difference", "95% CI"]
    assert frame.values.tolist() == [["chrf", "A", "newer", 4, 30.0, 40.0, 10.0, "[+9.000, +11.000]"],
                                     ["bleu", "A", "newer", 4, 10.0, 20.0, 10.0, "[+9.000, +11.000]"],
                                     ["bleu", "B", "stopped (cancelled)", 2, 10.0, 12.5, 2.5, "[+1.500, +3.500]"]]
    assert missing == ["C"] and compare.evaluations_note(missing) == (
        "No evaluation yet: C. The Evaluate tab scores a finished job.")
    assert "尚无评测：C" in compare.evaluations_note(missing, "zh-CN")


def test_compare_hides_the_evaluation_table_when_no_picked_job_has_one(tmp_path):
    from studio.compare_tab import evaluation_comparison
    evaluated, plain = run(tmp_path, "a", [1.0]), run(tmp_path, "b", [1.0])
    _evaluated(evaluated.job_dir, "e1", [_entry("rouge_l", 5.0, 9.0)])
    ctx = StudioContext(data_dir=tmp_path, runner=ListRunner([evaluated, plain]))
    table, note = evaluation_comparison(ctx, ["a", "b"], "en")
    assert table["visible"] and table["value"]["job"].tolist() == ["tiny · identity (a)"]
    assert "No evaluation yet: tiny · identity (b)" in note
    table, note = evaluation_comparison(ctx, ["b"], "en")
    assert not table["visible"] and "No evaluation yet" in note
    assert evaluation_comparison(ctx, [], "en")[1] == ""


def skipped(out) -> bool:
    """gr.skip(): an update that leaves its component as it is."""
    return isinstance(out, dict) and out == gr.skip()


def test_a_repeated_change_with_the_same_view_redraws_nothing(tmp_path):
    """Gradio's multiselect fires `change` again with the picks it already holds whenever anything
    on the page updates (twice a second while the tab was open): the view is drawn once per key."""
    from studio.compare_tab import on_view_change, view_key
    a, b = run(tmp_path, "a", [2.0, 1.0], lora_r=4), run(tmp_path, "b", [2.5], lora_r=32)
    ctx = StudioContext(data_dir=tmp_path, runner=ListRunner([a, b]))
    first = on_view_change(ctx, ["a", "b"], False, "en", None)
    assert len(first) == 7 and first[-1] == view_key(["a", "b"], False, "en")
    assert list(dict.fromkeys(first[0]["series"])) == ["tiny · identity (a) · training loss",
                                                       "tiny · identity (b) · training loss"]
    repeat = on_view_change(ctx, ["a", "b"], False, "en", first[-1])
    assert len(repeat) == 7 and all(skipped(out) for out in repeat), repeat
    # a real change of any part of the key draws again: the picks, their order, the box, the language
    for args in ((["a"], False, "en"), (["b", "a"], False, "en"), (["a", "b"], True, "en"),
                 (["a", "b"], False, "zh-CN")):
        again = on_view_change(ctx, *args, first[-1])
        assert again[-1] == view_key(*args) and not any(skipped(out) for out in again)


def test_refresh_rewrites_the_picks_only_when_a_picked_job_is_gone(tmp_path):
    """Writing the multiselect's value, even the same list, makes it fire `change`: the refresh
    (tab switch, the button) sends the choices alone while every picked job still exists."""
    from studio.compare_tab import CompareTab, view_key
    a, b = run(tmp_path, "a", [2.0, 1.0]), run(tmp_path, "b", [2.5])
    ctx = StudioContext(data_dir=tmp_path, runner=ListRunner([a, b]))
    tab = CompareTab(select=None, only_diff=None, outputs=[], sync_colors=lambda event: event)
    select, *view_parts, key = tab.refresh(ctx, ["b", "a"], False, "en")
    assert "value" not in select and [value for _, value in select["choices"]] == ["a", "b"]
    assert len(view_parts) == 6 and key == view_key(["b", "a"], False, "en")
    assert "value" not in tab.refresh(ctx, [], False, "en")[0]
    select, *_, key = tab.refresh(ctx, ["gone", "a"], True, "en")
    assert select["value"] == ["a"] and key == view_key(["a"], True, "en")
