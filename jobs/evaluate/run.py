"""One evaluation from start to end: read the rows, load the base with the job's adapter once, then per
batch the base's and the tuned model's answers to the same prompts, scored and appended to rows.jsonl;
at the end the table (jobs/evaluate/table.py), rows.csv, results.json and any lm-eval benchmarks.

Progress is the job events' schema (docs/contracts.md) in the evaluation's own events.jsonl: `phase`
events (`loading model`, then `evaluating` with done/total rows), a start event, then done or error;
so the runner and the page read it as they read a training job's. A cancel (SIGTERM: `cancelled()`)
stops at the next batch and keeps every row scored so far, with its table."""
from __future__ import annotations

import gc
import time
from dataclasses import asdict
from pathlib import Path

from jobs.evaluate import metrics, report
from jobs.evaluate.config import EvalConfig
from jobs.evaluate.data import EvalData, EvalRow, load_eval_data
from jobs.evaluate.generate import Generator
from jobs.evaluate.table import results_table
from jobs.io.events import EventWriter
from jobs.io.layout import EvalLayout
from jobs.messages import say
from jobs.serve.served import load_served
from jobs.spec import JobSpec, SpecError, reward_entries
from jobs.train.rewards.score import RewardSet


def reward_set(config: EvalConfig, spec: JobSpec, data_dir, log) -> RewardSet | None:
    """The rewards named by the config, else a grpo job's own; the job's reward_file only under the
    rule for code (load_reward_file checks it again right before the import)."""
    if config.rewards:
        return RewardSet(reward_entries(config.rewards), spec.reward_file, log=log,
                         data_dir=data_dir)
    if spec.method == "grpo":
        return RewardSet.for_spec(spec, log=log, data_dir=data_dir)
    return None


class Evaluation:
    def __init__(self, config: EvalConfig, spec: JobSpec, layout: EvalLayout, data_dir=None, log=print):
        self.config, self.spec, self.layout, self.data_dir, self.log = config, spec, layout, data_dir, log
        self.events = EventWriter(layout.root)
        self.records: list[dict] = []

    def run(self, cancelled=lambda: False) -> dict:
        """The summary written to results.json; `cancelled` true in it when stopped early."""
        data = self._data()
        rewards = None if data.pairs else reward_set(self.config, self.spec, self.data_dir, self.log)
        if data.rows and not data.pairs and rewards is None and all(r.reference is None for r in data.rows):
            raise SpecError("eval_file", say("eval_nothing_to_score", name=data.name))
        if self.config.tasks:
            from jobs.evaluate.harness import check_tasks
            check_tasks(self.config.tasks)
        started = time.monotonic()
        stopped = self._rows(data, rewards, cancelled) if data.rows else False
        benchmarks = None
        if self.config.tasks and not stopped:
            benchmarks = self._benchmarks(cancelled)
        return self._finish(data, stopped or cancelled(), time.monotonic() - started, benchmarks)

    def _data(self) -> EvalData:
        """The rows; none when only benchmarks are asked of a job that holds out no data."""
        spec = self.spec
        if self.config.tasks and not (self.config.eval_file or spec.eval_dataset or spec.eval_fraction > 0):
            return EvalData([], "", pairs=False)
        return load_eval_data(self.config.eval_file, spec, self.config.limit, self.data_dir, self.log)

    def _rows(self, data: EvalData, rewards, cancelled) -> bool:
        """Base and tuned answers (or pair margins) for every row; True when a cancel stopped it."""
        self.events.emit("phase", phase="loading model")
        served = load_served([self.config.job], self.data_dir, log=self.log)
        base, tuned = served.models.values()
        generator = Generator(served, self.config.max_new_tokens, self.config.temperature, self.config.seed,
                              log=self.log)
        self.events.emit("start", rows=len(data.rows), source=data.name, pairs=data.pairs,
                         base=base.id, tuned=tuned.id, config=asdict(self.config))
        return self._batches(data, generator, base, tuned, rewards, cancelled)

    def _benchmarks(self, cancelled) -> dict | None:
        """lm-eval's tasks on base and tuned (jobs/evaluate/harness.py), written to benchmarks.json.
        Runs after the rows' model is gone: lm-eval loads its own, one model in memory at a time."""
        from jobs.evaluate.harness import run_tasks
        from jobs.serve.served import _job_base   # the base folder the job trained on, as serve finds it
        gc.collect()
        _, base_dir, adapter = _job_base(Path(self.config.job).resolve(), self.data_dir, self.log)
        benchmarks = run_tasks(self.config, base_dir, adapter, self.events, self.log, cancelled)
        if benchmarks is not None:
            report.write_benchmarks(self.layout, benchmarks)
        return benchmarks

    def _batches(self, data: EvalData, generator, base, tuned, rewards, cancelled) -> bool:
        """Score every batch; True when a cancel stopped it early."""
        size, total = self.config.batch_size, len(data.rows)
        for start in range(0, total, size):
            if cancelled():
                return True
            batch = data.rows[start:start + size]
            records = (self._pairs(batch, generator, base, tuned) if data.pairs
                       else self._answers(batch, generator, base, tuned, rewards, cancelled))
            if records is None:
                return True
            report.append_rows(self.layout, records)
            self.records += records
            self.events.emit("phase", phase="evaluating", done=len(self.records), total=total, unit="rows")
            self.log(f"evaluated {len(self.records)}/{total} rows")
        return False

    def _answers(self, batch: list[EvalRow], generator, base, tuned, rewards, cancelled) -> list[dict] | None:
        prompts = [r.prompt for r in batch]
        answers = {side: generator.answers(model, prompts, cancelled) for side, model in
                   (("base", base), ("tuned", tuned))}
        if cancelled():
            return None   # a batch cut short is not scored: its answers may be unfinished
        scores = {side: [metrics.text_scores(text, r.reference, self.config.metrics)
                         for (text, _), r in zip(answers[side], batch)] for side in answers}
        if rewards is not None:
            for side in answers:
                texts, lengths = [t for t, _ in answers[side]], [n for _, n in answers[side]]
                extra = metrics.reward_scores(rewards, batch, texts, lengths, self.config.max_new_tokens)
                for row_scores, more in zip(scores[side], extra):
                    row_scores.update(more)
        records = []
        for i, row in enumerate(batch):
            row_scores = {"base": scores["base"][i], "tuned": scores["tuned"][i]}
            records.append({"row": row.number, "prompt": row.prompt, "reference": row.reference,
                            "base": answers["base"][i][0], "tuned": answers["tuned"][i][0],
                            "scores": row_scores, "change": report.changes(row_scores)})
        return records

    @staticmethod
    def _pairs(batch: list[EvalRow], generator, base, tuned) -> list[dict]:
        """Which answer of each pair the model's log-probabilities prefer, base and tuned."""
        from jobs.data.preference import answer_text
        records = []
        for row in batch:
            row_scores = {}
            for side, model in (("base", base), ("tuned", tuned)):
                margin = generator.margin(model, row.prompt, row.chosen, row.rejected)
                row_scores[side] = {"prefers_chosen": 100.0 if margin > 0 else 0.0, "logprob_margin": margin}
            records.append({"row": row.number, "prompt": row.prompt, "reference": answer_text(row.chosen),
                            "rejected": answer_text(row.rejected), "base": None, "tuned": None,
                            "scores": row_scores, "change": report.changes(row_scores)})
        return records

    def _finish(self, data: EvalData, stopped: bool, seconds: float, benchmarks) -> dict:
        table = results_table(self.records, self.config.bootstrap_samples, self.config.seed)
        summary = {"job": self.config.job, "source": data.name, "rows": len(self.records), "total": len(data.rows),
                   "pairs": data.pairs, "cancelled": stopped, "seconds": round(seconds, 2), "table": table,
                   "benchmarks": benchmarks}
        report.write_results(self.layout, summary, self.records)
        self.events.emit("done", rows=len(self.records), total=len(data.rows), cancelled=stopped, table=table,
                         benchmarks=benchmarks)
        return summary
