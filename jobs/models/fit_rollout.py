"""GRPO's sampling phase in the memory plan: what one sampled completion holds on the GPU, and how
many completions a sampling pass may take within a budget (jobs/models/fit.py imports this).

Sampling (jobs/train/decode.py) runs before the policy step, with no activation of it alive, so a
GRPO job peaks at the larger of the two phases. A pass over R completions holds, beyond the
weights and the adapter's state:
- the static KV cache: R x (P + L) slots of K and V in every layer (P: the longest prompt, padded
  to it, at most max_seq_length; L: max_completion_length) - for long completions this is most of
  it: Llama-3.1-8B, 64 completions of 512 + 2,048 tokens, 20 GiB of KV cache beside 15 GiB of
  weights (the 8B row of bench/results/grpo.jsonl, 2026-12-03, peaked at 37.9 GiB in its policy step;
  its prompts were ~100 tokens, so sampling all 64 at once held about 33 GiB);
- the prefill's transient over R x P tokens: one layer's gate, up and their product (3 I) and the
  residual stream, norm, attention output and MLP output (4 h); a pass of whole groups prefills each
  prompt once for its group (decode.py), R / G prompts;
- the sampler's [R, vocab] tensors in fp32: logits, probabilities, the sorted copy and top-p's
  int64 order (16 B a vocabulary entry).
Within a budget the rows of a step are sampled in passes of at most `rows_within` completions, so
`max_gpu_memory_gb` also holds while sampling; each pass costs a graph capture and reads the
weights once per token, so fewer, larger passes are faster."""
from __future__ import annotations

GIB = 1024 ** 3
SAMPLER_BYTES_PER_VOCAB = 16   # fp32 logits + probabilities + sorted copy, int64 order (top-p)


def kv_bytes(shape, prompt_len: int, completion_len: int, b: int) -> int:
    """One completion's static KV cache: K and V of every layer over prompt + completion slots."""
    return shape.layers * 2 * shape.kv * (prompt_len + completion_len) * b


def row_bytes(shape, prompt_len: int, completion_len: int, b: int, group: int = 1) -> int:
    """GPU bytes one completion holds during a sampling pass (module doc); `shape` is fit._Shape.
    `group`: completions that share one prefilled prompt (decode.py prefills a run of equal prompts
    once and copies its K/V), so each carries 1/group of the prefill's transient."""
    prefill = prompt_len * (3 * shape.inter + 4 * shape.hidden) * b // max(1, group)
    return kv_bytes(shape, prompt_len, completion_len, b) + prefill + shape.vocab * SAMPLER_BYTES_PER_VOCAB


def parts(shape, rows: int, prompt_len: int, completion_len: int, b: int, group: int = 1) -> dict[str, int]:
    """A pass's bytes by part, for the estimate's breakdown."""
    kv_cache = rows * kv_bytes(shape, prompt_len, completion_len, b)
    return {"sampling KV cache": kv_cache,
            "sampling prefill + logits": rows * row_bytes(shape, prompt_len, completion_len, b, group) - kv_cache}


def shared_group(rows: int, generations: int) -> int:
    """How many completions share a prefill in a pass of `rows` (rollout.py: passes of whole groups)."""
    return generations if generations > 1 and rows % generations == 0 else 1


def rows_within(total_rows: int, free_bytes: int, per_row: int) -> int:
    """The most completions a pass may hold in `free_bytes` (at least 1: the job then reports the
    overrun through the estimate; it never refuses to sample); all of them when they fit."""
    if per_row <= 0:
        return total_rows
    return max(1, min(total_rows, free_bytes // per_row))


def passes_line(total_rows: int, rows: int, budget_gb: float, per_row: int) -> str:
    """train.log's line when sampling is split."""
    passes = -(-total_rows // rows)
    return (f"grpo sampling: {total_rows} completions in {passes} passes of up to {rows}, to stay within "
            f"max_gpu_memory_gb {budget_gb:g} ({per_row / GIB:.2f} GiB a completion: KV cache, prefill, logits)")
