"""Which GPUs a job runs on: the machine's GPUs (read through NVML), the ones our running jobs
hold, and for a queued job either a placement or the reason it waits.

Everything but the readers and writers at the end (NVML, the jobs' config.yaml) is a pure function
of `GpuInfo` readings, so the queue's rules are tested with made-up machines. GPU numbers are NVML's (PCI bus order); jobs get them as
CUDA_VISIBLE_DEVICES with CUDA_DEVICE_ORDER=PCI_BUS_ID so CUDA numbers them the same way.

For the Train tab: `inventory(held)` -> one `GpuInfo(index, name, free_gb, total_gb, busy_by_jobs)`
per GPU (`Runner.gpu_inventory()` fills `busy_by_jobs` from the running jobs).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from jobs.messages import say
from jobs.spec import SpecError

# For a job without a predicted peak: memory another process may hold on a GPU that still counts
# as free (the driver's own context and a monitoring tool fit; a model being trained or served
# does not). A job with a prediction waits only for its need (`Demand`, `need_with_margin`).
IDLE_USED_GB = 2.0
# A job with a predicted peak waits for that much free memory plus 5 % and 0.5 GiB.
NEED_MARGIN, NEED_MARGIN_GB = 0.05, 0.5
PLACED_ENV = "FUSETUNE_GPUS_PLACED"  # set by whoever chose the job's GPUs, so the trainer keeps them


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    free_gb: float
    total_gb: float
    busy_by_jobs: tuple[str, ...] = ()

    @property
    def used_gb(self) -> float:
        return round(max(0.0, self.total_gb - self.free_gb), 3)

    def label(self) -> str:
        """'GPU 1 · NVIDIA H200 · 139.8 of 140.4 GiB free' (for checkboxes and messages)."""
        text = f"GPU {self.index} · {self.name} · {self.free_gb:.1f} of {self.total_gb:.1f} GiB free"
        return text + (f" · used by {', '.join(self.busy_by_jobs)}" if self.busy_by_jobs else "")


@dataclass(frozen=True)
class Placement:
    """Where a job runs: physical GPU numbers (empty on a machine without GPUs) and processes."""

    gpus: tuple[int, ...]
    processes: int
    unload_chat: bool = False  # the studio's chat models must be unloaded first to make room

    @property
    def gpus_key(self) -> str:
        """The JobSpec `gpus` value that names exactly these GPUs ("auto" on CPU)."""
        return ",".join(str(i) for i in self.gpus) if self.gpus else "auto"

    def env(self) -> dict[str, str]:
        env = {PLACED_ENV: "1"}
        if self.gpus:
            env.update(CUDA_VISIBLE_DEVICES=",".join(str(i) for i in self.gpus), CUDA_DEVICE_ORDER="PCI_BUS_ID")
        return env


@dataclass(frozen=True)
class Wait:
    """Why a queued job cannot start yet, and the GPUs it keeps from later jobs meanwhile; `need`
    and `gpu_reasons` are the parts `reason` was said from (`place_now` says its warning from them)."""

    reason: str
    claims: frozenset[int] = field(default_factory=frozenset)
    need: str | None = None   # what it waits for when any GPU would do ("a free GPU"); None: named GPUs
    gpu_reasons: str = ""


def read_gpus() -> list[GpuInfo]:
    """The GPUs this process may use (CUDA_VISIBLE_DEVICES respected), from NVML; [] without any."""
    from jobs.io.telemetry import gpu_snapshot
    return [GpuInfo(index=g["index"], name=g["name"], total_gb=g["mem_total_gb"],
                    free_gb=round(g["mem_total_gb"] - g["mem_used_gb"], 3)) for g in gpu_snapshot()]


def inventory(held: dict[int, list[str]] | None = None, machine: list[GpuInfo] | None = None) -> list[GpuInfo]:
    """Every GPU with the names of our jobs running on it (`held`: GPU -> job names)."""
    held = held or {}
    machine = read_gpus() if machine is None else machine
    return [GpuInfo(g.index, g.name, g.free_gb, g.total_gb, tuple(held.get(g.index, ()))) for g in machine]


def parse_gpus(key: str) -> list[int] | None:
    """"0,1" -> [0, 1]; None for auto / all (JobSpec has already normalised the text)."""
    if key in ("auto", "all", ""):
        return None
    return [int(part) for part in key.split(",")]


def check_request(key: str, processes: int, machine: list[GpuInfo]) -> None:
    """Refuse (SpecError naming the key) a request this machine can never satisfy."""
    present = [g.index for g in machine]
    listed = parse_gpus(key)
    if not machine:
        if listed is not None:
            raise SpecError("gpus", say("gpus_without_gpu", key=key))
        return
    have = ", ".join(str(i) for i in present)
    if listed is not None:
        missing = [i for i in listed if i not in present]
        if missing:
            raise SpecError("gpus", say("gpu_missing", index=missing[0], have=have))
    wanted = len(listed) if listed is not None else len(present) if key == "all" else processes or 1
    if processes and processes != wanted:
        raise SpecError("processes", say("processes_vs_gpus", processes=processes, wanted=wanted, key=key))
    if wanted > len(present):
        raise SpecError("processes", say("processes_over_gpus", wanted=wanted, count=len(present), have=have))


def need_with_margin(need_gb: float) -> float:
    """The free memory a job predicted to peak at `need_gb` waits for: the fit check over-predicts
    (jobs/models/fit.py), the margin covers another process growing meanwhile."""
    return need_gb * (1 + NEED_MARGIN) + NEED_MARGIN_GB


def waits_for_memory(reason: str) -> bool:
    """Whether a queued job's reason is GPU memory held by others (every such reason names GiB),
    which "Start anyway" overrides, rather than our own job on the GPU or the CPU queue."""
    return bool(re.search(r"\d Gi?B\b", reason or ""))   # GB: a reason stored before GiB was written


def budget_for_free(free_gb: float) -> float:
    """The largest memory budget (max_gpu_memory_gb, 0.1 GiB steps) whose job still starts on a
    GPU with `free_gb` free: the inverse of `need_with_margin` (the Train tab prefills it)."""
    return max(0.0, math.floor((free_gb - NEED_MARGIN_GB) / (1 + NEED_MARGIN) * 10) / 10)


@dataclass(frozen=True)
class Demand:
    """What one queued job asks of a GPU's memory: its predicted peak (None: unknown, so a whole
    GPU), the studio's own GiB per GPU (chat models, given back on request), whether the studio
    can give them back now, and the user's "Start anyway"."""

    need_gb: float | None = None
    ours: dict[int, float] = field(default_factory=dict)
    releasable: bool = True
    anyway: bool = False


def _memory_verdict(gpu: GpuInfo, demand: Demand, idle_gb: float) -> tuple[str | None, bool]:
    """(why this GPU's memory keeps the job out, or None; whether the chat models must unload)."""
    ours = min(demand.ours.get(gpu.index, 0.0), gpu.used_gb)
    strangers = round(gpu.used_gb - ours, 3)
    wanted = gpu.total_gb - idle_gb if demand.need_gb is None else need_with_margin(demand.need_gb)
    if demand.anyway or gpu.free_gb >= wanted:
        return None, bool(ours) and demand.anyway and gpu.free_gb < wanted and demand.releasable
    if gpu.free_gb + ours >= wanted:
        if demand.releasable:
            return None, True
        return say("gpu_chat_generating", index=gpu.index, held=ours), False
    if demand.need_gb is None:
        return say("gpu_used_by_others", index=gpu.index, used=strangers, total=gpu.total_gb), False
    if wanted > gpu.total_gb:
        return say("gpu_too_small", index=gpu.index, need=demand.need_gb, total=gpu.total_gb), False
    return say("gpu_short_chat" if ours else "gpu_short", index=gpu.index, need=demand.need_gb, free=gpu.free_gb,
               used=strangers, held=ours), False


def _why_busy(gpu: GpuInfo, held: dict[int, str], claimed: set[int], idle_gb: float,
              demand: Demand) -> tuple[str | None, bool]:
    """(why `gpu` cannot be given to a job now, or None; whether the chat models must unload)."""
    if gpu.index in held:
        return say("gpu_held_by_job", index=gpu.index, job=held[gpu.index]), False
    if gpu.index in claimed:
        return say("gpu_kept_for_queue", index=gpu.index), False
    return _memory_verdict(gpu, demand, idle_gb)


def place(key: str, processes: int, machine: list[GpuInfo], held: dict[int, str],
          claimed: set[int] | frozenset[int] = frozenset(), idle_gb: float = IDLE_USED_GB,
          demand: Demand | None = None) -> Placement | Wait:
    """Placement of a job asking for `key` GPUs ("auto": the first free ones, one per process;
    "all"; or a list) given `held` (GPU -> our job using it), GPUs `claimed` by jobs queued
    earlier and its memory `demand`; or Wait with the reason. Assumes `check_request` passed."""
    if not machine:
        return Placement((), max(1, processes))
    demand = demand or Demand()
    verdicts = {g.index: _why_busy(g, held, set(claimed), idle_gb, demand) for g in machine}
    busy = {index: reason for index, (reason, _) in verdicts.items()}
    listed = parse_gpus(key)
    if listed is not None or key == "all":
        wanted = listed if listed is not None else [g.index for g in machine]
        reasons = [busy[i] for i in wanted if busy[i]]
        if reasons:
            joined = "; ".join(reasons)
            return Wait(say("gpu_wait", gpu_reasons=joined), frozenset(wanted), gpu_reasons=joined)
        return Placement(tuple(wanted), len(wanted), any(verdicts[i][1] for i in wanted))
    count = processes or 1
    # GPUs that need no unloading first: a chat model stays loaded when another GPU has room
    free = sorted((g.index for g in machine if busy[g.index] is None), key=lambda i: (verdicts[i][1], i))
    if len(free) >= count:
        chosen = tuple(sorted(free[:count]))
        return Placement(chosen, count, any(verdicts[i][1] for i in chosen))
    reasons = [r for r in busy.values() if r]
    need = say("a_free_gpu") if count == 1 else say("free_gpus", count=count, free=len(free))
    joined = "; ".join(reasons)
    return Wait(say("gpu_wait_for", need=need, gpu_reasons=joined), frozenset(free), need=need, gpu_reasons=joined)


def place_now(key: str, processes: int, machine: list[GpuInfo],
              idle_gb: float = IDLE_USED_GB) -> tuple[Placement, str | None]:
    """Placement for a job started by hand (no queue to wait in): the free GPUs when there are
    enough, otherwise the ones asked for (or with the most free memory) and a warning."""
    decision = place(key, processes, machine, held={}, idle_gb=idle_gb)
    if isinstance(decision, Placement):
        return decision, None
    listed = parse_gpus(key)
    if listed is None and key == "all":
        listed = [g.index for g in machine]
    if listed is None:
        roomiest = sorted(machine, key=lambda g: (-g.free_gb, g.index))[: processes or 1]
        listed = sorted(g.index for g in roomiest)
    chosen = Placement(tuple(listed), len(listed))
    return chosen, _start_anyway_warning(decision, chosen)


def _start_anyway_warning(decision: Wait, chosen: Placement) -> str:
    """The wait reason turned into a warning: the same parts said by gpu_anyway(_for), so the
    studio translates it by its own template rather than an edited English sentence."""
    if decision.need is None:
        return say("gpu_anyway", gpus=chosen.gpus_key, gpu_reasons=decision.gpu_reasons)
    return say("gpu_anyway_for", gpus=chosen.gpus_key, need=decision.need, gpu_reasons=decision.gpu_reasons)


def global_batch(batch_size: int, accumulation: int, processes: int) -> int:
    """Examples per optimizer step over all processes (what the Train tab shows)."""
    return batch_size * accumulation * max(1, processes)


# ---- what the runner reads and writes ------------------------------------------------------------
def planned_processes(key: str, processes: int) -> int:
    """How many processes a job would run as on this machine now (1 where it cannot run here)."""
    machine = read_gpus()
    try:
        check_request(key, processes, machine)
    except SpecError:
        return 1
    return place_now(key, processes, machine)[0].processes


def record_placement(config: Path, placement: Placement) -> None:
    """Write the GPUs and processes a job got into its config.yaml (the config that ran), where
    the trainer reads them and any runner finds which GPUs the job holds."""
    from jobs.io.storage import write_private_text
    data = yaml.safe_load(Path(config).read_text(encoding="utf-8")) or {}
    data.update(gpus=placement.gpus_key, processes=placement.processes)
    write_private_text(config, yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=10_000))


def held_by_jobs(running: list) -> dict[int, str]:
    """GPU -> name of the running job (JobRecord) on it, from each job's recorded placement. A job
    with none (started before this queue existed, or being started by another runner this moment)
    is taken to hold every GPU."""
    from jobs.io.layout import JobLayout
    held: dict[int, str] = {}
    for record in running:
        try:
            placed = yaml.safe_load(JobLayout(record.job_dir).config.read_text(encoding="utf-8"))
            if placed.get("cluster"):  # trains on a Ray cluster: no GPU of this machine
                continue
            indices = parse_gpus(str(placed.get("gpus", "auto")))
        except (OSError, yaml.YAMLError, AttributeError, ValueError):
            indices = None
        for index in indices if indices is not None else [g.index for g in read_gpus()]:
            held[index] = record.name
    return held
