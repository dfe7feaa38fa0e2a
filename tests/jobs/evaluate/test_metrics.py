"""The scores and the table against values worked out by hand on tiny strings, and the bootstrap
interval's determinism: no model, milliseconds."""
import math

import pytest

from jobs.evaluate import metrics
from jobs.evaluate.data import EvalRow
from jobs.evaluate.table import bootstrap_interval, format_table, results_table
from jobs.train.rewards.score import RewardSet

HYP, REF = "the cat sat", "the cat sat on the mat"


def test_exact_match_ignores_outer_and_repeated_whitespace_only():
    assert metrics.exact_match("  Paris\n is  big ", "Paris is big") == 100.0
    assert metrics.exact_match("paris is big", "Paris is big") == 0.0


def test_rouge_l_is_the_lcs_f1():
    # LCS 3 tokens: precision 3/3, recall 3/6, F1 = 2 * 1 * 0.5 / 1.5 = 2/3
    assert metrics.rouge_l(HYP, REF) == pytest.approx(100 * 2 / 3)
    assert metrics.rouge_l("dog", REF) == 0.0


def test_sentence_bleu_by_hand():
    # effective order: 1..3-gram precisions all 1 (no 4-gram in a 3-token answer), so the score is the
    # brevity penalty exp(1 - 6/3)
    assert metrics.bleu(HYP, REF) == pytest.approx(100 * math.exp(-1), abs=1e-6)
    assert metrics.bleu(REF, REF) == pytest.approx(100.0)


def test_chrf_bounds():
    assert metrics.chrf(REF, REF) == pytest.approx(100.0)
    assert metrics.chrf("xyz", "abc") == 0.0
    assert 0 < metrics.chrf(HYP, REF) < 100


def test_text_scores_without_a_reference_are_none():
    assert metrics.text_scores("a", None, ["exact_match", "bleu"]) == {"exact_match": None, "bleu": None}


def test_rewards_score_answers_as_grpo_does():
    rows = [EvalRow(1, "2+2?", "4", {"answer": "4"}), EvalRow(2, "3+3?", "6", {"answer": "6"})]
    scores = metrics.reward_scores(RewardSet(["answer:1", "format:1"]), rows, ["<answer>4</answer>", "5"],
                                   [3, 1], 16)
    assert scores == [{"reward/answer": 1.0, "reward/format": 1.0}, {"reward/answer": 0.0, "reward/format": 0.0}]


def test_bootstrap_interval_is_seeded_and_brackets_the_mean():
    diffs = [0.0, 1.0, 2.0, 5.0, -1.0, 3.0]
    first = bootstrap_interval(diffs, 500, seed=7)
    assert first == bootstrap_interval(diffs, 500, seed=7)
    assert first != bootstrap_interval(diffs, 500, seed=8)
    assert first[0] < sum(diffs) / len(diffs) < first[1]
    assert bootstrap_interval([2.0] * 5, 100, seed=0) == (2.0, 2.0)
    assert all(math.isnan(v) for v in bootstrap_interval([], 100, seed=0))


def _row(base, tuned):
    return {"scores": {"base": base, "tuned": tuned}}


def test_results_table_pairs_rows_both_scored():
    rows = [_row({"bleu": 10.0, "reward/answer": 0.0}, {"bleu": 30.0, "reward/answer": 1.0}),
            _row({"bleu": 20.0, "reward/answer": 1.0}, {"bleu": 20.0, "reward/answer": 1.0}),
            _row({"bleu": None, "reward/answer": 0.0}, {"bleu": None, "reward/answer": 0.0})]
    table = {e["metric"]: e for e in results_table(rows, 200, seed=1)}
    assert (table["bleu"]["rows"], table["bleu"]["base"], table["bleu"]["tuned"]) == (2, 15.0, 25.0)
    assert table["bleu"]["difference"] == 10.0 and table["bleu"]["ci_low"] <= 10.0 <= table["bleu"]["ci_high"]
    assert table["reward/answer"]["rows"] == 3
    assert table["reward/answer"]["difference"] == pytest.approx(1 / 3)
    assert "bleu" in format_table(list(table.values()))


def test_a_grpo_jobs_own_rewards_and_the_rule_for_code(tmp_path):
    from types import SimpleNamespace

    from jobs.evaluate.run import reward_set
    from jobs.spec import JobSpec, SpecError
    grpo = JobSpec.from_dict({"method": "grpo", "dataset": "builtin:arithmetic"}, to_run=False)
    assert reward_set(SimpleNamespace(rewards=""), grpo, tmp_path, print).names == ["answer", "format"]
    assert reward_set(SimpleNamespace(rewards="json:1"), grpo, tmp_path, print).names == ["json"]
    assert reward_set(SimpleNamespace(rewards=""), JobSpec(), tmp_path, print) is None
    code = tmp_path / "jobs" / "some-job" / "rewards.py"   # a file the studio wrote: never imported
    code.parent.mkdir(parents=True)
    code.write_text("def always(prompts, completions, **_):\n    return [1.0] * len(completions)\n")
    grpo.reward_file = str(code)
    with pytest.raises(SpecError, match="^reward_file: "):
        reward_set(SimpleNamespace(rewards="always"), grpo, tmp_path, print)
