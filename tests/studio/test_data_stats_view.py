"""The Train tab's token-length histograms say what their axis is (issue 40: no x-axis labels), and
stay on the page until what they measured changes."""
import gradio as gr

from jobs.data.stats import histogram_edges
from studio.data_stats import _ticks, stale_cleared, stats_html


def test_the_histogram_axis_has_evenly_spaced_token_counts_and_a_title():
    edges = histogram_edges(900, 512)
    ticks = _ticks(edges)
    assert len(ticks) == 5 and ticks[0] == edges[0] == 0 and ticks[-1] == edges[-1]
    assert ticks == sorted(ticks)
    counts = [1] * (len(edges) - 1)
    stats = {"edges": edges, "prompt_counts": counts, "answer_counts": counts, "max_seq_length": 512,
             "truncated_rows": 0, "trained_share": 0.5}
    page = stats_html({"name": "d", "rows": 3, "stats": stats, "duplicates": 0})
    assert page.count('class="ft-axis-title"') == 2 and "tokens per row" in page and "max_seq_length 512" in page
    assert "".join(f"<span>{tick:,}</span>" for tick in ticks) in page
    zh = stats_html({"name": "d", "rows": 3, "stats": stats, "duplicates": 0}, "zh-CN")
    assert "每行的 token 数" in zh
    assert _ticks([0, 8, 16]) == [0, 8, 16]   # fewer edges than ticks: every edge


def test_a_late_change_event_leaves_the_numbers_measured_for_the_same_fields():
    """A field's change event that lands after the statistics were drawn for the same dataset, model and
    max_seq_length (an upload's chained events, on a busy machine) keeps them; a real change clears them."""
    shown_for = ["/d/long.jsonl", 64, "/m/tiny"]
    kept = stale_cleared(shown_for, "/d/long.jsonl", 64, "/m/tiny")
    assert all(isinstance(part, type(gr.skip())) for part in kept)
    assert stale_cleared(shown_for, "/d/long.jsonl", 400, "/m/tiny") == ("", "")
    assert stale_cleared(None, "/d/long.jsonl", 64, "/m/tiny") == ("", "")
