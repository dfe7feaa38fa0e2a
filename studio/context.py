"""What every tab shares: the data dir, the runner, the event cache, the chat engine, and the
page's language (the selector component every handler that writes text takes as an input, and
the registry of components whose text follows it)."""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from jobs.io.events import read_events
from jobs.io.layout import JobLayout
from jobs.queue.cluster_resources import CachedReader, DashboardReader
from jobs.spec import BUILTIN_MODEL
from studio.chat import ChatEngine
from studio.i18n import PageText
from studio.jobs_view import EventCache
from studio.shared_views import SharedViews
from studio.start_check import StartCheck

# Gradio checks a picked value against the choices the page's last answer for that picker set. Two
# refreshes of one finished-jobs picker (Export, Evaluate, Chat's adapter) running side by side, one
# read before a job ended and one after, could answer in the other order: the page then sends the new
# job against the older list and gets "Value ... is not in the list of choices" (seen once in CI at
# a page load). One concurrency group of limit 1 (the queue's default is 4) runs them one at a time, so
# the last answer is the newest reading.
PICKER_REFRESH: dict[str, Any] = {"concurrency_id": "finished-job-pickers", "concurrency_limit": 1}


@dataclass
class StudioContext:
    data_dir: Path
    runner: Any  # jobs.queue.runner.Runner (duck-typed so tests can pass a fake)
    events: EventCache = field(default_factory=lambda: EventCache(read_events))
    chat: ChatEngine | None = None
    page: PageText = field(default_factory=PageText)
    lang: Any = None  # the page's language selector (a gr.Dropdown), set by build_studio
    free_gpu_memory: Callable[[int], float | None] | None = None  # GiB free on a GPU (tests: a stand-in)
    shared: SharedViews = field(default_factory=SharedViews)  # what every page's poll shares
    cluster: str = ""  # the Ray cluster the Jobs tab shows first (app.py --cluster / FUSETUNE_CLUSTER)
    cluster_reader: Any = None  # reads a cluster's dashboard (jobs/queue/cluster_resources.py); tests: a stand-in

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir)
        if self.chat is None:
            self.chat = ChatEngine(self.data_dir)
        if self.cluster_reader is None:   # the queue's reader when there is one: one reading serves both
            queue = getattr(self.runner, "clusters", None)
            self.cluster_reader = getattr(queue, "reader", None) or CachedReader(DashboardReader())

    @functools.cached_property
    def _fused(self) -> tuple[bool, str]:
        from jobs.io.telemetry import fused_kernels_available
        return fused_kernels_available()

    def fused_kernels(self) -> tuple[bool, str]:
        """(available, reason), probed once: it imports torch and asks CUDA."""
        return self._fused

    @functools.cached_property
    def _fp8(self) -> tuple[bool, str]:
        import torch
        if not torch.cuda.is_available():
            return False, ("FP8 matrix products need a CUDA GPU of compute capability 8.9 or newer (Ada, "
                           "Hopper); this machine has none.")
        from kernels.ops.fp8_linear import fp8_gemm_supported   # the kernels' own check, on GPU 0
        available, reason = fp8_gemm_supported(torch.device("cuda", 0))
        if available and not self._fused[0]:
            return False, f"FP8 base weights run on the fused engine: {self._fused[1]}"
        return available, reason

    def fp8_base_weights(self) -> tuple[bool, str]:
        """(available, reason) of base_precision fp8 on this machine (a CUDA GPU of compute
        capability 8.9 or newer and the fused engine), probed once."""
        return self._fp8

    @functools.cached_property
    def start_check(self) -> StartCheck:
        """Start's preflight and the fit check, with the model files they keep between clicks."""
        return StartCheck(self.data_dir, free_memory=self.free_gpu_memory)

    def known_models(self) -> list[str]:
        """The built-in model first, then every other model an earlier job used."""
        models = [BUILTIN_MODEL]
        for record in self.runner.list_jobs():
            model = (record.spec or {}).get("model")
            if model and model not in models:
                models.append(model)
        return models

    def adapter_dir(self, job_id: str | None) -> str | None:
        """The adapter folder of a job, if it has one."""
        if not job_id:
            return None
        record = self.runner.get(job_id)
        if record is None:
            return None
        layout = JobLayout(record.job_dir)
        return str(layout.adapter) if layout.has_adapter() else None
