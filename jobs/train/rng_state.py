"""(jobs/train) The random state a resumed run needs to continue bit-exactly: Python's `random`,
NumPy's global generator, torch's CPU generator and the rank's CUDA generator.

LoRA dropout draws its masks from torch's generator; a checkpoint without that state resumes with
the generator where model loading left it, so every mask after the checkpoint differs from the
unbroken run (issue 23: loss off by 1e-2 at the first step after it). Saved per rank, in rank
order, because each rank of a data-parallel job draws its own masks (seeded seed + rank). This is
what Hugging Face's Trainer keeps in its `rng_state_<rank>.pth` files; here one file holds all."""
from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import numpy as np
import torch

RNG_FILE = "rng_state.pt"


def capture(device: torch.device) -> dict:
    """This process's generators, as plain tensors and lists (loadable with weights_only=True)."""
    version, internal, gauss = random.getstate()
    numpy_state = np.random.get_state(legacy=False)
    state = {
        "python": [version, list(internal), gauss],
        "numpy": {"key": torch.from_numpy(numpy_state["state"]["key"].astype(np.int64)),
                  "pos": int(numpy_state["state"]["pos"]), "has_gauss": int(numpy_state["has_gauss"]),
                  "gauss": float(numpy_state["gauss"])},
        "torch": torch.get_rng_state(),
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore(state: dict, device: torch.device) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    numpy = state["numpy"]
    np.random.set_state({"bit_generator": "MT19937",
                         "state": {"key": numpy["key"].numpy().astype(np.uint32), "pos": numpy["pos"]},
                         "has_gauss": numpy["has_gauss"], "gauss": numpy["gauss"]})
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def save(folder: Path, per_rank: list[dict]) -> None:
    torch.save(per_rank, Path(folder) / RNG_FILE)


def load(folder: Path) -> list[dict] | None:
    """Every rank's state from a checkpoint, or None for a checkpoint written before they were kept."""
    path = Path(folder) / RNG_FILE
    if not path.is_file():
        return None
    return torch.load(path, map_location="cpu", weights_only=True)


def resume(folder: Path, rank: int, world: int, device: torch.device, log) -> None:
    """Put this rank's generators where they were when the checkpoint was written; say so when
    that is not possible (an old checkpoint, or another number of processes)."""
    per_rank = load(folder)
    if per_rank is None:
        log("note: this checkpoint keeps no random state (written by an older Fusetune): with dropout, the "
            "steps after it draw other masks than the unbroken run did")
    elif len(per_rank) != world:
        log(f"note: the checkpoint's random state is for {len(per_rank)} process(es), this run has {world}: "
            "with dropout, the steps after it draw other masks than the unbroken run did")
    else:
        restore(per_rank[rank], device)


def data_order_digest(plan) -> str:
    """A short fingerprint of the first epoch's order and example lengths (jobs/packing.BatchPlan):
    a resume compares it, so that a checkpoint resumed on changed data says so instead of silently
    continuing at a position of another order."""
    order = {"batches": plan.epoch_batches(0), "lengths": list(plan.lengths)}
    return hashlib.sha256(json.dumps(order, separators=(",", ":")).encode()).hexdigest()[:16]


def check_data_order(state: dict, digest: str, world: int, log) -> None:
    saved = state.get("data_order")
    if saved and state.get("processes", 1) == world and saved != digest:
        log("note: the data order differs from the checkpoint's (the dataset, its rows, the seed, batch_size or "
            "packing changed): the steps after it do not see the examples the unbroken run saw")
