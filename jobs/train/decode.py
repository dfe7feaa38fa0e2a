"""GRPO's sampler: a hand-written decode loop over a static KV cache, one token per step for the
whole batch, with every shape fixed so that one decode step can be replayed as a CUDA graph.

The shape of it is gpt-fast's generate.py (pytorch-labs/gpt-fast: prefill once, then
`decode_one_token` over a preallocated KV cache written with `index_copy_`, sampled without a host
sync) and transformers' static-cache + CUDA-graph guide (StaticCache: fixed [B, H, P + L, D] K/V
tensors so the step's addresses never move). Here:

- The prompts (left-padded to P) are prefilled once; the first token is sampled from that pass.
  GRPO samples `group` completions of each prompt (rows in runs of `group` identical prompts): the
  prefill then runs one row per prompt and copies its K/V to the group's other rows, so a prompt's
  forward is paid once, not `group` times (vLLM shares a prompt's KV blocks the same way with its
  prefix caching). On a CPU that was a fifth of a GRPO step at 4 completions.
- Each decode step feeds the last token at cache slot P + i, position len(prompt) + i, with a
  4-D additive mask [B, 1, 1, P + L] computed on the device from the step counter (a caller's 4-D
  mask is used as-is by transformers' `create_causal_mask` and by kernels/packed_attention.py, so
  the loop is right whichever attention the trainer has switched on). K/V go into our own layers of
  a transformers `Cache` (`SlotLayer`): they write where a device tensor says, so nothing in the
  step depends on a host int.
- Sampling is in the step: temperature, top-p (TRL/transformers' TopPLogitsWarper: the smallest
  set of tokens whose probability reaches top_p, at least one), then gpt-fast's
  `multinomial_sample_one_no_sync` (argmax of probs / Exp(1) noise: a draw from probs without
  torch.multinomial's host sync); temperature 0 is greedy (argmax), for tests. Rows that hit EOS
  get the pad token from then on; every `CHECK_EVERY` steps one host read asks whether all are done,
  and a caller's `should_stop()` whether the job was cancelled (then `decode` returns None).
- On CUDA the step is captured once per call (warm-up on a side stream, then torch.cuda.CUDAGraph)
  and replayed per token; the step counter, the next input and the output buffer advance inside the
  graph. Where capture fails (an op that syncs, a kernel that cannot be captured) the same step
  runs eagerly and the reason is logged once; on CPU it always runs eagerly.
The model is the PEFT model (LoRA on), in eval mode, under no_grad: the current policy."""
from __future__ import annotations

import inspect

import torch

from kernels import arch
from kernels.step_graph import warmup_stream

CHECK_EVERY = 8          # decode steps between host checks of "has every row hit EOS?"
WARMUP_STEPS = 2         # eager steps on a side stream before capture (allocator, lazy inits, autotune)
_logged: set[str] = set()


def log_once(log, line: str) -> None:
    if log is not None and line not in _logged:
        _logged.add(line)
        log(line)


def _slot_layer_class():
    from transformers.cache_utils import StaticLayer

    class SlotLayer(StaticLayer):
        """A static K/V layer that writes at `box["slots"]` (a device tensor) instead of its own
        running length, so the decode step's writes follow a counter the graph advances."""

        def __init__(self, max_cache_len: int, box: dict):
            super().__init__(max_cache_len=max_cache_len)
            self.box = box

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            self.keys.index_copy_(2, self.box["slots"], key_states)
            self.values.index_copy_(2, self.box["slots"], value_states)
            return self.keys, self.values

    return SlotLayer


def slot_cache(text_config, max_len: int, box: dict):
    from transformers.cache_utils import Cache

    layer = _slot_layer_class()
    return Cache(layers=[layer(max_len, box) for _ in range(text_config.num_hidden_layers)])


def unsupported_reason(text_config, total: int) -> str | None:
    """Why the static loop cannot run this model for sequences of `total` tokens (None: it can)."""
    window = getattr(text_config, "sliding_window", None)
    types = getattr(text_config, "layer_types", None) or []
    if window and total > window and (any(t != "full_attention" for t in types) or not types):
        return f"sliding-window attention ({window} tokens) shorter than prompt + completion ({total})"
    if any(t not in ("full_attention", "sliding_attention") for t in types):
        return f"layer types {sorted(set(types))} (not plain attention)"
    return None


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero the tail outside the smallest set whose probability reaches top_p (keep >= 1 token)."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    before = sorted_probs.cumsum(dim=-1) - sorted_probs        # mass of the tokens ranked above
    sorted_probs = sorted_probs.masked_fill(before >= top_p, 0.0)
    return torch.zeros_like(probs).scatter_(-1, order, sorted_probs)


def sample_next(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Next tokens [B] from last-position logits [B, V] (module doc); no host sync."""
    if temperature <= 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        probs = top_p_filter(probs, top_p)
    noise = torch.empty_like(probs).exponential_(1)
    return torch.argmax(probs / noise, dim=-1)


class StaticDecoder:
    """One batch's decode state on the device: the cache, the counters and the output buffer."""

    def __init__(self, model, ids: torch.Tensor, mask: torch.Tensor, max_new: int, temperature: float,
                 top_p: float, eos: list[int], pad_id: int, group: int = 1):
        from kernels.loss_patch import find_causal_lm

        self.model, self.temperature, self.top_p, self.pad_id = model, temperature, top_p, pad_id
        self.group = group if group > 1 and _runs_of_equal_rows(ids, mask, group) else 1
        decoder = find_causal_lm(model).model
        self.cache_name = "cache" if "cache" in inspect.signature(decoder.forward).parameters else "past_key_values"
        self.dtype = find_causal_lm(model).get_input_embeddings().weight.dtype
        B, P = ids.shape
        self.P, self.L, device = P, max_new, ids.device
        self.box: dict = {}
        config = find_causal_lm(model).config
        text = arch.text_config(config)
        self.cache = slot_cache(text, P + max_new, self.box)
        self.valid = torch.zeros((B, P + max_new), dtype=torch.bool, device=device)
        self.valid[:, :P] = mask.bool()
        self.columns = torch.arange(P + max_new, device=device)
        self.eos = torch.tensor(sorted(eos) or [-1], dtype=torch.long, device=device)
        self.prompt_ids, self.prompt_positions = ids, (mask.cumsum(1) - 1).clamp(min=0)
        self.out = torch.full((B, max_new), pad_id, dtype=torch.long, device=device)
        self.step = torch.zeros(1, dtype=torch.long, device=device)      # decode steps done
        self.token = torch.zeros((B, 1), dtype=torch.long, device=device)
        self.position = torch.zeros((B, 1), dtype=torch.long, device=device)
        self.done = torch.zeros(B, dtype=torch.bool, device=device)

    def _forward(self, ids, positions, mask) -> torch.Tensor:
        kwargs = {self.cache_name: self.cache}
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                         logits_to_keep=1, **kwargs)
        return out.logits[:, -1, :]

    def _additive(self, allowed: torch.Tensor) -> torch.Tensor:
        zero = torch.zeros((), dtype=self.dtype, device=allowed.device)
        return torch.where(allowed, zero, torch.finfo(self.dtype).min)

    def _take(self, logits: torch.Tensor, column) -> None:
        """Sample, mask finished rows to pad, write the output column, set up the next input."""
        nxt = sample_next(logits, self.temperature, self.top_p)
        nxt = torch.where(self.done, torch.full_like(nxt, self.pad_id), nxt)
        self.out.index_copy_(1, column, nxt.unsqueeze(1))
        self.done |= torch.isin(nxt, self.eos)
        self.token.copy_(nxt.unsqueeze(1))

    def prefill(self) -> None:
        P, device = self.P, self.prompt_ids.device
        causal = self.columns[:P].unsqueeze(0) <= torch.arange(P, device=device).unsqueeze(1)   # [P, P + L]
        diagonal = self.columns.unsqueeze(0) == torch.arange(P, device=device).unsqueeze(1)
        # pad query rows see themselves, so no softmax row is all masked (no NaN reaches a pad K/V)
        allowed = (causal.unsqueeze(0) & self.valid[:, None, :P]) | diagonal[:, :P].unsqueeze(0)
        allowed = torch.cat([allowed, torch.zeros((*allowed.shape[:2], self.L), dtype=torch.bool,
                                                  device=device)], dim=2)
        self.box["slots"] = torch.arange(P, device=device)
        g = self.group   # one row per run of identical prompts, its K/V then copied to the run (module doc)
        logits = self._forward(self.prompt_ids[::g], self.prompt_positions[::g],
                               self._additive(allowed[::g]).unsqueeze(1))
        if g > 1:
            self._widen_cache(g)
            logits = logits.repeat_interleave(g, dim=0)
        self.position.copy_(self.prompt_positions[:, -1:] + 1)
        self._take(logits, torch.zeros(1, dtype=torch.long, device=device))

    def _widen_cache(self, g: int) -> None:
        """Each prefilled row's K/V for its whole run of `g` rows (before any capture: the step's
        graph then holds the widened tensors' addresses)."""
        for layer in self.cache.layers:
            layer.keys = layer.keys.repeat_interleave(g, dim=0)
            layer.values = layer.values.repeat_interleave(g, dim=0)
            layer.batch_size = layer.keys.shape[0]

    def decode_step(self) -> None:
        """Token i + 1 from token i (i = self.step): fixed shapes, device counters only."""
        slot = self.step + self.P
        self.box["slots"] = slot
        allowed = self.valid | ((self.columns >= self.P) & (self.columns <= slot)).unsqueeze(0)
        logits = self._forward(self.token, self.position, self._additive(allowed)[:, None, None, :])
        self._take(logits, self.step + 1)
        self.position.add_(1)
        self.step.add_(1)

    def snapshot(self) -> list[torch.Tensor]:
        return [t.clone() for t in (self.out, self.step, self.token, self.position, self.done)]

    def restore(self, saved: list[torch.Tensor]) -> None:
        for live, kept in zip((self.out, self.step, self.token, self.position, self.done), saved):
            live.copy_(kept)


def _runs_of_equal_rows(ids: torch.Tensor, mask: torch.Tensor, g: int) -> bool:
    """Whether ids/mask are runs of `g` identical rows (one host read, at prefill only)."""
    B = ids.shape[0]
    if B % g:
        return False
    return all(bool((t.view(B // g, g, -1) == t[::g].unsqueeze(1)).all()) for t in (ids, mask))


def capture(decoder: StaticDecoder):
    """A CUDA graph of one decode step (after warm-up on a side stream), state restored after."""
    saved = decoder.snapshot()
    stream = warmup_stream(decoder.out.device)   # one per device: a new stream per capture leaks (its doc)
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(WARMUP_STEPS):
            decoder.decode_step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decoder.decode_step()
    decoder.restore(saved)   # warm-up and capture wrote K/V at later slots: rewritten before read
    return graph


@torch.no_grad()
def decode(model, ids: torch.Tensor, mask: torch.Tensor, max_new: int, temperature: float, top_p: float,
           eos: set[int], pad_id: int, use_graph: bool | None = None, log=None,
           should_stop=None, all_done=None, group: int = 1) -> torch.Tensor | None:
    """Completion tokens [B, max_new] (pad after a row's EOS) for left-padded prompts ids/mask; None
    when `should_stop()` turned true at one of the loop's host checks (a cancelled job).
    `all_done(mine)`: for ranks whose forwards are collectives (FSDP-sharded layers gather their
    weights in every forward, jobs/train/sharding.py): True when every rank's rows are done, so all
    stop after the same number of forwards (transformers' `synced_gpus`); no CUDA graph then.
    `group`: the rows are runs of this many identical prompts (GRPO's completions per prompt)."""
    from kernels.packed_attention import cached_decoding_attention
    if all_done is not None:
        use_graph = False   # a graph cannot hold FSDP's all-gathers
    with cached_decoding_attention(model):   # GQA decode steps read each cached K/V once
        return _decode(model, ids, mask, max_new, temperature, top_p, eos, pad_id, use_graph, log, should_stop,
                       all_done, group)


def start_decoder(model, ids, mask, max_new, temperature, top_p, eos, pad_id, use_graph=None, log=None,
                  decoder_class=None, group: int = 1):
    """(decoder, step): the batch prefilled (first token in `decoder.out[:, 0]`) and the callable that
    writes the next column, a CUDA-graph replay where capture works. GRPO's `decode` and the API
    server (jobs/serve/batch.py, which reads each column as it lands, for streaming) both run this;
    `decoder_class`: a StaticDecoder subclass (the server's slots.py lets rows join its cache)."""
    decoder_class = decoder_class or StaticDecoder
    decoder = decoder_class(model, ids, mask, max_new, temperature, top_p, sorted(eos), pad_id, group=group)
    decoder.prefill()
    step = decoder.decode_step
    if use_graph is None:
        use_graph = ids.is_cuda
    if use_graph and max_new > 1 + WARMUP_STEPS:
        try:
            graph = capture(decoder)
            step = graph.replay
            log_once(log, "grpo sampling: one decode step captured as a CUDA graph, replayed per token")
        except Exception as exc:   # noqa: BLE001 - any capture failure falls back to the eager step
            torch.cuda.synchronize()
            decoder = decoder_class(model, ids, mask, max_new, temperature, top_p, sorted(eos), pad_id, group=group)
            decoder.prefill()
            step = decoder.decode_step
            log_once(log, f"grpo sampling: CUDA graph capture failed ({type(exc).__name__}: {exc}); "
                       "decoding eagerly")
    return decoder, step


def _decode(model, ids, mask, max_new, temperature, top_p, eos, pad_id, use_graph, log,
            should_stop=None, all_done=None, group: int = 1) -> torch.Tensor | None:
    decoder, step = start_decoder(model, ids, mask, max_new, temperature, top_p, eos, pad_id, use_graph, log,
                                  group=group)
    for i in range(1, max_new):
        if i % CHECK_EVERY == 0:
            if should_stop is not None and should_stop():
                return None   # a long rollout must not outlast the runner's grace period after a cancel
            done = bool(decoder.done.all())
            if all_done(done) if all_done is not None else done:
                break
        step()
    return decoder.out
