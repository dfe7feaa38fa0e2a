"""What the GPU and a loaded model say, for jobs/models/fit.py: the free memory, and the checkpointing
and embedding placement a loaded model actually has (its estimate then follows the model, not a plan)."""
from __future__ import annotations

import functools

from jobs.models import fit_vision

GIB = 1024 ** 3


def current_policy(model, spec=None, vision=None) -> tuple[int, bool, str, int]:
    """(recomputed layers, offloaded, description, bytes of the input embedding table in host memory)
    as set on a loaded model's decoder layers (and an image-text model's vision blocks, counted as
    _step_activations counts them)."""
    from kernels.checkpoint import _offload_checkpoint, decoder_layers
    from kernels.host_embedding import hosted_bytes
    layers = decoder_layers(model)
    flags = [bool(getattr(layer, "gradient_checkpointing", False)) for layer in layers]
    on = [layer for layer, flag in zip(layers, flags) if flag]
    offload = any(isinstance(getattr(layer, "_gradient_checkpointing_func", None), functools.partial)
                  and layer._gradient_checkpointing_func.func is _offload_checkpoint for layer in on)
    counted = fit_vision.recomputed_of_flags(spec, vision, flags) if vision is not None else len(on)
    hosted = hosted_bytes(model)
    description = f"{len(on)} of {len(layers)} layers recomputed" + (", inputs offloaded" if offload else "")
    return counted, offload, description + (", input embeddings in pinned CPU memory" if hosted else ""), hosted


def _cuda_memory() -> tuple[int | None, int | None]:
    import torch
    if not torch.cuda.is_available():
        return None, None
    free, total = torch.cuda.mem_get_info()
    return free, total


def free_gpu_memory(index: int = 0) -> float | None:
    """Free memory of NVML device `index` in GiB (None without an NVIDIA driver or such a GPU)."""
    from jobs.io.telemetry import _nvml
    nvml = _nvml()
    if nvml is None:
        return None
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        return nvml.nvmlDeviceGetMemoryInfo(handle).free / GIB
    except Exception:  # pynvml.NVMLError (invalid index, lost GPU) derives from Exception only
        return None
