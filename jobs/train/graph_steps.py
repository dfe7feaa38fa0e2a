"""A job's optimizer steps replayed from one CUDA graph, where the job allows it.

On a fast GPU the host can take longer to queue a step than the GPU takes to run it (thousands of
launches, each some microseconds of Python: bench/NOTES.md, issue 11), and the GPU then idles in
every step. `kernels/step_graph.py` captures the whole step once and replays it; this module fits
that to the trainer's step: the micro-batches of one optimizer step (gradient accumulation), the
label count that normalises the loss, gradient clipping, AdamW.

A captured step needs inputs of one shape: packed rows (jobs/data/packing.py `BatchPlan.fix_shapes`:
every micro-batch the same number of rows, `cu_seq_lens` padded with empty documents to a fixed
length, `max_length` the row length); an optimizer whose step count and learning rate live on the
GPU (`capturable=True`, the LR a tensor the scheduler fills in place); one process (the gradient
all-reduce is not captured), no activation offload, no QLoRA (not measured yet). Where any of this
does not hold the job runs eagerly and the log says why; where the capture itself fails, the step
it was taken on has already run (the warm-up), the log says why, and the job goes on eagerly.

Off unless FUSETUNE_CUDA_GRAPH=1. Measured through `python -m jobs.train` on the H200
(bench/results/job.jsonl): captured and eager jobs give the same losses step by step, but packed
jobs of 2-4 rows of 4,096 tokens were GPU-bound already (100 % utilisation) and the captured step
was slower (1B bf16 74,352 vs 87,975 real tokens/s; 8B FP8 21,158 vs 24,391): its fixed shapes
make the varlen attention run over padded document lists and the longest possible document. It
pays where the host is the bottleneck (the 8B FP8 benchmark step, docs/fp8.md).
"""
from __future__ import annotations

import os

import torch

SWITCH = "FUSETUNE_CUDA_GRAPH"   # "1": capture where the job allows it (off by default, see below)
# the job log's line once its step is captured: bench_job and the studio's FP8 help read it back
CAPTURED_LINE = "cuda graph: the training step was captured; every later step replays it"


def graph_off_reason(spec, device: torch.device, packed: bool, world: int, recomputes: bool) -> str | None:
    """Why this job's steps are not captured, or None when they will be."""
    if device.type != "cuda":
        return f"the job runs on {device.type}"
    if not spec.fused_kernels:
        return "fused_kernels is off"
    if world > 1:
        return "several processes (their gradient all-reduce is not captured)"
    if not packed:
        return "packing is off (padded batches change shape from step to step)"
    if spec.load_in_4bit:
        return "QLoRA steps are not captured yet"
    if recomputes:
        return "activation checkpointing is on (only steps without recompute are captured)"
    if os.environ.get(SWITCH) != "1":
        return (f"not switched on: {SWITCH}=1 captures it; on packed jobs the eager step already kept "
                "the H200 busy and the captured one ran 8-14 % slower (bench/NOTES.md)")
    return None


def make_capturable(optimizer, device: torch.device) -> None:
    """AdamW with its step counts and learning rate on the GPU (also after a resume, which loads
    whatever the checkpoint had): a replay then advances the count and reads the LR the scheduler
    wrote in place."""
    for group in optimizer.param_groups:
        group["capturable"] = True
        lr = group["lr"]
        group["lr"] = lr if torch.is_tensor(lr) else torch.tensor(float(lr), dtype=torch.float32, device=device)
        for param in group["params"]:
            state = optimizer.state.get(param, {})
            if "step" in state:
                state["step"] = torch.as_tensor(state["step"], dtype=torch.float32).to(device)


class GraphedSteps:
    """step(batches, count) -> (loss sum, grad norm) on the device: the first call runs the step for
    real (the capture's warm-up) and captures it; later calls replay."""

    def __init__(self, device_step, optimizer, log):
        self.device_step, self.optimizer, self.log = device_step, optimizer, log
        self.graph = None
        self.failed = False

    def _function(self, micro_batches: int):
        def step(inputs: dict):
            self.optimizer.zero_grad(set_to_none=True)   # the first backward assigns .grad; replays overwrite it
            kwargs = [{key.split("/", 1)[1]: value for key, value in inputs.items() if key.startswith(f"{i}/")}
                      for i in range(micro_batches)]
            return self.device_step(kwargs, inputs["count"])
        return step

    @staticmethod
    def inputs(batches, count: torch.Tensor, device: torch.device | None) -> dict:
        """One flat dict of a step's inputs: `i/name` for micro-batch i, and the label count."""
        flat = {"count": count}
        for i, batch in enumerate(batches):
            flat.update({f"{i}/{k}": v for k, v in (batch.to(device) if device else {**batch.tensors, **batch.ints}).items()})
        return flat

    def step(self, batches, count: torch.Tensor, device: torch.device):
        from kernels.step_graph import StepGraph
        if self.graph is not None:
            return self.graph(self.inputs(batches, count, None))
        graph = StepGraph(self._function(len(batches)), self.inputs(batches, count, device), capture=False)
        try:   # the warm-up above was this step, for real: whatever the capture does, it counts
            graph.capture()
        except RuntimeError as exc:
            self.failed = True
            self.log(f"cuda graph: capture failed ({str(exc)[:300]}); eager steps from here")
        else:
            self.graph = graph
            self.log(CAPTURED_LINE)
        return graph.warmup_outputs[0]


def _recomputes(model) -> bool:
    """Whether any decoder layer recomputes its activations in backward (kernels/checkpoint.py)."""
    from kernels.checkpoint import decoder_layers
    return any(getattr(layer, "gradient_checkpointing", False) for layer in decoder_layers(model))


def graphed_steps(trainer) -> GraphedSteps | None:
    """The trainer's captured steps where its job allows them, with the decision in its log and
    kernel report (after the optimizer exists and any resume has loaded it)."""
    spec = trainer.spec
    recomputes = spec.fused_kernels and _recomputes(trainer.model)
    reason = graph_off_reason(spec, trainer.device, trainer.packed, trainer.dist.world_size, recomputes)
    line = "  cuda graph: " + (f"off ({reason})" if reason else "on (the step is captured once and replayed)")
    trainer.log(line)
    trainer.patch_report.append(line)
    if reason:
        return None
    trainer.plan.fix_shapes()
    make_capturable(trainer.optimizer, trainer.device)
    return GraphedSteps(trainer._device_step, trainer.optimizer, trainer.log)
