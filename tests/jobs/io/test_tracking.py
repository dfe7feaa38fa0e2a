"""report_to (issue 22, item 6): the trackers listen to the job's events, so TensorBoard holds what
events.jsonl holds; missing tracker packages are refused at preflight, naming the field."""
from __future__ import annotations

import pytest
import yaml

from jobs.io.events import EventWriter, read_events
from jobs.spec import JobSpec, SpecError
from jobs.io.tracking import Trackers, missing_packages, scalars, tensorboard_command


def _scalars_of(folder) -> dict[str, list[tuple[int, float]]]:
    """Every scalar TensorBoard's own reader finds under `folder`: tag -> [(step, value)]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _expected(events: list[dict]) -> dict[str, list[tuple[int, float]]]:
    wanted: dict[str, list[tuple[int, float]]] = {}
    for event in events:
        for tag, value in scalars(event).items():
            wanted.setdefault(tag, []).append((event["step"], value))
    return wanted


def assert_same_scalars(got: dict, wanted: dict) -> None:
    """Same tags, same steps, values equal up to TensorBoard's float32."""
    assert sorted(got) == sorted(wanted)
    for tag, points in wanted.items():
        assert [s for s, _ in got[tag]] == [s for s, _ in points], tag
        assert [v for _, v in got[tag]] == pytest.approx([v for _, v in points], rel=1e-6), tag


def test_report_to_is_none_or_a_list_of_trackers_named_by_field():
    assert JobSpec().report_to == "none"
    assert JobSpec.from_dict({"report_to": "tensorboard, mlflow"}).report_to == ["tensorboard", "mlflow"]
    assert JobSpec.from_dict({"report_to": ["wandb"]}).report_to == ["wandb"]
    with pytest.raises(SpecError, match="^report_to: 'comet' is not one of none, tensorboard"):
        JobSpec.from_dict({"report_to": "comet"})
    with pytest.raises(SpecError, match="^report_to: none cannot be combined"):
        JobSpec.from_dict({"report_to": ["none", "wandb"]})


def test_a_missing_tracker_package_is_refused_at_preflight_with_the_pip_command(monkeypatch):
    import importlib.util

    from jobs.checks import preflight
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    assert missing_packages(["tensorboard", "mlflow"]) == [("mlflow", "mlflow")]
    report = preflight.PreflightReport(spec=JobSpec())
    preflight._check_trackers(JobSpec.from_dict({"report_to": "tensorboard,mlflow"}), report)
    assert [(p.key, p.message) for p in report.problems] == [
        ("report_to", "mlflow is not installed: pip install mlflow (or remove mlflow from report_to)")]


def test_tensorboard_scalars_equal_the_events_of_a_listener_fed_writer(tmp_path):
    config = JobSpec.from_dict({"report_to": "tensorboard", "name": "tb"}).to_dict()
    events = EventWriter(tmp_path, sinks=[Trackers(tmp_path, config, ["tensorboard"])])
    events.emit("start", max_steps=3, resumed_at=0)
    for step in (1, 2, 3):
        events.emit("step", step=step, max_steps=3, loss=2.0 / step, lr=1e-4 * step, grad_norm=0.5 + step,
                    tokens_per_s=1000.0 + step, rss_gb=1.25, elapsed_s=step,
                    gpus=[{"index": 0, "util_pct": 90 + step, "mem_used_gb": 3.5 + step, "mem_total_gb": 80}])
    events.emit("eval", step=3, eval_loss=1.5)
    events.emit("step", step=4, max_steps=3, loss=float("nan"))  # NaN is null in the file: not a scalar
    events.emit("done", step=4, final_loss=0.6)
    got = _scalars_of(tmp_path / "tensorboard")
    assert_same_scalars(got, _expected(read_events(tmp_path)))
    assert set(got) >= {"train/loss", "train/learning_rate", "train/grad_norm", "train/tokens_per_s",
                        "eval/loss", "gpu0/mem_used_gb"}
    assert tensorboard_command(tmp_path) == f"tensorboard --logdir {tmp_path / 'tensorboard'}"


def test_the_method_numbers_the_jobs_tab_plots_go_to_the_trackers_too(tmp_path):
    """DPO's rewards, margin and accuracy and GRPO's rewards (issue 40: TensorBoard had the loss only)."""
    dpo = scalars({"type": "step", "step": 2, "max_steps": 9, "loss": 0.6, "chosen_reward": 0.25,
                   "rejected_reward": -0.5, "reward_margin": 0.75, "reward_accuracy": 1.0, "elapsed_s": 3.0})
    assert dpo == {"train/loss": 0.6, "train/chosen_reward": 0.25, "train/rejected_reward": -0.5,
                   "train/reward_margin": 0.75, "train/reward_accuracy": 1.0}
    grpo = scalars({"type": "step", "step": 1, "reward_mean": 0.5, "reward_std": 0.25, "reward/correct": 1.0,
                    "completion_length": 40.0, "kl": 0.01, "cpu_pct": 90.0})
    assert grpo == {"train/reward_mean": 0.5, "train/reward_std": 0.25, "train/reward/correct": 1.0,
                    "train/completion_length": 40.0, "train/kl": 0.01, "system/cpu_pct": 90.0}
    assert scalars({"type": "eval", "step": 4, "eval_loss": 1.5, "eval_reward_accuracy": 0.5, "eval_tokens": 9}) == {
        "eval/loss": 1.5, "eval/reward_accuracy": 0.5, "eval/tokens": 9.0}
    config = JobSpec.from_dict({"report_to": "tensorboard", "name": "tb"}).to_dict()
    events = EventWriter(tmp_path, sinks=[Trackers(tmp_path, config, ["tensorboard"])])
    events.emit("start", max_steps=2, resumed_at=0)   # the trackers open on the start event
    events.emit("step", step=1, max_steps=2, loss=0.7, reward_margin=0.1, reward_accuracy=0.5)
    events.emit("step", step=2, max_steps=2, loss=0.6, reward_margin=0.3, reward_accuracy=1.0)
    events.emit("done", step=2, final_loss=0.65)
    got = _scalars_of(tmp_path / "tensorboard")
    assert_same_scalars(got, _expected(read_events(tmp_path)))
    assert set(got) >= {"train/reward_margin", "train/reward_accuracy"}


def test_a_real_job_reports_to_tensorboard_what_events_jsonl_says(tmp_path, tiny_model, in_process_cli):
    """A training run through jobs.train with report_to: tensorboard; the hyperparameters are there too."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from jobs.train import cli as train
    out = tmp_path / "job"
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump({"model": str(tiny_model), "output_dir": str(out), "max_steps": 3,
                                      "save_steps": 0, "max_seq_length": 64, "eval_fraction": 0.2,
                                      "report_to": ["tensorboard"]}))
    assert train.main([str(config), "--data-dir", str(tmp_path / "data")]) == 0
    events = read_events(out)
    got = _scalars_of(out / "tensorboard")
    assert_same_scalars(got, _expected(events))
    assert [s for s, _ in got["train/loss"]] == [1, 2, 3] and "eval/loss" in got
    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    assert "config" in acc.Tags()["tensors"] or "config/text_summary" in acc.Tags()["tensors"]
    hparams = acc.summary_metadata.get("_hparams_/session_start_info")
    assert hparams is not None, sorted(acc.summary_metadata)


class _Recorder:
    """Stands in for the wandb module and mlflow's MlflowClient (neither is a requirement): records calls."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        def call(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            return self
        return call


def test_wandb_runs_offline_and_mlflow_writes_a_file_store_under_the_job(tmp_path, monkeypatch):
    import sys
    import types
    wandb, client = _Recorder(), _Recorder()
    client.get_experiment_by_name = lambda name: types.SimpleNamespace(experiment_id="7")
    client.create_run = lambda experiment, run_name: types.SimpleNamespace(info=types.SimpleNamespace(run_id="r1"))
    made = {}
    tracking_module = types.ModuleType("mlflow.tracking")
    tracking_module.MlflowClient = lambda tracking_uri: made.setdefault("uri", tracking_uri) and client
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    monkeypatch.setitem(sys.modules, "mlflow", types.ModuleType("mlflow"))
    monkeypatch.setitem(sys.modules, "mlflow.tracking", tracking_module)
    config = JobSpec.from_dict({"report_to": "wandb,mlflow", "name": "run"}).to_dict()
    events = EventWriter(tmp_path, sinks=[Trackers(tmp_path, config, ["wandb", "mlflow"])])
    events.emit("start", max_steps=1, resumed_at=0)
    events.emit("step", step=1, max_steps=1, loss=1.5, lr=2e-4)
    events.emit("done", step=1, final_loss=1.5)
    init = [c for c in wandb.calls if c[0] == "init"][0][2]
    assert init["mode"] == "offline" and init["dir"] == str(tmp_path / "wandb") and init["config"]["lora_r"] == 16
    assert ("log", ({"train/loss": 1.5, "train/learning_rate": 2e-4},), {"step": 1}) in wandb.calls
    assert wandb.calls[-1] == ("finish", (), {"exit_code": 0})
    assert made["uri"] == (tmp_path / "mlruns").resolve().as_uri()
    assert ("log_param", ("r1", "report_to", "wandb,mlflow"), {}) in client.calls
    assert ("log_metric", ("r1", "train/loss", 1.5), {"step": 1}) in client.calls
    assert client.calls[-1] == ("set_terminated", ("r1",), {"status": "FINISHED"})
