"""Benchmarks through lm-evaluation-harness (`lm-eval`, EleutherAI), the library itself: its HFLM model
on the job's base folder, then on the same base with the job's adapter (HFLM's `peft=`), each running
the named tasks, scored as lm-eval scores them.

A task is one bundled with the project (tasks/<name>.yaml and its JSONL: offline, for CI and a CPU
check) or any lm-eval task whose data this machine holds (its datasets cache, or a local path in its
YAML); lm-eval's own registry is read only when a task is not bundled (indexing it takes seconds)."""
from __future__ import annotations

import math
from pathlib import Path

import yaml

from jobs.messages import say
from jobs.spec import SpecError

TASKS_DIR = Path(__file__).with_name("tasks")


def bundled_tasks() -> dict[str, Path]:
    return {p.stem: p for p in sorted(TASKS_DIR.glob("*.yaml"))}


def _bundled_config(path: Path) -> dict:
    """The task's YAML as lm-eval's task dict, its data_files made absolute (beside the YAML)."""
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    files = config.get("dataset_kwargs", {}).get("data_files", {})
    for split, name in files.items():
        files[split] = str(path.parent / name)
    return config


def _task_manager(names: list[str]):
    from lm_eval.tasks import TaskManager
    return TaskManager(include_defaults=any(n not in bundled_tasks() for n in names))


def check_tasks(names: list[str]) -> None:
    """SpecError naming `tasks` for a task neither bundled nor known to lm-eval (before any model loads)."""
    bundled = bundled_tasks()
    unknown = [n for n in names if n not in bundled]
    if not unknown:
        return
    known = set(_task_manager(unknown).all_tasks)
    for name in unknown:
        if name not in known:
            raise SpecError("tasks", say("eval_task_unknown", task=name, bundled=", ".join(bundled)))


def _scores(results: dict) -> dict[str, dict[str, float]]:
    """{task: {metric: value}} from lm-eval's results ("acc,none": 0.5 -> "acc"; stderr kept apart)."""
    out: dict[str, dict[str, float]] = {}
    for task, values in results.items():
        for key, value in values.items():
            metric = key.split(",")[0]
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if number and metric not in ("samples", "sample_len"):
                out.setdefault(task, {})[metric] = float(value)
    return out


def _evaluate(config, pretrained: str, peft: str | None, tokenizer: str, tasks: list, manager) -> dict:
    import torch
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    cuda = torch.cuda.is_available()
    model = HFLM(pretrained=pretrained, peft=peft, tokenizer=tokenizer, device="cuda" if cuda else "cpu",
                 dtype="bfloat16" if cuda else "float32", batch_size=config.batch_size)
    out = simple_evaluate(model=model, tasks=tasks, task_manager=manager, limit=config.task_limit or None,
                          random_seed=config.seed, numpy_random_seed=config.seed, torch_random_seed=config.seed,
                          fewshot_random_seed=config.seed, bootstrap_iters=min(config.bootstrap_samples, 10_000),
                          log_samples=False)
    return _scores(out["results"])


def run_tasks(config, base_dir: Path, adapter_dir: Path, events, log, cancelled=lambda: False) -> dict | None:
    """{task: {metric: {base, tuned, difference}}} for base and tuned (None when cancelled between)."""
    bundled = bundled_tasks()
    tasks = [_bundled_config(bundled[n]) if n in bundled else n for n in config.tasks]
    manager = _task_manager(config.tasks)
    has_own = (adapter_dir / "tokenizer_config.json").is_file()
    sides = {}
    for side, peft in (("base", None), ("tuned", str(adapter_dir))):
        if cancelled():
            return None
        events.emit("phase", phase=f"benchmark {side}", done=len(sides), total=2, unit="models")
        log(f"lm-eval: {', '.join(config.tasks)} on the {side} model")
        tokenizer = str(adapter_dir if side == "tuned" and has_own else base_dir)
        sides[side] = _evaluate(config, str(base_dir), peft, tokenizer, tasks, manager)
    table: dict[str, dict] = {}
    for task, values in sides["base"].items():
        for metric, base in values.items():
            if metric.endswith("_stderr"):
                continue
            tuned = sides["tuned"].get(task, {}).get(metric, math.nan)
            table.setdefault(task, {})[metric] = {
                "base": base, "tuned": tuned, "difference": tuned - base,
                "base_stderr": values.get(f"{metric}_stderr"),
                "tuned_stderr": sides["tuned"].get(task, {}).get(f"{metric}_stderr")}
    return table
