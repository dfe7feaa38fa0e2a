"""Resumable checkpoints (`checkpoints/step-N/`) and the final adapter folder.

Both are written whole or not at all (jobs.io.storage.staged_dir): into a hidden `.partial` folder
that is renamed into place when complete. A failed write (a full disk) removes the partial folder,
leaves the previous checkpoint or adapter as it was, and is raised as a StorageError."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from jobs.io.layout import ADAPTER_DIR, ADAPTER_WEIGHTS, MODEL_CARD, OPTIMIZER_STATE, TRAINER_STATE, JobLayout
from jobs.io.storage import staged_dir
from jobs.train import rng_state, sharding

KEEP_CHECKPOINTS = 2


def save_checkpoint(job_dir: Path, step: int, model, optimizer, scheduler, state: dict,
                    rng: list[dict] | None = None, weights: dict | None = None,
                    optimizer_state: dict | None = None) -> Path:
    """Write step-N atomically (temp folder, then rename) and keep only the newest few; older
    ones are deleted only after the new one is complete. `rng`: every rank's random state
    (jobs/train/rng_state.py), so that a resume draws the dropout masks the unbroken run drew.
    `weights`, `optimizer_state`: a sharded model's, gathered whole (jobs/train/sharding.py); the
    files are the same as an unsharded run's."""
    layout = JobLayout(job_dir)
    for stale in layout.checkpoints.glob(".step-*.partial"):  # left by a process killed mid-save
        shutil.rmtree(stale, ignore_errors=True)
    final = layout.checkpoint(step)
    with staged_dir(final, layout.partial_checkpoint(step)) as tmp:
        model.save_pretrained(tmp / ADAPTER_DIR, **({} if weights is None else {"state_dict": weights}))
        optim = optimizer.state_dict() if optimizer_state is None else optimizer_state
        torch.save({"optimizer": _plain_lr(optim), "scheduler": _plain_lr(scheduler.state_dict())},
                   tmp / OPTIMIZER_STATE)
        (tmp / TRAINER_STATE).write_text(json.dumps({"step": step, **state}, indent=2))
        if rng is not None:
            rng_state.save(tmp, rng)
    for old in sorted(layout.checkpoints.glob("step-*"), key=_step_of)[:-KEEP_CHECKPOINTS]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _plain_lr(state: dict) -> dict:
    """Learning rates as numbers in a saved state: a captured step keeps its LR in a GPU tensor
    (jobs/train/graph_steps.py), and a checkpoint must resume into either kind of run."""
    for group in state.get("param_groups", []):
        if torch.is_tensor(group.get("lr")):
            group["lr"] = float(group["lr"])
    if "_last_lr" in state:
        state["_last_lr"] = [float(lr) if torch.is_tensor(lr) else lr for lr in state["_last_lr"]]
    return state


def _step_of(path: Path) -> int:
    try:
        return int(path.name.split("-", 1)[1])
    except (IndexError, ValueError):
        return -1


def latest_checkpoint(job_dir: Path) -> Path | None:
    found = sorted(JobLayout(job_dir).checkpoints.glob("step-*"), key=_step_of)
    return found[-1] if found else None


def load_checkpoint(folder: Path, model, optimizer, scheduler) -> dict:
    """Restore LoRA weights, optimizer and schedule; returns the saved trainer state."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    folder = Path(folder)
    weights = load_file(str(folder / ADAPTER_DIR / ADAPTER_WEIGHTS))
    optim = torch.load(folder / OPTIMIZER_STATE, map_location="cpu", weights_only=True)
    if sharding.is_sharded(model):   # each rank keeps its shard of the whole weights and state
        sharding.load_weights(model, weights)
        sharding.load_optimizer(model, optimizer, optim["optimizer"])
    else:
        set_peft_model_state_dict(model, weights)
        optimizer.load_state_dict(optim["optimizer"])
    scheduler.load_state_dict(optim["scheduler"])
    return json.loads((folder / TRAINER_STATE).read_text())


def save_adapter(job_dir: Path, model, tokenizer, card: str, best: bool = False,
                 base_model: str | None = None, weights: dict | None = None) -> Path:
    """The deliverable: adapter_model.safetensors + adapter_config.json + tokenizer + model card
    (in `adapter-best/` instead with best=True: the adapter of the lowest eval loss so far).
    `base_model` (the job's `model` as given) makes adapter_config.json name a loadable base."""
    layout = JobLayout(job_dir)
    out = layout.best_adapter if best else layout.adapter
    with staged_dir(out, out.with_name(f".{out.name}.partial")) as tmp:
        model.save_pretrained(tmp, safe_serialization=True, **({} if weights is None else {"state_dict": weights}))
        if base_model:
            from jobs.export.card import make_adapter_config_portable
            make_adapter_config_portable(tmp, base_model)
        tokenizer.save_pretrained(tmp)
        (tmp / MODEL_CARD).write_text(card, encoding="utf-8")
    return out


def promote_best_adapter(job_dir: Path) -> Path:
    """keep_best: make `adapter/` (what the user downloads, exports and chats with) a copy of
    `adapter-best/`, swapped in atomically; the last step's weights stay in the final checkpoint."""
    layout = JobLayout(job_dir)
    with staged_dir(layout.adapter, layout.partial_adapter) as tmp:
        shutil.copytree(layout.best_adapter, tmp, dirs_exist_ok=True)
    return layout.adapter
