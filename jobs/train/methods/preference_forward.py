"""Sequence log-probs of a preference batch: one forward over both sequences of every unit, the
last hidden states of the label tokens through the LM head in the fused log-probs op
(kernels/ops/fused_linear_logprobs.py: never the N x V logits), summed per sequence.

The forward goes through the model the loop holds (the DDP wrapper when there are several
processes, so its gradient hooks run) without labels and with `logits_to_keep=1` (one position of
logits, not all); a forward hook on the decoder (`model.model` of the *ForCausalLM, as TRL's
`fused_lm_head` path reads it) takes its last hidden states. The reference policy is the same
model with the adapter switched off (jobs/models/adapter_switch.py: PEFT's per-layer switch, without
the model-wide status report `disable_adapter()` builds each time), under no_grad: no second model.
"""
from __future__ import annotations

import torch

from jobs.models.adapter_switch import reference_pass
from jobs.train.methods.logprobs import logprobs_op
from kernels.arch import text_config
from kernels.loss_patch import find_causal_lm
from kernels.ops.fused_linear_logprobs import sequence_logps

PREF_KEYS = ("pref_rows", "pref_targets", "pref_seq", "pref_units", "pref_label", "pref_valid", "kto_halves",
             "kto_rows")


def unwrap(model):
    """The PEFT model inside a DDP wrapper (or the model itself)."""
    return getattr(model, "module", model)


def _decoder_hidden(model, kwargs: dict) -> torch.Tensor:
    lm = find_causal_lm(unwrap(model))
    box: list[torch.Tensor] = []

    def keep(_module, _args, output):
        box.append(output[0] if isinstance(output, tuple) else output.last_hidden_state)

    handle = lm.model.register_forward_hook(keep)
    try:
        model(**kwargs, logits_to_keep=1, use_cache=False)
    finally:
        handle.remove()
    return box[0]


def sequence_sums(model, batch: dict, fused: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-prob sum [2P], answer tokens [2P]) of every sequence of the batch (2k: unit k's first,
    2k + 1: its second), differentiable through the adapter."""
    kwargs = {k: v for k, v in batch.items() if k not in PREF_KEYS and k != "labels"}
    hidden = _decoder_hidden(model, kwargs)
    lm = find_causal_lm(unwrap(model))
    head = lm.get_output_embeddings()
    text = text_config(lm.config)
    softcap = getattr(text, "final_logit_softcapping", None)
    # only the label rows reach the head (indices made with the batch on the host: no sync)
    flat, rows, targets = hidden.reshape(-1, hidden.shape[-1]), batch["pref_rows"], batch["pref_targets"]
    op, bias = logprobs_op(fused), getattr(head, "bias", None)
    riding = batch.get("kto_rows")
    cut = rows.numel() if riding is None else riding.labels
    token_logp = op(flat.index_select(0, rows[:cut]), head.weight, targets[:cut], bias, softcap)
    if rows.numel() > cut:   # KTO's KL completions (label rows after `labels`): no grad (kernels/checkpoint_rows.py)
        with torch.no_grad():
            riders = op(flat.index_select(0, rows[cut:]), head.weight, targets[cut:], bias, softcap)
        token_logp = torch.cat([token_logp, riders])
    return sequence_logps(token_logp, batch["pref_seq"], 2 * batch["pref_units"].numel())


def reference_sums(model, batch: dict, fused: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The same sums under the reference policy: the adapter off, no grad, eval-mode dropout."""
    peft = unwrap(model)
    with reference_pass(peft):
        return sequence_sums(peft, batch, fused)
