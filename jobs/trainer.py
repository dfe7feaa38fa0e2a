"""The training loop a job runs: LoRA (or QLoRA) on answer tokens, AdamW with cosine warm-up,
gradient clipping, checkpoints, and an event for every step.

The loss of one optimizer step is normalised over the label tokens of the whole accumulated
batch (sum / count), as transformers' `num_items_in_batch` does, so gradient accumulation gives
the same update as one large batch (the fix described in Unsloth's and HF's 2024 write-ups on the
gradient accumulation bug)."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from jobs import checkpoints, encode, models, telemetry
from jobs.data import load_rows, to_conversations
from jobs.events import EventWriter
from jobs.export import model_card
from jobs.spec import JobSpec


class NonFiniteLoss(RuntimeError):
    pass


class Cancelled(RuntimeError):
    pass


@dataclass
class StepResult:
    loss: float
    grad_norm: float
    tokens: int


def cosine_with_warmup(warmup: int, total: int):
    """LR multiplier: linear warm-up, then cosine decay to 0 (the usual HF schedule)."""
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        progress = (step - warmup) / max(1, total - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return factor


class Trainer:
    def __init__(self, spec: JobSpec, job_dir: Path, events: EventWriter, data_dir: Path | None = None,
                 log=print):
        self.spec, self.job_dir, self.events, self.log = spec, Path(job_dir), events, log
        self.data_dir = data_dir
        self.stop_requested = False
        self.step = 0
        self.last_loss: float | None = None

    # ---- setup -------------------------------------------------------------------------
    def prepare(self) -> None:
        spec = self.spec
        torch.manual_seed(spec.seed)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if spec.load_in_4bit and self.device.type != "cuda":
            self.log("note: load_in_4bit on CPU uses bitsandbytes' CPU path; it is slow")
        self.source = models.resolve_model(spec.model, self.data_dir, log=self.log)
        self.tokenizer = models.load_tokenizer(self.source)
        if encode.ensure_chat_template(self.tokenizer):
            self.log("note: the tokenizer has no chat template; using ChatML")
        conversations = to_conversations(load_rows(spec), spec.dataset_format)
        self.examples = encode.encode_all(self.tokenizer, conversations, spec.max_seq_length, log=self.log)
        self.dtype = models.pick_dtype(spec, self.device)
        self.log(f"loading {self.source} on {self.device} as {self.dtype}"
                 + (" with 4-bit NF4 base weights" if spec.load_in_4bit else ""))
        base = models.load_base_model(self.source, self.dtype, self.device, spec.load_in_4bit)
        base.config.use_cache = False
        self.model = models.add_lora(base, spec)
        self.patch_report = self._accelerate()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=spec.learning_rate, weight_decay=spec.weight_decay)
        self.max_steps = self._total_steps()
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, cosine_with_warmup(spec.warmup_steps, self.max_steps))
        self.trainable = sum(p.numel() for p in self.params)
        self.micro_index = 0
        if spec.resume_from:
            self._resume(Path(spec.resume_from))

    def _accelerate(self) -> list[str]:
        """Fused kernels and activation checkpointing, with what happened written to the log."""
        lines: list[str] = []
        if self.spec.fused_kernels:
            from kernels import apply_checkpointing, patch_model
            report = patch_model(self.model, backend="auto", base_precision=self.spec.base_precision)
            tokens = self.spec.batch_size * self.spec.max_seq_length
            policy = apply_checkpointing(self.model, self.spec.gradient_checkpointing, batch_tokens=tokens)
            lines = report.lines() + ["  checkpointing: " + policy]
        else:
            lines.append("fused kernels: off (PyTorch path)")
            lines.append("  checkpointing: " + self._torch_checkpointing())
        for line in lines:
            self.log(line)
        return lines

    def _torch_checkpointing(self) -> str:
        mode = self.spec.gradient_checkpointing
        if mode == "auto":
            mode = "on" if self.device.type == "cuda" else "off"
        if mode == "off":
            return "off"
        self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        note = " (offload needs fused_kernels; using plain recompute)" if mode == "offload" else ""
        return "on: every decoder layer recomputed in backward" + note

    def _total_steps(self) -> int:
        if self.spec.max_steps > 0:
            return self.spec.max_steps
        per_epoch = math.ceil(len(self.examples) / (self.spec.batch_size * self.spec.gradient_accumulation_steps))
        return max(1, math.ceil(per_epoch * self.spec.num_epochs))

    def _resume(self, folder: Path) -> None:
        state = checkpoints.load_checkpoint(folder, self.model, self.optimizer, self.scheduler)
        self.step, self.micro_index = state["step"], state["micro_index"]
        self.log(f"resumed from {folder} at step {self.step}")

    # ---- the loop ----------------------------------------------------------------------
    def micro_batches(self):
        """Endless micro-batches, epoch after epoch, in a seeded order that a resume can replay."""
        size = self.spec.batch_size
        per_epoch = math.ceil(len(self.examples) / size)
        order_epoch, order = -1, []
        while True:
            epoch, index = divmod(self.micro_index, per_epoch)
            if epoch != order_epoch:  # shuffle once per epoch, not once per micro-batch
                order_epoch, order = epoch, list(encode.batches(self.examples, size, self.spec.seed, epoch))
            batch = order[index]
            self.micro_index += 1
            yield epoch + (index + 1) / per_epoch, encode.collate(batch, self.tokenizer.pad_token_id)

    def train_step(self, stream) -> tuple[StepResult, float]:
        group = [next(stream) for _ in range(self.spec.gradient_accumulation_steps)]
        count = max(1, sum(encode.label_count(b) for _, b in group))
        total, tokens = 0.0, 0
        self.model.train()
        for _, batch in group:
            batch = {k: v.to(self.device) for k, v in batch.items()}
            out = self.model(**batch, num_items_in_batch=count)
            out.loss.backward()
            total += float(out.loss.detach())
            tokens += int(batch["attention_mask"].sum())
        if not math.isfinite(total):
            raise NonFiniteLoss(f"the loss became {total} at step {self.step + 1}; lower learning_rate "
                                "(now {:g}) or use dtype fp32/bf16".format(self.spec.learning_rate))
        clip = self.spec.max_grad_norm if self.spec.max_grad_norm > 0 else float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, clip))
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return StepResult(total, grad_norm, tokens), group[-1][0]

    def run(self) -> Path:
        self.prepare()
        self.events.emit("start", model=self.spec.model, source=self.source, device=str(self.device),
                         dtype=str(self.dtype).removeprefix("torch."), max_steps=self.max_steps,
                         examples=len(self.examples), trainable_params=self.trainable,
                         patch_report=self.patch_report, resumed_at=self.step)
        stream = self.micro_batches()
        began, first_step = time.time(), self.step
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        while self.step < self.max_steps:
            if self.stop_requested:
                raise Cancelled(self._save_on_stop())
            tick = time.time()
            result, epoch = self.train_step(stream)
            self.step += 1
            self.last_loss = result.loss
            self._emit_step(result, epoch, time.time() - tick, began, first_step)
            if self.spec.save_steps and self.step % self.spec.save_steps == 0 and self.step < self.max_steps:
                self.save_checkpoint()
        adapter = self._save_adapter("finished")
        self.events.emit("done", step=self.step, final_loss=self.last_loss, adapter_dir=str(adapter),
                         elapsed_s=round(time.time() - began, 2))
        self.log(f"done: {self.step} steps, final loss {self.last_loss:.4f}, adapter in {adapter}")
        return adapter

    def _emit_step(self, result: StepResult, epoch: float, step_s: float, began: float, first: int) -> None:
        elapsed = time.time() - began
        per_step = elapsed / max(1, self.step - first)
        event = dict(step=self.step, max_steps=self.max_steps, epoch=round(epoch, 4), loss=result.loss,
                     lr=self.scheduler.get_last_lr()[0], grad_norm=result.grad_norm,
                     tokens_per_s=round(result.tokens / max(step_s, 1e-9), 1), elapsed_s=round(elapsed, 2),
                     eta_s=round(per_step * (self.max_steps - self.step), 1),
                     rss_gb=telemetry.process_rss_gb(), gpus=telemetry.gpu_snapshot(),
                     **telemetry.system_memory())
        if self.device.type == "cuda":
            event["peak_gb"] = round(torch.cuda.max_memory_allocated() / 1024 ** 3, 3)
        self.events.emit("step", **event)
        self.log(f"step {self.step}/{self.max_steps} loss {result.loss:.4f} lr {event['lr']:.2e} "
                 f"grad_norm {result.grad_norm:.3f} {event['tokens_per_s']:.0f} tok/s eta {event['eta_s']:.0f}s")

    def save_checkpoint(self) -> Path:
        folder = checkpoints.save_checkpoint(self.job_dir, self.step, self.model, self.optimizer,
                                             self.scheduler, {"micro_index": self.micro_index})
        self.events.emit("checkpoint", step=self.step, path=str(folder))
        return folder

    def _save_adapter(self, status: str) -> Path:
        card = model_card(self.spec, self.source, self.last_loss, self.step, status)
        return checkpoints.save_adapter(self.job_dir, self.model, self.tokenizer, card)

    def _save_on_stop(self) -> str:
        self.save_checkpoint()
        adapter = self._save_adapter(f"cancelled at step {self.step}")
        return f"cancelled by the user at step {self.step}/{self.max_steps}; adapter saved to {adapter}"
