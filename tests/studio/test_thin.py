"""Charts get at most MAX_POINTS points a series (studio/thin.py): a long job's page stayed busy
redrawing thousands of points at every poll. The shape survives: first and last step, spikes, dips."""
import math

from jobs.io.events import EventWriter, summarize
from studio import jobs_view
from studio.thin import MAX_POINTS, thin


def curve(n, series="a"):
    return [{"step": s, "loss": 3 + math.sin(s / 50), "series": series} for s in range(1, n + 1)]


def test_a_long_series_keeps_its_ends_spike_and_dip_within_the_limit():
    rows = curve(5003)
    rows[2776]["loss"], rows[4000]["loss"] = 40.0, -7.0
    kept = thin(rows, "step", "loss", "series")
    steps = [r["step"] for r in kept]
    assert len(kept) <= MAX_POINTS and steps == sorted(steps) and len(set(steps)) == len(steps)
    assert steps[0] == 1 and steps[-1] == 5003 and {2777, 4001} <= set(steps)


def test_short_series_pass_untouched_and_each_series_is_cut_on_its_own():
    short = curve(MAX_POINTS)
    assert thin(short, "step", "loss", "series") is short
    mixed = curve(3000, "train") + curve(40, "eval")[::10]
    kept = thin(mixed, "step", "loss", "series")
    train = [r for r in kept if r["series"] == "train"]
    assert len(train) <= MAX_POINTS and [r for r in kept if r["series"] == "eval"] == curve(40, "eval")[::10]
    assert kept[0]["series"] == "train" and kept[-1]["series"] == "eval"   # the series keep their order


def test_the_jobs_tab_loss_frame_of_a_long_job_is_thinned(tmp_path):
    writer = EventWriter(tmp_path)
    for step in range(1, 2001):
        writer.emit("step", step=step, max_steps=2000, loss=1 + 1 / step, elapsed_s=step / 10, rss_gb=1.0)
    frame = jobs_view.loss_frame(summarize(tmp_path))
    assert len(frame) <= MAX_POINTS and frame["step"].iloc[-1] == 2000 and frame["step"].iloc[0] == 1
    assert len(jobs_view.rss_frame(summarize(tmp_path))) <= MAX_POINTS
