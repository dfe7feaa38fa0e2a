"""SFT on a vision-language model (jobs/models/vision.py): the same loss and loop as text SFT
(methods/sft.py, which hands a vision model's job to this class), on image-text examples (jobs/data/vision_dataset.py): each batch carries the
image patches (`pixel_values`, `image_grid_thw`) beside the token ids, and only answer tokens
have labels. The tokenizer the job saves with its adapter carries the image processor, so the
adapter folder holds preprocessor_config.json too.

Packing (`packing: on`, or `auto` where text packing would: jobs/data/packing.py resolve_packing)
puts several examples in a row, each with its own images and M-RoPE positions, attention kept
inside each example (jobs/data/vision_packing.py). Not yet: CUDA-graph capture (the image patches
vary in shape from batch to batch)."""
from __future__ import annotations

from jobs.data.packing import example_lengths, resolve_packing
from jobs.data.vision_dataset import vision_examples
from jobs.data.vision_encode import VisionBatchPlan
from jobs.data.vision_packing import PackedVisionBatchPlan
from jobs.models import vision
from jobs.train import evaluate
from jobs.train.methods.base import Method


class VisionSupervisedFineTuning(Method):
    """methods/sft.py's loss and evaluation (sft.py hands a vision model's job to this class)."""
    name = "sft"
    capturable = False
    tower_params: list | None = None   # the tower's and projector's LoRA weights (after_backward)

    def load_data(self) -> tuple[list, list]:
        t, spec = self.trainer, self.spec
        self.image_processor = vision.load_image_processor(t.source)
        _, self.image_token_id = vision.image_token(t.tokenizer)
        t.tokenizer = vision.TokenizerWithImages(t.tokenizer, self.image_processor)
        args = (t.tokenizer, self.image_processor, self.image_token_id, t.data_dir, t.log)
        examples = vision_examples(spec, "dataset", *args)
        train, held = evaluate.split_holdout(examples, spec.eval_fraction, spec.seed)
        if spec.eval_dataset:
            held = vision_examples(spec, "eval_dataset", *args)
        return train, held

    def plan_batches(self):
        t, spec = self.trainer, self.spec
        lengths = example_lengths(t.examples)
        t.packed, line = resolve_packing(spec.packing, t.device.type, lengths, spec.max_seq_length, None, spec.seed)
        t.log(line)
        ranks = dict(rank=t.dist.rank, world=t.dist.world_size)
        size = spec.batch_size * t.dist.world_size
        ids = (t.tokenizer.pad_token_id, self.image_token_id)
        if t.packed:
            return self._packed_plans(size, ids, ranks, lengths)
        plan = VisionBatchPlan(t.examples, size, spec.max_seq_length, spec.seed, *ids,
                               accumulation=spec.gradient_accumulation_steps, **ranks)
        eval_plan = (VisionBatchPlan(t.eval_examples, size, spec.max_seq_length, spec.seed, *ids, shuffle=False,
                                     **ranks) if t.eval_examples else None)
        return plan, eval_plan

    def _packed_plans(self, size: int, ids: tuple[int, int], ranks: dict, lengths: list[int]):
        """Packed rows for training and evaluation alike: while the language model runs
        "fusetune_packed" it reads documents from packed positions, not from a padding mask."""
        from kernels.packed_attention import use_packed_attention
        t, spec = self.trainer, self.spec
        t.log("  " + use_packed_attention(t.model))
        merge = getattr(self.image_processor, "merge_size", 2)
        plan = PackedVisionBatchPlan(t.examples, size, spec.max_seq_length, spec.seed, *ids, merge,
                                     accumulation=spec.gradient_accumulation_steps, **ranks)
        eval_plan = (PackedVisionBatchPlan(t.eval_examples, size, spec.max_seq_length, spec.seed, *ids, merge,
                                           shuffle=False, **ranks) if t.eval_examples else None)
        t.log(f"  {len(t.examples)} image-text examples packed into {len(plan.rows)} rows of "
              f"{spec.max_seq_length} tokens ({sum(lengths) / (len(plan.rows) * spec.max_seq_length):.0%} full)")
        return plan, eval_plan

    def loss(self, model, batch: dict, count):
        return model(**batch, num_items_in_batch=count).loss, None

    def evaluate(self, model, plan, device) -> dict:
        loss, tokens = evaluate.eval_loss(model, plan, device)
        return {"eval_loss": loss, "eval_tokens": tokens}

    def after_backward(self, micro_batches: list[dict]) -> None:
        """Sharded (jobs/train/sharding.py): when no rank's micro-batches held an image, FSDP2 has
        reduce-scattered zeros for the tower's LoRA where one process leaves its gradient None, which
        AdamW skips (no momentum step, no weight decay): drop them, so both train alike."""
        t = self.trainer
        if not t.sharded:
            return
        if self.tower_params is None:
            self.tower_params = [p for name, p in t.model.named_parameters()
                                 if p.requires_grad and vision.part_of(name) in ("vision", "projector")]
        images = any(batch.get("pixel_values") is not None for batch in micro_batches)
        if self.tower_params and not t.dist.agree(images):
            for param in self.tower_params:
                param.grad = None

    def before_training(self) -> None:
        """Which parts got LoRA, in the log and the kernel report (the job's start event)."""
        t = self.trainer
        line = vision.lora_report(t.model)
        t.log(line)
        t.patch_report.append("  " + line)
