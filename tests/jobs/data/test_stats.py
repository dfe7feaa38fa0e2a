"""Dataset statistics before Start (issue 22 item 7): prompt/answer token lengths against
max_seq_length, the cut, duplicates and the trained share, checked against a direct count with the
same tokenizer on a tiny real model."""
import json

from jobs.data import encode
from jobs.data.stats import RowLengths, duplicate_rows, histogram_edges, length_stats, row_lengths
from jobs.checks.preflight import run_preflight
from jobs.spec import JobSpec
from studio.data_stats import stats_html, warning_html


def test_histogram_edges_cover_every_row_and_put_max_seq_length_on_an_edge():
    for longest, limit in ((1000, 256), (300, 256), (100, 256), (257, 256), (1, 8), (40_000, 4096)):
        edges = histogram_edges(longest, limit)
        assert edges[0] == 0 and edges[-1] > longest and edges == sorted(set(edges))
        assert len(edges) - 1 <= 12
        if limit < longest:
            assert limit in edges


def test_the_numbers_of_measured_rows():
    rows = [RowLengths(100, 40, 40), RowLengths(300, 200, 156), RowLengths(50, 20, 20), RowLengths(700, 100, 0)]
    stats = length_stats(rows, 256)
    assert (stats.truncated_rows, stats.cut_tokens_max, stats.cut_tokens_mean) == (2, 444, 244.0)
    assert (stats.answers_cut_rows, stats.answer_tokens_cut) == (2, 44 + 100)
    assert stats.trained_share == round((40 + 156 + 20) / (100 + 256 + 50 + 256), 4)
    assert sum(stats.prompt_counts) == sum(stats.answer_counts) == 4
    assert duplicate_rows([[{"role": "user", "content": "a"}]] * 3 + [[{"role": "user", "content": "b"}]]) == 2


def test_preflight_measures_prompt_and_answer_and_the_cut(tmp_path, tiny_model):
    long_answer = " ".join(["word"] * 40)
    rows = [{"instruction": "Short question", "input": "", "output": "Short answer."}] * 3 + [
        {"instruction": "Tell me everything", "input": "", "output": long_answer}]
    path = tmp_path / "long.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    spec = JobSpec.from_dict({"model": str(tiny_model), "dataset": str(path), "max_seq_length": 64})
    report = run_preflight(spec, log=lambda _: None)
    assert report.ok, report.problems
    (train,) = report.datasets
    stats = train.stats
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    encode.ensure_chat_template(tokenizer)
    conversations = [[{"role": "user", "content": r["instruction"]}, {"role": "assistant", "content": r["output"]}]
                     for r in rows]
    full = [encode.encode(tokenizer, c, 1 << 30) for c in conversations]
    assert full[-1].trained_tokens > 64 > len(full[0].input_ids)
    assert stats["truncated_rows"] == 1 and stats["cut_tokens_max"] == len(full[-1].input_ids) - 64
    assert stats["answers_cut_rows"] == 1
    kept_answer = encode.encode(tokenizer, conversations[-1], 64).trained_tokens
    assert stats["answer_tokens_cut"] == full[-1].trained_tokens - kept_answer
    assert train.duplicates == 2
    assert row_lengths(tokenizer, conversations[-1], 64).answer == full[-1].trained_tokens
    past_cut = stats["edges"].index(64)   # the bins from max_seq_length on
    assert sum(stats["answer_counts"]) == 4 and sum(stats["answer_counts"][past_cut:]) == 1  # the long answer
    text = report.summary()
    assert "1 rows lose answer tokens to that cut" in text and "2 rows repeat an earlier row exactly" in text

    page = stats_html(vars(train))
    assert 'data-part="prompt"' in page and 'data-part="answer"' in page and "Duplicate rows" in page
    assert "1 rows are longer than max_seq_length=64" in page
    assert "cuts the answers of 1 of 4 rows" in warning_html(vars(train))
    assert "截断" in warning_html(vars(train), "zh-CN")
    short = JobSpec.from_dict({"model": str(tiny_model), "dataset": str(path), "max_seq_length": 512})
    (roomy,) = run_preflight(short, log=lambda _: None).datasets
    assert warning_html(vars(roomy)) == "" and roomy.stats["truncated_rows"] == 0


def test_the_warning_follows_a_start_press_from_what_its_preflight_measured():
    """No second measurement: the warning reads what Start's preflight found for this very config."""
    from studio.data_stats import warning_after_start
    from studio.start_check import StartCheck
    check = StartCheck.__new__(StartCheck)
    check._measured = {}
    spec = JobSpec.from_dict({"max_seq_length": 64})
    check.spec = lambda names, values: spec
    cut = {"key": "dataset", "stats": {"answers_cut_rows": 3, "rows": 9, "answer_tokens_cut": 50, "max_seq_length": 64}}
    assert warning_after_start(check, [], [], "queued") == ""          # no preflight of this config yet
    check._remember(spec, [cut])
    assert "cuts the answers of 3 of 9 rows" in warning_after_start(check, [], [], "queued")
    assert warning_after_start(check, [], [], "") == ""                # the status was cleared: so is the warning
    check._remember(JobSpec.from_dict({"max_seq_length": 128}), [{"key": "dataset", "stats": {}}])
    assert "cuts the answers" in warning_after_start(check, [], [], "queued")   # still this config's numbers
