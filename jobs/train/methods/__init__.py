"""Training methods beside the shared loop (jobs/train/loop.py): each one a loss, the batches it
reads and the metrics it logs, named by JobSpec's `method` key. The loop owns everything else
(optimizer, schedule, accumulation, clipping, data parallel, checkpoints, events)."""
from __future__ import annotations

from jobs.train.methods.base import Method
from jobs.train.methods.preference import DPO, KTO, ORPO, SimPO
from jobs.train.methods.sft import SupervisedFineTuning

METHODS: dict[str, type[Method]] = {"sft": SupervisedFineTuning, "dpo": DPO, "orpo": ORPO, "simpo": SimPO,
                                     "kto": KTO}


def method_for(name: str) -> type[Method]:
    """The Method class for a JobSpec's `method` (validated there, so a miss is a programming error)."""
    return METHODS[name]
