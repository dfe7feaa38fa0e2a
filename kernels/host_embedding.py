"""The frozen input embedding table kept in pinned CPU memory: a memory budget's last resort.

A LoRA job never trains the input embedding table, and a step reads only the rows of its own
tokens: a few thousand of a 152K x 3584 table on Qwen2.5-VL-7B (1.02 GiB in bf16). When no
checkpointing plan fits the job's `max_gpu_memory_gb` (jobs/models/fit.py), the table moves to
pinned host memory and each forward gathers its rows there and copies them to the GPU (about
29 MiB for 4,096 tokens, one host read of the token ids a forward). Unsloth offers the same trade
for its RL and vision models (`offload_embedding=True` in `FastLanguageModel.from_pretrained`);
the idea is theirs, this code is ours.

Not for a table tied to the LM head (the head reads all of it every step), a trained table
(`modules_to_save`), or generation (GRPO samples token by token: one host round trip a token).
Patches the module instance (its `forward`), never library code; `restore_input_embeddings` undoes
it. A CUDA-graph step cannot hold the host gather (kernels/step_graph.py refuses it, saying so).
"""
from __future__ import annotations

import types
import weakref

import torch
import torch.nn.functional as F

from kernels.arch import base_model

HOSTED_ATTR = "_fusetune_hosted_device"   # set on the embedding module: the device its rows go to


def input_embeddings(model) -> torch.nn.Module | None:
    getter = getattr(base_model(model), "get_input_embeddings", None)
    return getter() if getter is not None else None


def hostable_reason(model) -> str | None:
    """Why `model`'s input embedding table cannot move to host memory, or None when it can."""
    table = input_embeddings(model)
    if not isinstance(table, torch.nn.Embedding) or type(table).forward is not torch.nn.Embedding.forward:
        return f"the input embeddings are a {type(table).__name__}, not a plain nn.Embedding"
    if table.weight.requires_grad:
        return "the input embedding table is trained (modules_to_save)"
    getter = getattr(base_model(model), "get_output_embeddings", None)
    head = getter() if getter is not None else None
    if head is not None and getattr(head, "weight", None) is not None \
            and head.weight.data_ptr() == table.weight.data_ptr():
        return "the input embeddings are tied to the LM head, which reads the whole table every step"
    if table.weight.device.type != "cuda":
        return f"the table is on {table.weight.device.type}, not a CUDA GPU"
    return None


# Gather a forward's rows straight into one pinned staging buffer kept on the module, instead of a
# fresh tensor then a pinned copy of it: the fresh 64 MiB (8B, 8,192 tokens) cost its page faults and
# the pinning a second host copy, 16-21 ms a step with the GPU idle (bench/results/
# profile_job_sft_8b_s60.json, idle_gaps_host). False: the old path (bench switch `hostcopy`).
STAGED_GATHER = True
_STAGE_ATTR, _COPIED_ATTR = "_fusetune_stage", "_fusetune_stage_copied"


def _staging_rows(self, count: int, device: torch.device) -> torch.Tensor:
    """`count` rows of the staging buffer, free to overwrite: the last copy out of it has finished."""
    width, stage = self.weight.shape[1], getattr(self, _STAGE_ATTR, None)
    if stage is None or stage.numel() < count * width:
        stage = torch.empty(count * width, dtype=self.weight.dtype, pin_memory=device.type == "cuda")
        setattr(self, _STAGE_ATTR, stage)
    copied = getattr(self, _COPIED_ATTR, None)
    if copied is not None:
        copied.synchronize()   # long done in a training step; guards the buffer all the same
    return stage[:count * width].view(count, width)


# The training loop names the host copy of the token ids it sends to the GPU (remember_host_ids), so the
# forward gathers from it instead of reading the device's copy back: that read waits for every kernel
# queued before it (the previous step's backward and optimizer), leaving the GPU idle while the host
# gathers. False: always read the ids back (bench switch `hostsync`).
HOST_IDS = True
_HOST_IDS_ATTR = "_fusetune_host_ids"


def remember_host_ids(model, pairs) -> None:
    """`pairs`: (token ids on the device, the same ids on the host) of the micro-batches a step is about
    to run. A hosted table's forward that receives one of those device tensors (the same object) gathers
    from its host copy; any other ids (a slice, a method's own batch) are read back as before."""
    table = input_embeddings(model)
    if not HOST_IDS or table is None or not hasattr(table, HOSTED_ATTR):
        return
    known = [(ref, host) for ref, host in getattr(table, _HOST_IDS_ATTR, ()) if ref() is not None]
    known += [(weakref.ref(device_ids), host_ids) for device_ids, host_ids in pairs
              if device_ids is not None and host_ids is not None and device_ids is not host_ids]
    setattr(table, _HOST_IDS_ATTR, known)


def _ids_on_host(self, input_ids: torch.Tensor) -> torch.Tensor:
    for ref, host in getattr(self, _HOST_IDS_ATTR, ()):
        if ref() is input_ids:
            return host
    return input_ids.to("cpu")


def _hosted_forward(self, input_ids: torch.Tensor) -> torch.Tensor:
    """nn.Embedding.forward with the table on the host: gather the rows there, copy them in. The table
    is frozen, so padding_idx, scale_grad_by_freq and sparse (gradient options) change nothing."""
    device = getattr(self, HOSTED_ATTR)
    if not STAGED_GATHER or self.max_norm is not None:   # max_norm renormalises the table's rows in place
        rows = F.embedding(input_ids.to("cpu"), self.weight, self.padding_idx, self.max_norm,
                           self.norm_type, self.scale_grad_by_freq, self.sparse)
        if device.type == "cuda":
            rows = rows.pin_memory()   # lets the copy run asynchronously on the current stream
        return rows.to(device, non_blocking=True)
    ids = _ids_on_host(self, input_ids)
    staged = _staging_rows(self, ids.numel(), device)
    torch.index_select(self.weight, 0, ids.reshape(-1), out=staged)
    rows = staged.to(device, non_blocking=True, copy=True)   # copy: on a CPU "device" too, never the buffer
    if device.type == "cuda":
        copied = torch.cuda.Event()
        copied.record()
        setattr(self, _COPIED_ATTR, copied)
    return rows.view(*ids.shape, self.weight.shape[1])


def host_input_embeddings(model, device: torch.device | None = None) -> int:
    """Move the frozen table to (pinned) CPU memory and gather its rows there from now on; returns
    the bytes the table held on `device` (its own device by default). Callers check
    `hostable_reason` first; `device` other than CUDA is for tests on CPU-only machines."""
    table = input_embeddings(model)
    target = device if device is not None else table.weight.device
    host = table.weight.data.to("cpu", copy=True)
    table.weight.data = host.pin_memory() if target.type == "cuda" else host
    setattr(table, HOSTED_ATTR, target)
    table.forward = types.MethodType(_hosted_forward, table)
    if target.type == "cuda":
        torch.cuda.empty_cache()   # the table's old blocks go back to the card, not just the cache
    return table.weight.numel() * table.weight.element_size()


def hosted(model) -> bool:
    return hosted_bytes(model) > 0


def hosted_bytes(model) -> int:
    """What the hosted table would take on the GPU (0 when it is not hosted)."""
    table = input_embeddings(model)
    if table is None or not hasattr(table, HOSTED_ATTR):
        return 0
    return table.weight.numel() * table.weight.element_size()


def restore_input_embeddings(model) -> None:
    """The table back on its device and nn.Embedding's own forward (e.g. before generating)."""
    table = input_embeddings(model)
    if table is None or not hasattr(table, HOSTED_ATTR):
        return
    table.weight.data = table.weight.data.to(getattr(table, HOSTED_ATTR))
    del table.forward
    for attr in (HOSTED_ATTR, _STAGE_ATTR, _COPIED_ATTR, _HOST_IDS_ATTR):
        if hasattr(table, attr):
            delattr(table, attr)
