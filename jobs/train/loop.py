"""The one training loop every job runs: LoRA (or QLoRA), AdamW with cosine warm-up, gradient
clipping, evaluation, checkpoints, and an event for every step. The objective is a part beside it
(jobs/train/methods/: SFT, and the methods JobSpec's `method` names): its data, its batches, its
loss and the metrics it logs. What it saves and when (checkpoints, adapters, a cancel, the end) is
jobs/train/saving.py.

The loss of one optimizer step is normalised over the label tokens of the whole accumulated
batch (sum / count), as transformers' `num_items_in_batch` does, so gradient accumulation gives
the same update as one large batch (the fix described in Unsloth's and HF's 2024 write-ups on the
gradient accumulation bug).

Lean on the GPU (docs/training.md): batches are built ahead on a thread and copied from pinned
memory without blocking (jobs/train/loader.py); the loss is summed on the device and the step's loss and
gradient norm reach the host once, one step late (`PendingStep`), so the CPU queues step N+1 while the
GPU still runs step N and the step event never stalls the GPU; NVML/psutil are read by a 1 Hz
background sampler (jobs/io/telemetry.py). tokens_per_s counts real (non-pad) tokens."""
from __future__ import annotations

import math
import time
from collections import deque
from pathlib import Path

import torch

from jobs.data import encode
from jobs.io import phases, telemetry
from jobs.export.card import SMOOTHED_STEPS
from jobs.io.events import EventWriter
from jobs.models import load as models
from jobs.spec import JobSpec
from jobs.train import checkpoints, engine_setup, rng_state, saving, sharding
from jobs.train.distributed import Distributed, resume_position
from jobs.train.graph_steps import graphed_steps
from jobs.train.loader import Prefetcher
from jobs.train.methods import method_for
from jobs.train.methods.base import StepCancelled
from jobs.train.steps import PendingStep, cosine_with_warmup
from kernels import step_casts
from kernels.host_embedding import remember_host_ids


class NonFiniteLoss(RuntimeError):
    pass


class Cancelled(RuntimeError):
    pass


class OutOfMemory(torch.OutOfMemoryError):
    """A CUDA OOM with a message for people (estimate, peak seen, what to change)."""
    for_people = True


class Trainer:
    def __init__(self, spec: JobSpec, job_dir: Path, events: EventWriter, data_dir: Path | None = None,
                 log=print, dist: Distributed | None = None):
        self.spec, self.job_dir, self.events, self.log = spec, Path(job_dir), events, log
        self.dist = dist or Distributed(device=torch.device("cuda" if torch.cuda.is_available() else "cpu"))
        self.data_dir = data_dir
        self.stop_requested, self.step, self.sharded = False, 0, False   # sharded: FSDP2, set in prepare()
        self.micro_index = 0
        self.last_loss: float | None = None
        self.recent_losses: deque[float] = deque(maxlen=SMOOTHED_STEPS)   # the headline loss averages these
        self.last_eval_loss: float | None = None
        self.last_fields: dict = {}   # the last step's method numbers (reward_mean, ...), for the model card
        self.best_eval: tuple[float, int] | None = None   # (eval loss, step) of the best adapter
        self.fit_estimate = None
        self.method = method_for(spec.method)(self)

    # ---- setup -------------------------------------------------------------------------
    def prepare(self) -> None:
        spec = self.spec
        torch.manual_seed(spec.seed)
        self.device = self.dist.device
        if self.dist.is_main:  # the studio shows what happens before step 1 (jobs/io/phases.py)
            phases.install(lambda **fields: self.events.emit("phase", **fields))
        phases.report(phases.PREPARING)
        if spec.load_in_4bit and self.device.type != "cuda":
            self.log("note: load_in_4bit on CPU uses bitsandbytes' CPU path; it is slow")
        self.source = models.resolve_model(spec.model, self.data_dir, log=self.log)
        config = models.load_config(self.source)
        self.method = self.method.for_model(config)   # e.g. images (methods/vision_sft.py)
        self.sharded = sharding.decide(spec, config, self.dist, self.log)   # FSDP2 (jobs/train/sharding.py)
        self.tokenizer = models.load_tokenizer(self.source)
        if encode.ensure_chat_template(self.tokenizer):
            self.log("note: the tokenizer has no chat template; using ChatML")
        self._load_examples()
        self.dtype = models.pick_dtype(spec, self.device)
        self.log(f"loading {self.source} on {self.device} as {self.dtype}"
                 + (" with 4-bit NF4 base weights" if spec.load_in_4bit else ""))
        phases.report(phases.LOADING)
        base = models.load_base_model(self.source, self.dtype, sharding.load_device(self), spec.load_in_4bit,
                                         sharded=self.sharded)
        base.config.use_cache = False
        self.model = models.add_lora(base, spec)
        # counted once, here: the budget plan (engine_setup.py) and GRPO's policy passes (plan_batches)
        # size memory from it; the kernel patches swap frozen modules only, never a trainable one
        self.trainable = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        shard = [sharding.shard_model(self.model, self.dist, self.log)] if self.sharded else []
        self.patch_report = shard + engine_setup.accelerate(self)
        self.plan, self.eval_plan = self.method.plan_batches()
        self.data_order = rng_state.data_order_digest(self.plan)
        self.ddp = self.model if self.sharded else self.dist.wrap(self.model)  # the model itself with one process
        if self.dist.enabled:  # the same LoRA init everywhere (above), its own dropout masks per rank
            torch.manual_seed(spec.seed + self.dist.rank)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=spec.learning_rate, weight_decay=spec.weight_decay)
        self.max_steps = self._total_steps()
        self.lr_factor = cosine_with_warmup(spec.warmup_steps, self.max_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self.lr_factor)
        engine_setup.estimate_fit(self)
        if spec.resume_from:
            self._resume(Path(spec.resume_from))
        self.graphed = graphed_steps(self) if self.method.capturable and not self.sharded else None
        self.method.before_training()
        if spec.resume_from:  # last: nothing before the first step may draw from the restored generators
            rng_state.resume(Path(spec.resume_from), self.dist.rank, self.dist.world_size, self.device, self.log)

    def _load_examples(self) -> None:
        spec, (self.examples, self.eval_examples) = self.spec, self.method.load_data()
        if self.eval_examples:
            self.log(f"evaluation: {len(self.eval_examples)} examples held out"
                     + (f" ({spec.eval_fraction:g} of the data)" if spec.eval_fraction else f" from {spec.eval_dataset}"))

    def _total_steps(self) -> int:
        return self.spec.optimizer_steps(self.plan.per_epoch)

    def _resume(self, folder: Path) -> None:
        state = checkpoints.load_checkpoint(folder, self.model, self.optimizer, self.scheduler)
        self.step, self.micro_index = state["step"], state["micro_index"]
        self.micro_index = resume_position(state, self.plan, self.spec.batch_size, self.dist.world_size, self.log)
        rng_state.check_data_order(state, self.data_order, self.dist.world_size, self.log)
        if state.get("best_eval_loss") is not None:
            self.best_eval = (state["best_eval_loss"], state["best_step"])
        self.log(f"resumed from {folder} at step {self.step}")

    # ---- the loop ----------------------------------------------------------------------
    def train_step(self, stream) -> PendingStep | None:
        """One optimizer step, queued on the device; nothing here waits for the GPU (but the LM-head loss's
        one nonzero a micro-batch, which finds its labelled rows: kernels/ops/fused_linear_cross_entropy.py). None when a
        stop was requested (on any rank: all ranks stop at the same step).

        Several processes agree on the label and real tokens of the whole global batch and on the
        stop flag in ONE host all-reduce per step (gloo: no GPU sync), so every rank's loss has the
        same denominator; with one process that is a no-op. A method that samples each step (GRPO)
        agrees on the stop flag before sampling instead (one more host all-reduce), and trains a step
        once it has sampled it: a cancel neither waits for a rollout nobody uses (the runner's grace
        period is short next to a long rollout) nor logs completions of a step that never trained. With one
        process a stop during the rollout ends it there (StepCancelled): nothing of that step is kept."""
        group = [next(stream) for _ in range(self.spec.gradient_accumulation_steps)]
        rollout = self.method.samples_each_step
        if rollout and self.dist.all_reduce_sum(1.0 if self.stop_requested else 0.0)[0]:
            return None
        drawn = len(group)   # micro-batches of the data plan; GRPO may train one in several passes
        try:
            group = self.method.prepare_step(group)   # e.g. GRPO samples and scores here (methods/base.py)
        except StepCancelled:
            return None
        labels = sum(self.method.loss_units(b) for _, b in group)
        real = sum(b.real_tokens for _, b in group)
        labels, real, stop = self.dist.all_reduce_sum(labels, real, 1.0 if self.stop_requested else 0.0)
        if stop and not rollout:   # a stop during a rollout is honoured before the next one, above
            return None
        self.micro_index += drawn
        # filled on the device from a host number: no pinned block to allocate and no copy (a profiled
        # KTO 1B step spent up to 2.7 ms of GPU idle in this scalar's pin_memory, s65's profile_job)
        count = torch.full((), float(max(1.0, labels)), dtype=torch.float32, device=self.device)
        lr = self.scheduler.base_lrs[0] * self.lr_factor(self.scheduler.last_epoch)   # a host number: no sync
        batches = [batch for _, batch in group]
        replayed = self.graphed.step(batches, count, self.device) if self.graphed and not self.graphed.failed else None
        if replayed is None:
            moved = [batch.to(self.device) for batch in batches]
            remember_host_ids(self.model, [(m.get("input_ids"), b.tensors.get("input_ids"))   # a hosted table's gather
                                           for b, m in zip(batches, moved)])
            total, grad_norm = self._device_step(moved, count)
            self.optimizer.zero_grad(set_to_none=True)
        else:
            total, grad_norm = replayed
        self.scheduler.step()
        values = torch.cat([total, grad_norm.float().to(total.device).view(1)])
        done = None
        if self.device.type == "cuda":
            host = torch.empty(values.numel(), dtype=torch.float32, pin_memory=True)
            host.copy_(values, non_blocking=True)
            values, done = host, torch.cuda.Event(enable_timing=True)
            done.record()
        return PendingStep(values, done, int(real), group[-1][0], lr, units=max(1.0, labels))

    def _device_step(self, micro_batches: list[dict], count: torch.Tensor):
        """Forward and backward of each micro-batch, clipping and the optimizer step: device work
        only (no host sync), so jobs/train/graph_steps.py can capture it. Returns ([loss, *metric sums],
        grad norm): the method's metrics ride along with the loss in one tensor."""
        total = torch.zeros(1 + len(self.method.metric_names), dtype=torch.float32, device=self.device)
        if not self.model.training:   # a walk of every module (~1,300 on a 1B LoRA model): only when an
            self.model.train()        # evaluation or a rollout left it in eval mode (they switch it whole)
        with step_casts():   # the adapters' casts made once for the step's passes, dropped before the update
            for i, kwargs in enumerate(micro_batches):
                with self.dist.accumulating(self.ddp, last=i == len(micro_batches) - 1):
                    loss, metrics = self.method.loss(self.ddp, kwargs, count)
                    loss.backward()
                total[0] += loss.detach().float()
                if metrics is not None:
                    total[1:] += metrics.detach().float()
        self.method.after_backward(micro_batches)   # e.g. a sharded tower no rank ran (methods/vision_sft.py)
        self.dist.all_reduce_(total)  # the global batch's loss, queued on the device
        clip = self.spec.max_grad_norm if self.spec.max_grad_norm > 0 else float("inf")
        grad_norm = sharding.full_tensor(torch.nn.utils.clip_grad_norm_(self.params, clip))   # FSDP: a DTensor
        self.optimizer.step()
        return total, grad_norm

    def run(self) -> Path:
        self.prepare()
        spec = self.spec
        self.events.emit("start", model=self.spec.model, source=self.source, device=str(self.device),
                         dtype=str(self.dtype).removeprefix("torch."), max_steps=self.max_steps,
                         examples=len(self.examples), eval_examples=len(self.eval_examples),
                         packing=self.packed, trainable_params=self.trainable,
                         patch_report=self.patch_report, resumed_at=self.step,
                         processes=self.dist.world_size, nodes=self.dist.nodes, global_batch=self.dist.global_batch(spec),
                         memory_estimate=self.fit_estimate.as_dict() if self.fit_estimate else None)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        self.log(f"data parallel: {self.dist.describe(spec)}")
        self.sampler = telemetry.Sampler()
        stream = Prefetcher(self.plan, self.micro_index, pin=self.device.type == "cuda")
        try:
            self._loop(stream)
        except torch.OutOfMemoryError as exc:
            raise self._oom(exc) from exc
        finally:
            stream.close()
            self.sampler.close()
        return saving.finish(self)

    def _loop(self, stream) -> None:
        self.began, self.first_step, pending = time.time(), self.step, None
        self._restart_step_clock()
        while self.step < self.max_steps:
            queued = self.train_step(stream)
            if queued is None:
                self._flush(pending)
                raise Cancelled(saving.save_on_stop(self))
            self.step += 1
            self._flush(pending, step=self.step - 1)   # the previous step, while this one runs
            pending = queued
            if self._boundary() or self.device.type != "cuda":   # on CPU nothing runs ahead anyway
                self._flush(pending)
                pending = None
                self._after_step()
                self._restart_step_clock()   # evaluation and saving are not step time
        self._flush(pending)

    def _restart_step_clock(self) -> None:
        """The next step's step_s counts from now: the wall clock, and on a GPU a device-clock mark.
        Without the mark the first step's time was the wall clock up to its read, which comes a step
        late: for GRPO that took in the next step's sampling, tens of seconds."""
        self.last_done, self.last_event = time.time(), None
        if self.device.type == "cuda":
            self.last_event = torch.cuda.Event(enable_timing=True)
            self.last_event.record()

    def _boundary(self) -> bool:
        """Whether this step ends in a checkpoint or an evaluation (they need its numbers first)."""
        spec = self.spec
        saving = spec.save_steps and self.step % spec.save_steps == 0 and self.step < self.max_steps
        evaluating = self.eval_plan is not None and spec.eval_steps and self.step % spec.eval_steps == 0
        return bool(saving or evaluating or self.step == self.max_steps)

    def _after_step(self) -> None:
        spec = self.spec
        if self.eval_plan is not None and (spec.eval_steps and self.step % spec.eval_steps == 0
                                           or self.step == self.max_steps):
            self._evaluate()
        if spec.save_steps and self.step % spec.save_steps == 0 and self.step < self.max_steps:
            saving.save_checkpoint(self)

    def _flush(self, pending: PendingStep | None, step: int | None = None) -> None:
        """Read a finished step's numbers (waits for that step only) and report it."""
        if pending is None:
            return
        step = self.step if step is None else step
        loss, grad_norm, metrics = pending.read()
        now = time.time()
        step_s, self.last_done = now - self.last_done, now
        if pending.done is not None and self.last_event is not None:
            # the device's own clock: when the host is the slower side, the read of step N-1 can
            # come after step N has run, and wall-clock reads would split the two steps' time wrongly
            step_s = self.last_event.elapsed_time(pending.done) / 1000
        self.last_event = pending.done
        if not math.isfinite(loss):
            raise NonFiniteLoss(f"the loss became {loss} at step {step}; lower learning_rate "
                                "(now {:g}) or use dtype fp32/bf16".format(self.spec.learning_rate))
        self.last_loss, self.last_fields = loss, self.method.step_fields(metrics)
        self.recent_losses.append(loss)
        self._emit_step(step, loss, grad_norm, pending, step_s, self.last_fields)

    def _emit_step(self, step: int, loss: float, grad_norm: float, pending: PendingStep, step_s: float,
                   fields: dict) -> None:
        elapsed = time.time() - self.began
        per_step = elapsed / max(1, step - self.first_step)
        event = dict(step=step, max_steps=self.max_steps, epoch=round(pending.epoch, 4), loss=loss,
                     lr=pending.lr, grad_norm=grad_norm,
                     tokens_per_s=round(pending.tokens / max(step_s, 1e-9), 1), tokens=pending.tokens,
                     step_s=round(step_s, 4),   # the device's clock: events are written a step late
                     elapsed_s=round(elapsed, 2), eta_s=round(per_step * (self.max_steps - step), 1),
                     **fields, **self.sampler.latest())
        event["gpus"] = telemetry.job_gpus(self.dist, event.get("gpus", []))
        if self.device.type == "cuda":   # one read of the allocator's stats (max_memory_allocated is one too)
            stats = torch.cuda.memory_stats(self.device)
            event["peak_gb"] = round(stats.get("allocated_bytes.all.peak", 0) / 1024 ** 3, 3)
            # its cudaMalloc calls and flush-and-retries (each retry waits for the GPU): growth after warm-up
            # is host time a step pays (bench/bench_job.py lists them)
            event["cuda_mallocs"], event["alloc_retries"] = (stats.get("num_device_alloc", 0),
                                                             stats.get("num_alloc_retries", 0))
        self.events.emit("step", **event)
        self.log(f"step {step}/{self.max_steps} loss {loss:.4f} lr {event['lr']:.2e} "
                 f"grad_norm {grad_norm:.3f} {event['tokens_per_s']:.0f} tok/s eta {event['eta_s']:.0f}s")

    def _evaluate(self) -> None:
        fields = self.method.evaluate(self.model, self.eval_plan, self.device)
        if self.dist.enabled:  # each rank evaluated its shard: the count-weighted mean of all
            fields = self.dist.weighted_mean(fields, "eval_tokens")
        loss, tokens = fields["eval_loss"], fields["eval_tokens"]
        best = self.best_eval is None or loss < self.best_eval[0]
        self.events.emit("eval", step=self.step, **fields, best=best)
        self.last_eval_loss = loss
        self.log(f"eval at step {self.step}: loss {loss:.4f} over {tokens} answer tokens" + (" (best)" if best else ""))
        if best and math.isfinite(loss):
            self.best_eval = (loss, self.step)
            if self.spec.keep_best:
                saving.save_adapter(self, f"best eval loss {loss:.4f} at step {self.step}", best=True)

    def _oom(self, exc: torch.OutOfMemoryError) -> OutOfMemory:
        from jobs.models import fit
        peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0
        return OutOfMemory(fit.oom_message(self.spec, self.fit_estimate, peak, self.step + 1,
                                           self.checkpointing_line, str(exc)))
