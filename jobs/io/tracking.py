"""(jobs/io) Experiment tracking: a job's events mirrored to TensorBoard, MLflow or W&B (`report_to`).

The trackers listen to the job's events (jobs/events.EventWriter's sinks), so every method that
reports step and eval events is tracked without the training loop knowing: the same scalars as
events.jsonl (loss, learning rate, grad norm, tokens/s, eval loss, GPU memory and utilisation,
process memory) at the event's step, and the job's config as hyperparameters. Everything is
written into the job folder and works offline: TensorBoard event files in `<job>/tensorboard/`
(torch.utils.tensorboard's SummaryWriter, as transformers' TensorBoardCallback does), an MLflow
file store in `<job>/mlruns/`, a W&B run in offline mode under `<job>/wandb/` (`wandb sync` uploads
it later). The tag names follow transformers' trackers ("train/loss", "eval/loss").

A tracker that fails never fails the job: its error is logged once and the tracker is dropped."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Callable

TRACKERS = ("tensorboard", "mlflow", "wandb")
TENSORBOARD_DIR, MLFLOW_DIR, WANDB_DIR = "tensorboard", "mlruns", "wandb"
PIP_NAMES = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}
_STEP_SCALARS = {"loss": "train/loss", "lr": "train/learning_rate", "grad_norm": "train/grad_norm",
                 "tokens_per_s": "train/tokens_per_s", "rss_gb": "system/rss_gb", "cpu_pct": "system/cpu_pct",
                 "peak_gb": "system/peak_gpu_gb"}
_GPU_SCALARS = ("mem_used_gb", "util_pct")
# step fields that place a step rather than measure it; every other number a method reports
# (DPO's reward_margin and reward_accuracy, GRPO's reward_mean and reward/<name>, ...) goes to
# the trackers as train/<its event name>, so they hold every number the Jobs tab plots
_NOT_MEASURES = {"type", "time", "step", "max_steps", "elapsed_s", "eta_s", "gpus", "step_s"}


def scalars(event: dict[str, Any]) -> dict[str, float]:
    """The numbers of one step or eval event under their tracker tags (None and non-numbers left out)."""
    found: dict[str, float] = {}
    if event.get("type") == "step":
        for key, value in event.items():
            if key not in _NOT_MEASURES:
                _put(found, _STEP_SCALARS.get(key, f"train/{key}"), value)
        for gpu in event.get("gpus") or []:
            if isinstance(gpu, dict):
                name = f"gpu{gpu.get('index', 0)}" + (f"@{gpu['host']}" if gpu.get("host") else "")
                for key in _GPU_SCALARS:
                    _put(found, f"{name}/{key}", gpu.get(key))
    elif event.get("type") == "eval":
        for key, value in event.items():   # eval_loss -> eval/loss, eval_reward_accuracy -> eval/reward_accuracy
            if key.startswith("eval_"):
                _put(found, "eval/" + key.removeprefix("eval_"), value)
    return found


def _put(into: dict[str, float], tag: str, value: Any) -> None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        into[tag] = float(value)


def hyperparameters(config: dict[str, Any]) -> dict[str, Any]:
    """The config as flat hyperparameters: numbers, bools and strings as they are, lists joined."""
    flat = {}
    for key, value in config.items():
        if isinstance(value, (list, tuple)):
            value = ",".join(str(v) for v in value)
        flat[key] = value if isinstance(value, (int, float, bool, str)) else str(value)
    return flat


def missing_packages(report_to: list[str]) -> list[tuple[str, str]]:
    """(tracker, pip name) of each requested tracker whose package is not installed."""
    return [(name, PIP_NAMES[name]) for name in report_to if importlib.util.find_spec(PIP_NAMES[name]) is None]


def tensorboard_command(job_dir: str | Path) -> str:
    """What opens TensorBoard on a job (the Jobs tab shows it)."""
    return f"tensorboard --logdir {Path(job_dir) / TENSORBOARD_DIR}"


class TensorBoardSink:
    def __init__(self, job_dir: Path, config: dict[str, Any]):
        from torch.utils.tensorboard import SummaryWriter
        self.writer = SummaryWriter(log_dir=str(job_dir / TENSORBOARD_DIR))
        self.writer.add_text("config", "\n".join(f"    {k}: {v}" for k, v in config.items()))
        self._write_hparams(hyperparameters(config))

    def _write_hparams(self, params: dict[str, Any]) -> None:
        """The hparams plugin's records in this run's own file (SummaryWriter.add_hparams would
        open a second run in a subfolder)."""
        from torch.utils.tensorboard.summary import hparams
        for summary in hparams(params, metric_dict={"train/loss": 0.0}):
            self.writer.file_writer.add_summary(summary)

    def log(self, values: dict[str, float], step: int) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, global_step=step)
        self.writer.flush()

    def close(self, failed: bool = False) -> None:
        self.writer.close()


class MLflowSink:
    def __init__(self, job_dir: Path, config: dict[str, Any]):
        from mlflow.tracking import MlflowClient
        self.client = MlflowClient(tracking_uri=(job_dir / MLFLOW_DIR).resolve().as_uri())
        experiment = self.client.get_experiment_by_name("fusetune")
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment("fusetune")
        self.run_id = self.client.create_run(experiment_id, run_name=config.get("name") or job_dir.name).info.run_id
        for key, value in hyperparameters(config).items():
            self.client.log_param(self.run_id, key, str(value)[:500])

    def log(self, values: dict[str, float], step: int) -> None:
        for tag, value in values.items():
            self.client.log_metric(self.run_id, tag, value, step=step)

    def close(self, failed: bool = False) -> None:
        self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")


class WandbSink:
    def __init__(self, job_dir: Path, config: dict[str, Any]):
        import wandb
        folder = job_dir / WANDB_DIR
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.run = wandb.init(mode="offline", dir=str(folder), project="fusetune",
                              name=config.get("name") or job_dir.name, config=hyperparameters(config))

    def log(self, values: dict[str, float], step: int) -> None:
        self.run.log(values, step=step)

    def close(self, failed: bool = False) -> None:
        self.run.finish(exit_code=1 if failed else 0)


SINKS: dict[str, Callable[[Path, dict], Any]] = {"tensorboard": TensorBoardSink, "mlflow": MLflowSink,
                                                  "wandb": WandbSink}


class Trackers:
    """The sink EventWriter calls with every event it has written; fans it out to the trackers."""

    def __init__(self, job_dir: str | Path, config: dict[str, Any], names: list[str], log=print):
        self.job_dir, self.config, self.log_line = Path(job_dir), config, log
        self.names, self.open = [n for n in names if n in TRACKERS], {}

    def __call__(self, event: dict[str, Any]) -> None:
        if event.get("type") == "start" and not self.open:
            self._open_all()
        values = scalars(event)
        if values and isinstance(event.get("step"), int):
            for name in list(self.open):
                self._guard(name, lambda sink: sink.log(values, event["step"]))
        if event.get("type") in ("done", "error"):
            self.close(failed=event["type"] == "error" and event.get("kind") != "killed")

    def _open_all(self) -> None:
        for name in self.names:
            try:
                self.open[name] = SINKS[name](self.job_dir, self.config)
            except Exception as exc:  # a tracker is a convenience: the job trains without it
                self.log_line(f"report_to: {name} is off for this job ({type(exc).__name__}: {exc})")

    def _guard(self, name: str, action) -> None:
        try:
            action(self.open[name])
        except Exception as exc:
            self.log_line(f"report_to: {name} stopped ({type(exc).__name__}: {exc})")
            self.open.pop(name, None)

    def close(self, failed: bool = False) -> None:
        for name in list(self.open):
            self._guard(name, lambda sink: sink.close(failed))
        self.open.clear()
