"""Supervised fine-tuning: next-token cross-entropy on the answer tokens of chat examples.

The loss of a micro-batch is the sum over its answer tokens / the answer tokens of the whole global
batch (transformers' `num_items_in_batch`), which the model computes itself: with fused kernels
through the fused linear cross-entropy that never holds the logits (kernels/loss_patch.py)."""
from __future__ import annotations

import torch

from jobs.data.cache import tokenized_examples
from jobs.data.packing import BatchPlan, example_lengths, resolve_packing
from jobs.train import evaluate
from jobs.train.methods.base import Method
from jobs.train.methods.vision_sft import VisionSupervisedFineTuning
from kernels.arch import text_config


class SupervisedFineTuning(Method):
    name = "sft"
    capturable = True

    def for_model(self, config) -> Method:
        from jobs.models import vision
        if vision.is_vision_config(config):   # images in the batches (methods/vision_sft.py)
            return VisionSupervisedFineTuning(self.trainer)
        return self

    def load_data(self) -> tuple[list, list]:
        t, spec = self.trainer, self.spec
        # a dataset file is tokenized once into the data dir's cache and read lazily from there
        examples = tokenized_examples(spec, t.tokenizer, t.data_dir, log=t.log, events=t.events,
                                      processes=t.dist.world_size, device_type=t.device.type)
        train, held = evaluate.split_holdout(examples, spec.eval_fraction, spec.seed)
        if spec.eval_dataset:
            held = evaluate.load_eval_examples(spec, t.tokenizer, log=t.log)
        return train, held

    def plan_batches(self):
        t, spec = self.trainer, self.spec
        config = t.model.config
        text = text_config(config)
        lengths = example_lengths(t.examples)
        t.packed, line = resolve_packing(spec.packing, t.device.type, lengths, spec.max_seq_length,
                                         getattr(text, "attn_logit_softcapping", None), spec.seed)
        t.log(line)
        if t.packed:
            from kernels.packed_attention import use_packed_attention
            t.log("  " + use_packed_attention(t.model))
        ranks = dict(rank=t.dist.rank, world=t.dist.world_size, pad_id=t.tokenizer.pad_token_id)
        size = spec.batch_size * t.dist.world_size   # global micro-batches, each rank builds its share
        # within max_gpu_memory_gb a micro-batch may train in passes of fewer rows (fit_passes.py); the
        # evaluation holds no activations for a backward and takes its micro-batches whole
        plan = BatchPlan(t.examples, size, spec.max_seq_length, t.packed, spec.seed,
                         accumulation=spec.gradient_accumulation_steps, pass_units=self.plan_pass_units(), **ranks)
        eval_plan = (BatchPlan(t.eval_examples, size, spec.max_seq_length, t.packed, spec.seed, shuffle=False,
                               **ranks) if t.eval_examples else None)
        if t.packed:
            t.log(f"  {len(t.examples)} examples packed into {len(plan.rows)} rows of {spec.max_seq_length} "
                  f"tokens ({sum(lengths) / (len(plan.rows) * spec.max_seq_length):.0%} full)")
        return plan, eval_plan

    def loss(self, model, batch: dict, count: torch.Tensor):
        return model(**batch, num_items_in_batch=count).loss, None

    def evaluate(self, model, plan, device) -> dict:
        loss, tokens = evaluate.eval_loss(model, plan, device)
        return {"eval_loss": loss, "eval_tokens": tokens}
