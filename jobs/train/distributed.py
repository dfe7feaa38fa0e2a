"""Data parallelism for a training job: one process per GPU (or several gloo processes on CPU),
started by torchrun, the LoRA weights replicated and their gradients all-reduced by PyTorch's
DistributedDataParallel.

The trainer asks a `Distributed` (from `init()`) for everything that differs between one process
and many, so its loop reads the same either way (every method is a no-op with one process):

    dist = init()                       # from torchrun's RANK / WORLD_SIZE / LOCAL_RANK env
    dist.device, dist.is_main           # cuda:LOCAL_RANK (NCCL) or cpu (gloo); rank 0 writes files
    dist.shard(global_micro_batch)      # a contiguous part (BatchPlan deals whole steps: packing.deal)
    dist.all_reduce_sum(a, b)           # host numbers summed over ranks (gloo: no GPU sync)
    dist.all_reduce_(tensor)            # a device tensor summed in place, queued like a kernel
    dist.agree(flag)                    # True on every rank if it is True on any (stop requests)
    ddp = dist.wrap(model)              # DDP over the trainable parameters only
    with dist.accumulating(ddp, last):  # skip the all-reduce on all but the last micro-batch
    dist.finish()                       # at the end: barrier, then the group destroyed

Loss normalisation: every rank divides its summed token loss by the label-token count of the
WHOLE global batch (all-reduced before the forward), so the gradients must be summed over ranks,
not averaged as DDP does by default; `wrap` registers a summing comm hook for that. The result is
the same update as one process seeing the same global batch (HF Trainer's
`average_tokens_across_devices` reaches the same by multiplying the loss by the world size).
"""
from __future__ import annotations

import contextlib
import datetime
import os
from dataclasses import dataclass, field

import torch

from jobs.launch import launched_by_torchrun

# A rank waits this long in a collective (rank 0 saving a checkpoint, the first step's Triton
# autotuning on a slower GPU) before it gives up; a dead rank is noticed by torchrun long before.
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=30)
# how gloo reports a rank that vanished mid-collective (a plain RuntimeError, not a DistError)
PEER_LOST_WORDS = ("Connection reset by peer", "Connection closed by peer", "Broken pipe")


def lost_peer(exc: BaseException) -> bool:
    """Whether `exc` says another rank is gone (the failure is theirs, not this rank's)."""
    import torch.distributed as dist
    return isinstance(exc, getattr(dist, "DistError", ())) or any(w in str(exc) for w in PEER_LOST_WORDS)


def _local_device(local_rank: int) -> torch.device:
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        if local_rank >= count:
            raise RuntimeError(f"local rank {local_rank} has no GPU: {count} visible "
                               f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); "
                               "start one process per GPU")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


@dataclass
class Distributed:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    backend: str = ""
    # A gloo group for the loop's host-side numbers (token counts, stop requests, barriers): over
    # NCCL they would need a GPU tensor and a host sync, stalling the CPU that queues the next step.
    host_group: object = None
    sharded: bool = False   # FSDP2 instead of DDP (JobSpec `sharding`, jobs/train/sharding.py)

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def nodes(self) -> int:
        return max(1, self.world_size // max(1, self.local_world_size))

    def global_batch(self, spec) -> int:
        """Examples (packed: rows) an optimizer step over all processes, for a JobSpec."""
        return spec.batch_size * spec.gradient_accumulation_steps * self.world_size

    def describe(self, spec=None) -> str:
        """'2 processes on 1 node (nccl, DistributedDataParallel); global batch 8 = ...'."""
        where = f"{self.nodes} nodes" if self.nodes > 1 else "1 node"
        engine = "FSDP2, the model sharded" if self.sharded else "DistributedDataParallel"
        text = (f"{self.world_size} processes on {where} ({self.backend}, {engine})"
                if self.enabled else "1 process")
        if spec is None:
            return text
        return (f"{text}; global batch {self.global_batch(spec)} = batch_size {spec.batch_size} x accumulation "
                f"{spec.gradient_accumulation_steps} x {self.world_size} process(es)")

    # ---- data ------------------------------------------------------------------------------
    def shard(self, items: list) -> list:
        """This rank's part of a global micro-batch: contiguous, sizes differing by at most one,
        the same on every run. A full batch of batch_size x world_size gives each rank exactly
        batch_size items; a short last batch of an epoch may leave a rank with none."""
        start = self.rank * len(items) // self.world_size
        stop = (self.rank + 1) * len(items) // self.world_size
        return list(items[start:stop])

    # ---- collectives -------------------------------------------------------------------------
    def all_reduce_sum(self, *values: float) -> list[float]:
        """Host numbers summed over all ranks, in one collective on the host group (float64, so
        token counts stay exact); never waits for the GPU."""
        if not self.enabled:
            return [float(v) for v in values]
        import torch.distributed as dist
        tensor = torch.tensor([float(v) for v in values], dtype=torch.float64)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.host_group)
        return tensor.tolist()

    def weighted_mean(self, fields: dict, weight_key: str) -> dict:
        """Each rank's evaluation fields (means over its shard) -> the means over all shards,
        weighted by `weight_key` (summed); non-numeric fields are this rank's."""
        names = [k for k, v in fields.items() if k != weight_key and isinstance(v, (int, float))]
        weight = float(fields[weight_key])
        summed = self.all_reduce_sum(weight, *[fields[k] * weight if weight else 0.0 for k in names])
        total = summed[0]
        means = {k: (v / total if total else float("nan")) for k, v in zip(names, summed[1:])}
        return {**fields, **means, weight_key: int(total)}

    def all_reduce_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum a tensor on this rank's device over all ranks, in place, without a host sync (the
        collective is queued on the device like a kernel): for numbers that stay on the GPU."""
        if self.enabled:
            import torch.distributed as dist
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def agree(self, flag: bool) -> bool:
        """True on every rank when any rank passes True, so that all ranks take the same branch
        (stop now, or go on) and none is left waiting in a collective."""
        if not self.enabled:
            return bool(flag)
        return self.all_reduce_sum(1.0 if flag else 0.0)[0] > 0

    def gather_objects(self, obj) -> list:
        """`obj` of every rank, in rank order (on every rank)."""
        if not self.enabled:
            return [obj]
        import torch.distributed as dist
        out: list = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.host_group)
        return out

    def barrier(self) -> None:
        if self.enabled:
            import torch.distributed as dist
            dist.barrier(group=self.host_group)

    def finish(self) -> None:
        """The normal end of a run, on every rank: wait for all ranks (rank 0 may still be saving),
        collect what still holds the group (drop the DDP wrapper first: its reducer keeps the gloo
        group alive, whose worker threads then die in interpreter shutdown with SIGABRT, "terminate
        called without an active exception"; pytorch/pytorch#179291 describes the crash), then destroy it."""
        if self.enabled:
            import gc
            self.barrier()
            gc.collect()
        self.cleanup()

    def cleanup(self) -> None:
        import torch.distributed as dist
        if self.enabled and dist.is_initialized():
            dist.destroy_process_group()

    # ---- the model ---------------------------------------------------------------------------
    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """DDP over `model`'s trainable parameters (the LoRA weights); the frozen base and the
        buffers are neither broadcast nor reduced. One process: `model` itself.

        Wrap after the fused engine patched the model's instances: DDP's hooks sit on each
        parameter's gradient accumulator, which the fused LoRA autograd Functions feed like any op,
        also inside the nested backward of the engine's offloaded checkpointing (tested against
        one process in tests/jobs/train/test_distributed.py). Not `static_graph`: it breaks `no_sync`
        (reducer assert "expect_autograd_hooks_", torch 2.13)."""
        if not self.enabled:
            return model
        from torch.nn.parallel import DistributedDataParallel

        frozen = [name for name, p in model.named_parameters() if not p.requires_grad]
        buffers = [name for name, _ in model.named_buffers()]
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, frozen + buffers)
        # no buffer is synced: all are in the ignore list (rotary tables and the like are the same)
        ddp = DistributedDataParallel(model, device_ids=[self.local_rank] if self.device.type == "cuda" else None)
        ddp.register_comm_hook(None, _sum_gradients)
        return ddp

    def accumulating(self, model: torch.nn.Module, last: bool):
        """Context for one micro-batch's forward+backward: gradients are all-reduced only on the
        last micro-batch of an optimizer step (DDP's no_sync on the others; FSDP2 keeps the gathered
        gradients until then, as its docs advise for accumulation)."""
        if hasattr(model, "set_requires_gradient_sync"):   # FSDP2 (jobs/train/sharding.py)
            model.set_requires_gradient_sync(last)
            return contextlib.nullcontext()
        if self.enabled and not last and hasattr(model, "no_sync"):
            return model.no_sync()
        return contextlib.nullcontext()


def _sum_gradients(process_group, bucket):
    """DDP comm hook: all-reduce a gradient bucket as a SUM (DDP's default divides by the world
    size; our per-rank losses are already normalised by the global token count)."""
    import torch.distributed as dist

    work = dist.all_reduce(bucket.buffer(), group=process_group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def init() -> Distributed:
    """The process group of this rank (from torchrun's environment), or one process."""
    if not launched_by_torchrun():
        return Distributed(device=torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    device = _local_device(local_rank)
    if world == 1:
        return Distributed(device=device)
    import torch.distributed as dist
    backend = "nccl" if device.type == "cuda" else "gloo"
    if not dist.is_initialized():  # a Ray Train worker's group is set up by Ray (jobs/train/ray_worker.py)
        dist.init_process_group(backend, timeout=COLLECTIVE_TIMEOUT,
                                device_id=device if device.type == "cuda" else None)
    host_group = dist.new_group(backend="gloo", timeout=COLLECTIVE_TIMEOUT) if backend == "nccl" else None
    return Distributed(rank=rank, world_size=world, local_rank=local_rank, local_world_size=local_world,
                       device=device, backend=backend, host_group=host_group)


def rescale_micro_index(micro_index: int, units: int, batch_size: int, then: int, now: int) -> int:
    """A resume position saved by `then` processes for a run of `now`: the same epoch, and the same
    share of it done (rounded down, so no example of the epoch is skipped). `units`: examples (or
    packed rows) an epoch; `batch_size`: per process."""
    per_then, per_now = -(-units // (batch_size * then)), -(-units // (batch_size * now))
    if per_then == per_now:
        return micro_index
    epoch, index = divmod(micro_index, max(1, per_then))
    return epoch * per_now + index * per_now // max(1, per_then)


def resume_position(state: dict, plan, batch_size: int, world: int, log) -> int:
    """The micro_index to resume at from a checkpoint's trainer state: the same, or rescaled when
    the checkpoint was written by another number of processes (global micro-batches of another size)."""
    then = state.get("processes", 1)
    # examples (rows) a global micro-batch then and now: the same when batch_size x processes is
    # (two sharded ranks of 2 resumed on one process of 4: the same steps go on); older checkpoints lack it
    then_batch, now_batch = state.get("micro_batch", batch_size * then), batch_size * world
    if then_batch == now_batch:
        return state["micro_index"]
    units = len(plan.rows) if plan.packed else len(plan.examples)
    log(f"note: the checkpoint was written by {then} process(es), this run has {world}; continuing at the "
        "same point of the epoch")
    return rescale_micro_index(state["micro_index"], units, 1, then_batch, now_batch)
