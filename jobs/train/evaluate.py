"""Evaluation data and the eval loss.

Held-out data is either `eval_fraction` of the training rows, split off with the job's seed before
anything trains (so the same rows are held out on a resume), or a separate `eval_dataset` file in
the same formats as the training data. The eval loss is token-weighted over the whole eval set:
sum of the per-token losses over every answer token / the number of answer tokens (the same
normalisation as training; a mean of per-batch means would over-weight short batches)."""
from __future__ import annotations

import dataclasses
import random

import torch

from jobs.data import encode
from jobs.data.dataset import DataError, load_rows, to_conversations
from jobs.data.packing import BatchPlan
from jobs.messages import say
from jobs.spec import JobSpec
from jobs.train import sharding


def split_holdout(examples: list, fraction: float, seed: int) -> tuple[list, list]:
    """(train, eval): a seeded `fraction` of the examples held out (at least 1, never all)."""
    if fraction <= 0:
        return examples, []
    if len(examples) < 2:
        raise DataError(say("eval_fraction_too_few", fraction=fraction, count=len(examples)))
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    n_eval = min(len(examples) - 1, max(1, round(fraction * len(examples))))
    held = set(order[:n_eval])
    if hasattr(examples, "subset"):   # a lazy store (jobs/data/cache.py): views, the same split
        return (examples.subset([i for i in range(len(examples)) if i not in held]),
                examples.subset([i for i in range(len(examples)) if i in held]))
    return ([e for i, e in enumerate(examples) if i not in held],
            [e for i, e in enumerate(examples) if i in held])


def load_eval_examples(spec: JobSpec, tokenizer, log=print) -> list:
    """Examples of the eval_dataset file (encoded like the training data)."""
    eval_spec = dataclasses.replace(spec, dataset=spec.eval_dataset)
    conversations = to_conversations(load_rows(eval_spec), spec.dataset_format)
    try:
        return encode.encode_all(tokenizer, conversations, spec.max_seq_length, log=log)
    except DataError as exc:
        raise DataError(say("in_eval_dataset", problem=exc)) from None


def eval_loss(model, plan: BatchPlan, device: torch.device) -> tuple[float, int]:
    """(token-weighted eval loss, answer tokens) over every batch of `plan`; one sync at the end."""
    was_training = model.training
    model.eval()
    total = torch.zeros((), dtype=torch.float32, device=device)
    tokens = 0
    with torch.no_grad():
        for batch in plan.all_batches():
            if batch.label_tokens == 0 and not sharding.is_sharded(model):
                continue   # sharded (FSDP), every rank runs every forward: each one gathers weights with the others
            count = torch.tensor(float(max(1, batch.label_tokens)))
            out = model(**batch.to(device), num_items_in_batch=count.to(device))
            total += out.loss.float() * count.to(device)
            tokens += batch.label_tokens
    if was_training:
        model.train()
    return (float(total) / tokens if tokens else float("nan")), tokens
