"""EvalConfig: the one typed description of an evaluation, as JobSpec is of a training job (jobs/spec.py):
the YAML `python -m jobs.evaluate` reads is the Evaluate form's fields. Each field has its help text in
metadata; validation names the field and the fix and runs before any model is loaded."""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from jobs.io.layout import JobLayout
from jobs.messages import say
from jobs.spec_values import _normalise_gpus
from jobs.spec import SpecError, _check_bounds, _check_dataset_path, _f, _parse_rewards  # _f: the same field helper as JobSpec
from jobs.yaml_bounded import load_config_yaml

TEXT_METRICS = ("exact_match", "rouge_l", "bleu", "chrf")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass
class EvalConfig:
    """One evaluation of a finished job: its base model and its tuned model (base + adapter) on the
    same prompts."""

    job: str = _f("", "The finished job's folder (its config.yaml and adapter/).")
    eval_file: str = _f("", "Rows to evaluate on (.json/.jsonl/.csv/.parquet: chat, alpaca, prompt/answer or "
                        "preference rows); empty: the job's held-out data (its eval_dataset, or the "
                        "eval_fraction it split off with its seed).")
    name: str = _f("", "The evaluation's folder name under <job>/evaluations/; empty: the time it started.")
    max_new_tokens: int = _f(64, "Most tokens per generated answer.", min=1, max=8192)
    temperature: float = _f(0.0, "Sampling temperature; 0 is greedy (the same answer every time).",
                            min=0.0, max=10.0)
    seed: int = _f(0, "Seed for sampling (temperature > 0) and the bootstrap.", min=0, max=2**32 - 1)
    limit: int = _f(200, "Rows evaluated at most, from the start of the data (0: every row).", min=0,
                    max=10_000_000)
    batch_size: int = _f(8, "Prompts generated together in one batch.", min=1, max=1024)
    metrics: Any = _f(list(TEXT_METRICS), "Scores against the reference answer: any of exact_match, rouge_l "
                      "(rouge-score), bleu, chrf (sacrebleu), each 0-100 per row.")
    rewards: str = _f("", "GRPO rewards to score the answers with: a list of names (answer, format, think_format, "
                      "length, json, or a function of the job's reward_file); empty: the job's own rewards when it "
                      "is a grpo job, else none.")
    tasks: Any = _f([], "lm-evaluation-harness tasks run on base and tuned: the bundled fusetune_tiny_qa, or any "
                    "lm-eval task whose data is on this machine; empty: none.")
    task_limit: int = _f(0, "lm-eval: examples per task at most (0: all).", min=0, max=10_000_000)
    gpus: str = _f("auto", "The GPU it runs on: auto (in the studio's queue, the first free one) or one GPU number "
                   "such as 0; the queue writes here the one it was given.")
    bootstrap_samples: int = _f(1000, "Resamples of the rows for the 95% confidence interval of each difference.",
                                min=10, max=1_000_000)

    @classmethod
    def from_dict(cls, data: Any, *, to_run: bool = True) -> "EvalConfig":
        """Build and validate; unknown keys and wrong types are refused by name. `to_run=False`: the
        config of an evaluation that has run, read back (its folder exists by then)."""
        if not isinstance(data, dict):
            raise SpecError(None, say("config_not_flat"))
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(str(k) for k in data if k not in known)
        if unknown:
            raise SpecError(unknown[0], say("config_unknown_key", known=", ".join(known)))
        config = cls(**{k: _coerce(k, v) for k, v in data.items()})
        config.validate(to_run)
        return config

    @classmethod
    def from_yaml(cls, path: str | Path, *, to_run: bool = True) -> "EvalConfig":
        try:
            text = Path(path).read_text(encoding="utf-8")
            data = load_config_yaml(text, str(path))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise SpecError(None, say("config_not_yaml", path=path, detail=exc)) from None
        return cls.from_dict(data or {}, to_run=to_run)

    def to_yaml(self) -> str:
        return yaml.safe_dump(dataclasses.asdict(self), sort_keys=False, allow_unicode=True, width=10_000)

    def validate(self, to_run: bool = True) -> None:
        for f in dataclasses.fields(self):
            _check_bounds(f, getattr(self, f.name))
        self.metrics = _names("metrics", self.metrics)
        self.tasks = _names("tasks", self.tasks)
        for metric in self.metrics:
            if metric not in TEXT_METRICS:
                raise SpecError("metrics", say("value_not_choice", value=metric, choices=", ".join(TEXT_METRICS)))
        self.rewards = _parse_rewards(self.rewards)
        self.gpus = _normalise_gpus(self.gpus)
        if self.gpus != "auto" and not self.gpus.isdigit():
            raise SpecError("gpus", say("eval_one_gpu", value=self.gpus))
        _check_job(self.job)
        if self.eval_file:
            if self.eval_file.startswith("builtin:"):
                raise SpecError("eval_file", say("eval_dataset_builtin"))
            _check_dataset_path(self.eval_file, key="eval_file")
            if not Path(self.eval_file).expanduser().is_file():
                raise SpecError("eval_file", say("file_missing", path=self.eval_file))
        if self.name:
            if not NAME.match(self.name):
                raise SpecError("name", say("eval_name_bad", value=self.name))
            if to_run and JobLayout(self.job).evaluation(self.name).root.exists():
                raise SpecError("name", say("eval_name_taken", value=self.name))


def _check_job(job: str) -> None:
    if not job.strip():
        raise SpecError("job", say("eval_job_missing", path="''"))
    layout = JobLayout(Path(job).expanduser())
    if not layout.config.is_file():
        raise SpecError("job", say("eval_job_missing", path=job))
    if not layout.has_adapter():
        raise SpecError("job", say("eval_no_adapter", path=job))


def _names(key: str, value: Any) -> list[str]:
    """A YAML list or a comma-separated string, as a list of names."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) for i in items):
        raise SpecError(key, say("value_invalid", value=value, kind="list of names"))
    return [i.strip() for i in items if i.strip()]


def _coerce(key: str, value: Any) -> Any:
    kind = EvalConfig.__dataclass_fields__[key].type
    try:
        if kind in ("int", "float"):
            if isinstance(value, bool):
                raise ValueError
            number = float(value)
            if not math.isfinite(number) or (kind == "int" and not number.is_integer()):
                raise ValueError
            return int(number) if kind == "int" else number
        if kind == "str":
            if key == "rewards" and isinstance(value, (list, tuple)):
                return ",".join(str(v) for v in value)
            if isinstance(value, (dict, list)):
                raise ValueError
            return "" if value is None else str(value)
    except (TypeError, ValueError):
        raise SpecError(key, say("value_invalid", value=value, kind=kind)) from None
    return value
