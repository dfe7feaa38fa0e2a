"""GRPO's policy step in the memory plan: the tokens one policy pass holds (jobs/models/fit.py sizes its
activations by them, as JobSpec.batch_tokens sizes any other step).

A pass trains `part` consecutive completions of the micro-batch's batch_size x num_generations. Each
completion brings up to max_completion_length tokens and its prompt, which the pass holds:
- once per completion when prompts are repeated (padded rows, or packing that cannot share them);
- once per group when packed rows hold a prompt and then its completions
  (jobs/train/methods/grpo_data.py rollout_tensors_packed_shared: Prefix Grouper's shared prefix,
  arXiv 2506.05433), which packing does on the GPU unless attention logits are soft-capped.
For Llama-3.2-1B with 8 prompts x 8 completions of 512 + 256 tokens that is 20,480 tokens against
49,152 repeated: the plan then recomputes fewer layers and splits the step into fewer passes.

The prompt length is max_seq_length before the data is read (Start, --dry-run) and the dataset's
longest encoded prompt in the job (jobs/train/methods/grpo.py fit_sizes), which is never longer.
The pass is expressed as a JobSpec view (batch_size 1, `part` completions, and as max_seq_length the
prompt tokens a completion brings on average), so every part of the plan reads it unchanged."""
from __future__ import annotations

import dataclasses

from kernels.arch import text_config


def packs_on_gpu(packing: str, model_config) -> str | None:
    """Why GRPO's policy passes do not pack on the GPU, or None when they do: `packing` off, or auto on
    a model that soft-caps attention logits (the varlen kernel cannot). grpo.py grpo_packing follows it."""
    if packing == "off":
        return "off"
    if packing == "auto" and getattr(text_config(model_config), "attn_logit_softcapping", None):
        return "auto -> off: this model soft-caps attention logits (set packing: on to pack)"
    return None


def prompts_in_pass(prompts: int, generations: int, part: int) -> int:
    """The most groups a pass of `part` consecutive completions touches: passes start at multiples of
    `part` over prompts x generations completions, so one may straddle two groups' edges."""
    total, most = prompts * generations, 0
    for start in range(0, total, max(part, 1)):
        last = min(start + part, total) - 1
        most = max(most, last // generations - start // generations + 1)
    return most


def policy_view(spec, part: int, prompt_len: int | None = None, once: bool = False):
    """The spec as one policy pass of `part` completions sizes memory (module doc)."""
    prompt = min(prompt_len or spec.max_seq_length, spec.max_seq_length)
    if once:
        held = prompts_in_pass(spec.batch_size, spec.num_generations, part) * prompt
        prompt = -(-held // part)   # the pass's prompt tokens, shared out over its completions
    return dataclasses.replace(spec, batch_size=1, num_generations=part, max_seq_length=max(prompt, 1))


def resolve_once(spec, model_config, once: bool | None) -> bool:
    """`once` as the job decided it, else what a GPU job will decide: packed passes share prompts."""
    return packs_on_gpu(spec.packing, model_config) is None if once is None else once
