"""GRPO's generation: `num_generations` completions per prompt from the current policy (LoRA on),
sampled in one batch (all prompts x generations, left-padded prompts), each stopping at EOS or
max_completion_length. Within a memory budget the rows go in passes of at most `rows_per_pass`
(jobs/models/fit.py rollout_rows), each with a KV cache of its own.

The sampler is jobs/train/decode.py: our decode loop over a static KV cache, one decode step
captured as a CUDA graph on the GPU (eager on CPU). Models it cannot run (sliding windows shorter
than the sequence, non-attention layers: `decode.unsupported_reason`) use transformers' `generate`
(`generate_completions`, also what bench/bench_grpo.py's generation mode compares against). The
model is put in eval mode for sampling (no dropout, the cache allowed under checkpointing) and back
after.

Under FSDP (`sharding: fsdp`, jobs/train/sharding.py) sampling runs through the sharded layers, whose
every forward all-gathers the layer's weights: a collective, so every rank must run the same number
of forwards or the job hangs. With `peers` (the job's Distributed) the ranks agree on the path (the
widest prompt decides decode or generate), stop decoding only when every rank's rows are done, and
`generate` runs with transformers' `synced_gpus`. That is TRL's way for FSDP (GRPOTrainer generates
through the wrapped model, the ranks kept in step by `synced_gpus`, which transformers turns on for
FSDP and ZeRO-3 models): no rank ever holds the whole model, which a model sharded because it does not
fit one GPU could not. The number of passes is the same on every rank (equal prompts per rank,
`rows_per_pass` agreed by the caller)."""
from __future__ import annotations

import torch

from jobs.train import decode
from kernels.arch import text_config


def pad_left(prompts: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p):] = 1
    return ids.to(device), mask.to(device)


def cut_at_eos(row: list[int], eos_ids: set[int]) -> list[int]:
    """The completion up to and including its first EOS (TRL's completion mask keeps the EOS)."""
    for i, token in enumerate(row):
        if token in eos_ids:
            return row[:i + 1]
    return row


def eos_ids_of(model, tokenizer) -> set[int]:
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids |= set(config_eos if isinstance(config_eos, (list, tuple)) else [config_eos] if config_eos is not None else [])
    return ids


@torch.no_grad()
def sample_completions(model, tokenizer, prompts: list[list[int]], num_generations: int, max_new_tokens: int,
                       temperature: float, top_p: float, device, log=None,
                       use_graph: bool | None = None, should_stop=None,
                       rows_per_pass: int | None = None, peers=None) -> list[list[int]] | None:
    """Completion token ids [len(prompts) * num_generations], prompt 0's group first; None when
    `should_stop()` turned true while sampling (decode.decode; transformers' generate cannot stop).
    `rows_per_pass`: at most this many completions share a KV cache at once (a memory budget,
    jobs/models/fit_rollout.py); the rest follow in further passes, in order. `peers`: the job's
    Distributed when the model is FSDP-sharded (module doc), else None."""
    repeated = [p for p in prompts for _ in range(num_generations)]
    step = rows_per_pass or len(repeated)
    group = num_generations if step % num_generations == 0 else 1   # passes of whole groups share a prefill
    out: list[list[int]] = []
    for start in range(0, len(repeated), step):
        part = _sample_pass(model, tokenizer, repeated[start:start + step], max_new_tokens, temperature, top_p,
                            device, log, use_graph, should_stop, peers, group)
        if part is None:
            return None
        out += part
    return out


def _sample_pass(model, tokenizer, rows: list[list[int]], max_new_tokens: int, temperature: float, top_p: float,
                 device, log, use_graph, should_stop, peers=None, group: int = 1) -> list[list[int]] | None:
    """One batch of prompt rows (already repeated per generation, runs of `group` equal rows) through
    the static decode loop."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids, mask = pad_left(rows, pad_id, device)
    width = ids.shape[1] if peers is None else max(peers.gather_objects(ids.shape[1]))
    reason = decode.unsupported_reason(text_config(model.config), width + max_new_tokens)
    if reason:
        decode.log_once(log, f"grpo sampling: transformers' generate ({reason})")
        return generate_completions(model, tokenizer, rows, 1, max_new_tokens, temperature, top_p, device,
                                    synced=peers is not None)
    all_done = None if peers is None else (lambda mine: not peers.agree(not mine))
    eos = eos_ids_of(model, tokenizer)
    was_training = model.training
    model.eval()
    try:
        out = decode.decode(model, ids, mask, max_new_tokens, temperature, top_p, eos, pad_id,
                            use_graph=use_graph, log=log, should_stop=should_stop, all_done=all_done, group=group)
    finally:
        model.train(was_training)
    return None if out is None else [cut_at_eos(row, eos) for row in out.tolist()]


@torch.no_grad()
def generate_completions(model, tokenizer, prompts: list[list[int]], num_generations: int, max_new_tokens: int,
                         temperature: float, top_p: float, device, synced: bool = False) -> list[list[int]]:
    """`sample_completions` through transformers' `generate` (the dynamic KV cache); `synced`: every
    rank runs forwards until all are done (`synced_gpus`, for an FSDP-sharded model: module doc)."""
    repeated = [p for p in prompts for _ in range(num_generations)]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids, mask = pad_left(repeated, pad_id, device)
    eos = eos_ids_of(model, tokenizer)
    was_training = model.training
    model.eval()
    try:
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=temperature,
                             top_p=top_p, top_k=0, max_new_tokens=max_new_tokens, use_cache=True,
                             pad_token_id=pad_id, eos_token_id=sorted(eos) or None,
                             synced_gpus=True if synced else None)
    finally:
        model.train(was_training)
    new = out[:, ids.shape[1]:].tolist()
    return [cut_at_eos(row, eos) for row in new]
