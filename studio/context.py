"""What every tab shares: the data dir, the runner, the event cache, the chat engine, and the
page's language (the selector component every handler that writes text takes as an input, and
the registry of components whose text follows it)."""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobs.events import read_events
from jobs.layout import JobLayout
from jobs.spec import BUILTIN_MODEL
from studio.chat import ChatEngine
from studio.i18n import PageText
from studio.jobs_view import EventCache


@dataclass
class StudioContext:
    data_dir: Path
    runner: Any  # jobs.runner.Runner (duck-typed so tests can pass a fake)
    events: EventCache = field(default_factory=lambda: EventCache(read_events))
    chat: ChatEngine | None = None
    page: PageText = field(default_factory=PageText)
    lang: Any = None  # the page's language selector (a gr.Dropdown), set by build_studio

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir)
        if self.chat is None:
            self.chat = ChatEngine(self.data_dir)

    @functools.cached_property
    def _fused(self) -> tuple[bool, str]:
        from jobs.telemetry import fused_kernels_available
        return fused_kernels_available()

    def fused_kernels(self) -> tuple[bool, str]:
        """(available, reason), probed once: it imports torch and asks CUDA."""
        return self._fused

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
