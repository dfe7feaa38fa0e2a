"""Per-row scores of an answer against its reference, each 0-100 as LLaMA-Factory's Evaluate & Predict
reports them (its ComputeSimilarity scales BLEU-4 and ROUGE by 100):

exact_match  100 when answer and reference are equal after trimming and collapsing whitespace, else 0.
rouge_l      ROUGE-L F1 (Google's `rouge-score`, no stemming; its tokenizer keeps ASCII letters and
             digits only, so text with no such character scores 0).
bleu         sentence BLEU (sacrebleu's `sentence_bleu`: 13a tokens, exp smoothing, effective order,
             sacrebleu's own advice for scoring one sentence).
chrf         sentence chrF (sacrebleu's `sentence_chrf`): character n-grams, good for any language.

Scores are per row, so a mean over rows is the table's number and rows can be resampled for its
confidence interval (jobs/evaluate/table.py). Rewards (GRPO's, jobs/train/rewards/) score the answers
as they scored the job's completions during training."""
from __future__ import annotations

from functools import lru_cache

from jobs.evaluate.data import EvalRow
from jobs.train.rewards.score import RewardSet


def exact_match(answer: str, reference: str) -> float:
    return 100.0 if " ".join(answer.split()) == " ".join(reference.split()) else 0.0


@lru_cache(maxsize=1)
def _rouge():
    from rouge_score import rouge_scorer
    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)


def rouge_l(answer: str, reference: str) -> float:
    return 100.0 * _rouge().score(reference, answer)["rougeL"].fmeasure


def bleu(answer: str, reference: str) -> float:
    import sacrebleu
    return float(sacrebleu.sentence_bleu(answer, [reference]).score)


def chrf(answer: str, reference: str) -> float:
    import sacrebleu
    return float(sacrebleu.sentence_chrf(answer, [reference]).score)


TEXT_SCORES = {"exact_match": exact_match, "rouge_l": rouge_l, "bleu": bleu, "chrf": chrf}


def text_scores(answer: str, reference: str | None, metrics: list[str]) -> dict[str, float | None]:
    """{metric: score} of one answer; None for every metric when the row has no reference."""
    return {m: (None if reference is None else TEXT_SCORES[m](answer, reference)) for m in metrics}


def reward_scores(rewards: RewardSet, rows: list[EvalRow], answers: list[str], lengths: list[int],
                  max_new_tokens: int) -> list[dict[str, float]]:
    """{"reward/<name>": value} per answer, each reward called as the GRPO trainer calls it: the
    prompts, the completions and the rows' other columns by name (jobs/train/rewards/score.py)."""
    names = sorted({k for r in rows for k in r.columns})
    columns = {k: [r.columns.get(k) for r in rows] for k in names}
    _, each = rewards.score([r.prompt for r in rows], answers, columns, lengths, max_new_tokens)
    return [{f"reward/{name}": values[i] for name, values in each.items()} for i in range(len(rows))]
