"""What the queue tests share: a short job's spec on the tiny model, and one GPU as NVML would report it."""
from jobs.io.gpus import GpuInfo
from jobs.spec import JobSpec


def small_spec(model, **kw):
    """Six steps, no checkpoints, 64-token rows: a job of a few seconds on CPU."""
    return JobSpec.from_dict({"model": str(model), "max_steps": 6, "learning_rate": 5e-3,
                              "save_steps": 0, "max_seq_length": 64, **kw})


def gpu(index=0, used=0.0, total=140.4):
    """An H200 with `used` GiB taken."""
    return GpuInfo(index, "NVIDIA H200", free_gb=round(total - used, 3), total_gb=total)
