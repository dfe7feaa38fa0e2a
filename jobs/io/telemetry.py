"""Hardware readings for step events and the studio: NVML for GPUs, psutil for the process."""
from __future__ import annotations

import functools
import importlib.util
import os

import psutil

_GB = 1024 ** 3


@functools.lru_cache(maxsize=1)
def _nvml():
    """The initialised pynvml module, or None where there is no NVIDIA driver."""
    try:
        import pynvml
        pynvml.nvmlInit()
        return pynvml
    except (ImportError, OSError) as exc:  # no package or no driver library
        _nvml_reason.append(str(exc))
        return None
    except Exception as exc:  # pynvml.NVMLError subclasses Exception only
        _nvml_reason.append(str(exc))
        return None


_nvml_reason: list[str] = []


def gpu_snapshot() -> list[dict]:
    """One dict per visible GPU: index, name, util_pct, mem_used_gb, mem_total_gb. [] without GPUs."""
    nvml = _nvml()
    if nvml is None:
        return []
    out = []
    for index in visible_gpu_indices(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        mem = nvml.nvmlDeviceGetMemoryInfo(handle)
        util = nvml.nvmlDeviceGetUtilizationRates(handle)
        name = nvml.nvmlDeviceGetName(handle)
        out.append({
            "index": index,
            "name": name.decode() if isinstance(name, bytes) else name,
            "util_pct": float(util.gpu),
            "mem_used_gb": round(mem.used / _GB, 3),
            "mem_total_gb": round(mem.total / _GB, 3),
        })
    return out


def job_gpus(dist, local: list[dict] | None = None) -> list[dict]:
    """The GPUs of every rank of a job (`dist`: its jobs.train.distributed.Distributed), for step events;
    `local`: this machine's reading if one was just taken.

    On one machine that is this process's snapshot: the launcher gave all ranks the same
    CUDA_VISIBLE_DEVICES. Across machines each machine's first rank reads its own GPUs and rank 0
    gathers them, each tagged with its `host` (every rank must call this, as it is a collective)."""
    local = gpu_snapshot() if local is None else local
    if dist.nodes <= 1:
        return local
    import socket
    mine = [{**gpu, "host": socket.gethostname()} for gpu in local] if dist.local_rank == 0 else []
    return [gpu for per_rank in dist.gather_objects(mine) for gpu in per_rank]


def visible_gpu_indices(count: int) -> list[int]:
    """NVML indices of the GPUs this process may use (CUDA_VISIBLE_DEVICES, when numeric)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or visible.strip() == "":
        return list(range(count)) if visible is None else []
    picked = []
    for part in visible.split(","):
        part = part.strip()
        if part.isdigit() and int(part) < count:
            picked.append(int(part))
    return picked


def process_rss_gb(pid: int | None = None) -> float:
    return round(psutil.Process(pid or os.getpid()).memory_info().rss / _GB, 3)


def system_memory() -> dict:
    vm = psutil.virtual_memory()
    return {"ram_used_gb": round((vm.total - vm.available) / _GB, 3), "ram_total_gb": round(vm.total / _GB, 3),
            "cpu_pct": psutil.cpu_percent(interval=None)}


def fused_kernels_available() -> tuple[bool, str]:
    """Whether the Triton engine can run here, and if not, a sentence saying why."""
    if importlib.util.find_spec("triton") is None:
        return False, "Triton is not installed (pip install -r requirements.txt); training uses PyTorch."
    import torch
    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
        return False, (f"No CUDA GPU found (torch {torch.__version__}, {build}): the Triton kernels need an "
                       "NVIDIA GPU, so training runs on the PyTorch path.")
    major, minor = torch.cuda.get_device_capability(0)
    if major < 7:
        return False, f"GPU compute capability {major}.{minor} is below 7.0, which Triton needs."
    return True, f"Triton kernels available on {torch.cuda.get_device_name(0)}."


class Sampler:
    """Reads the GPUs (NVML) and this process (psutil) on a background thread at most once a
    second, so a step event reads the latest numbers instead of querying the driver in line.
    Also keeps the mean GPU utilisation over its samples (the benchmark reports it)."""

    def __init__(self, interval_s: float = 1.0):
        import threading
        self.interval_s = max(1.0, interval_s)   # NVML's utilisation window is up to 1 s anyway
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._latest: dict = self._read()
        self._util_sum, self._util_n = 0.0, 0
        self._thread = threading.Thread(target=self._run, name="fusetune-telemetry", daemon=True)
        self._thread.start()

    def _read(self) -> dict:
        return {"rss_gb": process_rss_gb(), "gpus": gpu_snapshot(), **system_memory()}

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            reading = self._read()
            with self._lock:
                self._latest = reading
                if reading["gpus"]:
                    self._util_sum += sum(g["util_pct"] for g in reading["gpus"]) / len(reading["gpus"])
                    self._util_n += 1

    def latest(self) -> dict:
        with self._lock:
            return dict(self._latest)

    def mean_gpu_util(self) -> float | None:
        with self._lock:
            return round(self._util_sum / self._util_n, 1) if self._util_n else None

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
