"""One whole training step (forward, backward, optimizer) as one CUDA graph, for batches of one shape.

Why: on the H200 machine the host needs 210-320 ms to queue one Llama-3.1-8B FP8 step (4,000+
launches, each 10-70 us of Python and driver time; bench/host_profile.py, in git history) while the GPU needs
~170 ms, so the GPU waits on Python (issue 11). A replayed graph costs one launch: the step runs at
the GPU's pace whatever the host. This is the "whole network capture" of PyTorch's CUDA-graph
guide (https://pytorch.org/docs/stable/notes/cuda.html#whole-network-capture): warm-up steps on a
side stream, `zero_grad(set_to_none=True)`, then forward, backward and `optimizer.step()` captured
together; every replay reads the static input buffers, writes the gradients into the same static
`.grad` tensors (so gradients are not accumulated across replays) and updates the weights in place.

What the step must satisfy (checked where it can be, else capture fails with CUDA's error):
- every batch has the shapes, dtypes and keyword arguments of the one captured (the caller pads
  or packs to a fixed size); host-side values passed as arguments (e.g. `max_length_q`) are baked in;
- no host sync inside the step: attention through `kernels.packed_attention` with `cu_seq_lens_q/k`
  given (transformers' own mask code otherwise probes `position_ids` with a host-side `.all()`);
  the fused loss divides by a device-side token count;
- an optimizer that keeps its step count on the GPU (`capturable=True` for Adam/AdamW);
- gradients start from nothing in every step (`zero_grad(set_to_none=True)` inside it; micro-batches
  of one step may accumulate, steps may not), no activation offload (host copies), no dropout
  randomness.

`StepGraph(step, inputs)` takes the step as a function of a flat dict of inputs (tensors, and host
values that are baked in) returning device tensors; `language_model_step(model, optimizer)` is the
plain one (jobs/train/loop.py builds its own: accumulation, clipping). The warm-up steps train the
model for real on the first inputs (they are steps of the run), and their outputs are kept
(`warmup_outputs`) so that a caller can report them.
"""
from __future__ import annotations

import torch

from kernels.host_embedding import hosted


_WARMUP_STREAMS: dict[int, torch.cuda.Stream] = {}


def warmup_stream(device=None) -> torch.cuda.Stream:
    """The one side stream per device on which every capture of this process warms up.

    A fresh `torch.cuda.Stream()` for each capture leaks: PyTorch keeps a cuBLAS workspace per
    (handle, stream) for the life of the process (32 MiB on Hopper), and it hands out the next of
    32 pooled streams on each call. GRPO captures a decode step per rollout, so a job's allocated
    memory grew 32 MiB a step up to 1 GiB (bench/grpo_memory.py's trace on the H200, 2026-12-05:
    the survivor of a traced step was the first forward of the warm-up on the new stream)."""
    index = None if device is None else torch.device(device).index
    if index is None:   # no device, or "cuda" without an index: the current one
        index = torch.cuda.current_device()
    if index not in _WARMUP_STREAMS:
        _WARMUP_STREAMS[index] = torch.cuda.Stream(index)
    return _WARMUP_STREAMS[index]


class StepGraph:
    """graph = StepGraph(step, inputs); outputs = graph(inputs) (the same static tensors every time)."""

    def __init__(self, step, inputs: dict, warmup_steps: int = 1, capture: bool = True):
        """capture=False stops after the warm-up: a caller that must keep the warm-up's results
        whatever the capture does calls `capture()` itself."""
        if warmup_steps < 1:
            raise ValueError("StepGraph needs at least one warm-up step before the capture")
        _check_inputs(inputs)
        self.step, self.graph = step, None
        self.inputs = {name: value.clone() if torch.is_tensor(value) else value for name, value in inputs.items()}
        self.warmup_outputs = self._warm_up(warmup_steps)
        if capture:
            self.capture()

    def capture(self) -> None:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.outputs = self.step(self.inputs)
        self.graph = graph

    def _warm_up(self, steps: int) -> list:
        """Eager steps on a side stream (the guide's recipe: kernels compile, cuBLAS and the
        allocator settle, the optimizer creates its state) before the capture."""
        side = warmup_stream()
        side.wait_stream(torch.cuda.current_stream())
        outputs = []
        with torch.cuda.stream(side):
            for _ in range(steps):
                outputs.append(self.step(self.inputs))
        torch.cuda.current_stream().wait_stream(side)
        side.synchronize()
        torch.cuda.empty_cache()   # the warm-up's freed blocks belong to the side stream: give them back
        return outputs

    def __call__(self, inputs: dict):
        """Copy `inputs` into the captured buffers and replay; returns the captured outputs."""
        if self.graph is None:
            raise RuntimeError("StepGraph: nothing captured yet (call capture())")
        for name, value in inputs.items():
            static = self.inputs.get(name)
            if torch.is_tensor(value):
                if static is None or static.shape != value.shape or static.dtype != value.dtype:
                    raise ValueError(f"StepGraph: input {name!r} is {tuple(value.shape)} {value.dtype}; the "
                                     f"captured step takes {None if static is None else tuple(static.shape)} "
                                     f"{None if static is None else static.dtype} (pad or pack to that shape)")
                static.copy_(value, non_blocking=True)
            elif value != static:
                raise ValueError(f"StepGraph: input {name!r} = {value!r} but the captured step baked in {static!r}")
        self.graph.replay()
        return self.outputs


def capturable_reason(model, optimizer) -> str | None:
    """Why a step of `model` with `optimizer` cannot be captured, or None."""
    for group in optimizer.param_groups:
        if "capturable" in group and not group["capturable"]:
            return (f"{type(optimizer).__name__} must be built with capturable=True (its step count then "
                    "lives on the GPU, where a replay can advance it)")
    if hosted(model):
        return "the input embedding table is in CPU memory (to fit the budget): a step gathers its rows on the host"
    device = next(model.parameters()).device
    if device.type != "cuda":
        return f"a CUDA graph needs the model on a CUDA GPU; it is on {device.type}"
    return None


def language_model_step(model, optimizer):
    """The plain step: loss of model(**inputs), backward, optimizer step; returns the loss."""
    reason = capturable_reason(model, optimizer)
    if reason:
        raise ValueError(f"StepGraph: {reason}")

    def step(inputs: dict) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)   # the first backward assigns .grad: replays overwrite it
        loss = model(**inputs).loss
        loss.backward()
        optimizer.step()
        return loss.detach()
    return step


def _check_inputs(inputs: dict) -> None:
    devices = {value.device for value in inputs.values() if torch.is_tensor(value)}
    if any(device.type != "cuda" for device in devices):
        raise ValueError(f"StepGraph: every input tensor must be on a CUDA GPU; got {sorted(map(str, devices))}")
