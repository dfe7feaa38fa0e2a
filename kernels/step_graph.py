"""One whole training step (forward, backward, optimizer) as one CUDA graph, for batches of one shape.

Why: on the H200 machine the host needs 210-320 ms to queue one Llama-3.1-8B FP8 step (4,000+
launches, each 10-70 us of Python and driver time; bench/host_profile.py) while the GPU needs
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
- no gradient accumulation, no activation offload (host copies), no dropout randomness.

The warm-up steps train the model for real on the first batch (they are steps of the run), and
their losses are kept (`warmup_losses`) so that a caller can report the true first-step loss.
"""
from __future__ import annotations

import torch


class StepGraph:
    """graph = StepGraph(model, optimizer, {"input_ids": x, "labels": x, ...}); loss = graph(batch)."""

    def __init__(self, model, optimizer, batch: dict, warmup_steps: int = 3):
        _check(model, optimizer, batch, warmup_steps)
        self.model, self.optimizer = model, optimizer
        self.inputs = {name: value.clone() if torch.is_tensor(value) else value for name, value in batch.items()}
        self.warmup_losses = self._warm_up(warmup_steps)
        self.graph = torch.cuda.CUDAGraph()
        optimizer.zero_grad(set_to_none=True)
        with torch.cuda.graph(self.graph):
            self.loss = self._step()

    def _step(self) -> torch.Tensor:
        loss = self.model(**self.inputs).loss
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    def _warm_up(self, steps: int) -> list[float]:
        """Eager steps on a side stream (the guide's recipe: kernels compile, cuBLAS and the
        allocator settle, the optimizer creates its state) before the capture."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        losses = []
        with torch.cuda.stream(side):
            for _ in range(steps):
                self.optimizer.zero_grad(set_to_none=True)
                losses.append(self._step())
        torch.cuda.current_stream().wait_stream(side)
        return [float(loss) for loss in losses]

    def __call__(self, batch: dict) -> torch.Tensor:
        """Copy `batch` into the captured buffers and replay; returns the (static) loss tensor."""
        for name, value in batch.items():
            static = self.inputs.get(name)
            if torch.is_tensor(value):
                if static is None or static.shape != value.shape or static.dtype != value.dtype:
                    raise ValueError(f"StepGraph: batch[{name!r}] is {tuple(value.shape)} {value.dtype}; the "
                                     f"captured step takes {None if static is None else tuple(static.shape)} "
                                     f"{None if static is None else static.dtype} (pad or pack to that shape)")
                static.copy_(value, non_blocking=True)
            elif value != static:
                raise ValueError(f"StepGraph: batch[{name!r}] = {value!r} but the captured step baked in {static!r}")
        self.graph.replay()
        return self.loss


def _check(model, optimizer, batch: dict, warmup_steps: int) -> None:
    if warmup_steps < 1:
        raise ValueError("StepGraph needs at least one warm-up step before the capture")
    for group in optimizer.param_groups:
        if "capturable" in group and not group["capturable"]:
            raise ValueError(f"StepGraph: {type(optimizer).__name__} must be built with capturable=True "
                             "(its step count then lives on the GPU, where a replay can advance it)")
    device = next(model.parameters()).device
    if device.type != "cuda":
        raise ValueError(f"StepGraph needs the model on a CUDA GPU; it is on {device.type}")
    elsewhere = [name for name, value in batch.items() if torch.is_tensor(value) and value.device != device]
    if elsewhere:
        raise ValueError(f"StepGraph: batch tensors {elsewhere} are not on {device}")
