"""The fit check: predicted peak GPU memory against the peaks measured on the H200 bench rows
(bench/results/lora.jsonl, max_memory_allocated), and the out-of-memory message."""
import json

import pytest
from transformers import AutoConfig

from jobs.models import fit
from tests.conftest import ROOT
from tests.jobs.models.model_shapes import H200_BYTES, SHAPES, config, spec

ROWS = [  # (shape, batch, seq, checkpointing, qlora)
    ("llama-3.2-1b", 4, 2048, "on", False),
    ("llama-3.2-1b", 4, 2048, "offload", False),
    ("llama-3.1-8b", 2, 2048, "on", False),
    ("llama-3.1-8b", 2, 2048, "offload", False),
    ("llama-3.1-8b", 2, 2048, "off", False),
    ("llama-3.1-8b", 2, 2048, "offload", True),
]
def measured_peak_gib(shape, batch, seq, checkpointing, qlora):
    peaks = []
    for line in (ROOT / "bench" / "results" / "lora.jsonl").read_text().splitlines():
        row = json.loads(line)
        if (row.get("stack") == "fusetune" and row.get("shape") == shape and row.get("bs") == batch
                and row.get("seq") == seq and row.get("checkpointing") == checkpointing
                and bool(row.get("qlora")) == qlora and row.get("lora_dtype", "fp32") == "fp32"
                and not row.get("oom") and row.get("peak_gib")
                and not str(row.get("variant") or "").startswith("fp8")):   # FP8 bases: another estimate
            peaks.append(row["peak_gib"])
    assert peaks, f"no measured row for {shape} {batch}x{seq} {checkpointing} qlora={qlora}"
    return max(peaks)


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r[0]}-{r[3]}{'-qlora' if r[4] else ''}")
def test_prediction_is_within_15_percent_of_the_measured_peak(row):
    shape, batch, seq, checkpointing, qlora = row
    estimate = fit.estimate_peak(spec(batch, seq, checkpointing, qlora), config(shape))
    measured = measured_peak_gib(*row)
    assert abs(estimate.allocated_gb - measured) <= 0.15 * measured, (estimate.breakdown(), measured)
    assert estimate.total_gb > estimate.allocated_gb   # context and slack come on top


def test_auto_checkpointing_follows_the_free_memory():
    big = fit.estimate_peak(spec(2, 2048, "auto"), config("llama-3.1-8b"), free_bytes=H200_BYTES,
                            total_bytes=H200_BYTES)
    small = fit.estimate_peak(spec(2, 2048, "auto"), config("llama-3.1-8b"), free_bytes=24 * 1024 ** 3,
                              total_bytes=24 * 1024 ** 3)
    assert "no recompute" in big.checkpointing
    assert "recomputed" in small.checkpointing or "offloaded" in small.checkpointing
    assert small.allocated_gb < big.allocated_gb
    assert abs(big.allocated_gb - measured_peak_gib("llama-3.1-8b", 2, 2048, "auto", False)) < 0.15 * 29.4


def test_levers_lower_the_prediction():
    base = fit.estimate_peak(spec(8, 4096, "off"), config("llama-3.2-1b"))
    assert fit.estimate_peak(spec(4, 4096, "off"), config("llama-3.2-1b")).total_gb < base.total_gb
    assert fit.estimate_peak(spec(8, 4096, "on"), config("llama-3.2-1b")).total_gb < base.total_gb
    assert fit.estimate_peak(spec(8, 4096, "off", qlora=True), config("llama-3.2-1b")).total_gb < base.total_gb
    unfused = fit.estimate_peak(spec(8, 4096, "off", fused_kernels=False), config("llama-3.2-1b"))
    assert unfused.total_gb > base.total_gb
    targets = fit.estimate_peak(spec(8, 4096, "off", target_modules=["q_proj", "v_proj"]), config("llama-3.2-1b"))
    assert targets.parts["LoRA + AdamW (fp32)"] < base.parts["LoRA + AdamW (fp32)"]


def test_estimate_reports_its_parts():
    estimate = fit.estimate_peak(spec(2, 2048, "on"), config("llama-3.1-8b"))
    parts = estimate.breakdown()
    assert list(parts)[0] == "base weights" and parts["base weights"] == pytest.approx(14.96, abs=0.02)
    assert estimate.as_dict()["checkpointing"] == "on"
    line = estimate.summary()   # train.log's "memory estimate:": the allocated peak a budget bounds, then the card's
    assert line.startswith(f"about {estimate.allocated_gb:.2f} GiB allocated at peak: base weights 14.96")
    assert f"about {estimate.total_gb:.1f} GiB of the GPU with the CUDA context" in line
    estimate.budget_gb = 19.8
    assert "allocated at peak (max_gpu_memory_gb 19.8):" in estimate.summary()
    assert estimate.fits(estimate.total_gb + 0.1) and not estimate.fits(estimate.total_gb - 0.1)


def test_oom_message_names_estimate_peak_and_fixes():
    job = spec(8, 4096, "off")
    estimate = fit.estimate_peak(job, config("llama-3.1-8b"))
    message = fit.oom_message(job, estimate, int(120.5 * 1024 ** 3), 3, "checkpointing off",
                              "CUDA out of memory. Tried to allocate 2.00 GiB")
    assert f"predicted peak {estimate.total_gb:.1f} GiB" in message
    assert "120.5 GiB" in message and "step 3" in message
    for fix in ("batch_size 8 -> 4", "max_seq_length 4096 -> 2048", "gradient_checkpointing", "load_in_4bit"):
        assert fix in message
    assert "last checkpoint is intact" in message


def test_free_gpu_memory_is_none_without_a_gpu():
    assert fit.free_gpu_memory(0) is None or fit.free_gpu_memory(0) > 0


def test_an_oom_ends_the_job_with_kind_oom_advice_and_an_intact_checkpoint(tmp_path, tiny_model, monkeypatch):
    import torch
    import yaml

    from jobs.train import cli as train
    from jobs.train import loop as trainer
    from jobs.io.events import read_events
    real_step, calls = trainer.Trainer.train_step, []

    def step_then_oom(self, stream):
        calls.append(1)
        if len(calls) == 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return real_step(self, stream)

    monkeypatch.setattr(trainer.Trainer, "train_step", step_then_oom)
    out = tmp_path / "oom"
    config = tmp_path / "oom.yaml"
    config.write_text(yaml.safe_dump({"model": str(tiny_model), "output_dir": str(out), "max_steps": 6,
                                      "save_steps": 2, "batch_size": 2, "max_seq_length": 64}))
    assert train.main([str(config)]) == train.EXIT_FAILED
    (error,) = [e for e in read_events(out) if e["type"] == "error"]
    assert error["kind"] == "oom" and error["step"] == 2
    for part in ("out of GPU memory at step 3", "predicted peak", "peak allocated", "batch_size 2 -> 1",
                 "load_in_4bit", "last checkpoint is intact", "Tried to allocate 20.00 GiB"):
        assert part in error["message"], part
    state = json.loads((out / "checkpoints" / "step-2" / "trainer_state.json").read_text())
    assert state["step"] == 2 and (out / "checkpoints" / "step-2" / "adapter" / "adapter_model.safetensors").is_file()


def test_the_estimate_counts_the_tokens_of_the_methods_batch(tmp_path):
    """A preference pair is one row of up to 2 x max_seq_length (prompt, chosen, rejected), a grpo
    step batch_size x num_generations completions and their prompts: on the GPU packed, each prompt
    once per group (fit_policy.py), and once per completion where the job cannot share them."""
    model = config("llama-3.2-1b")
    pairs, prompts = tmp_path / "pairs.jsonl", tmp_path / "prompts.jsonl"
    pairs.write_text('{"prompt": "q", "chosen": "a", "rejected": "b"}\n')
    prompts.write_text('{"prompt": "q", "answer": "1"}\n')
    sft = fit.estimate_peak(spec(4, 1024, "on"), model, free_bytes=H200_BYTES, total_bytes=H200_BYTES)
    dpo = fit.estimate_peak(spec(4, 1024, "on", method="dpo", dataset=str(pairs)), model,
                            free_bytes=H200_BYTES, total_bytes=H200_BYTES)
    grpo = fit.estimate_peak(spec(2, 256, "on", method="grpo", dataset=str(prompts), num_generations=8,
                                  max_completion_length=128), model, free_bytes=H200_BYTES, total_bytes=H200_BYTES)
    assert (sft.tokens, dpo.tokens, grpo.tokens) == (4 * 1024, 4 * 2 * 1024, 2 * 256 + 2 * 8 * 128)
    assert dpo.total_gb > sft.total_gb
    assert "a pair a row" in dpo.notes[0] and "2 prompts x 8 completions" in grpo.notes[0]
    kto = fit.estimate_peak(spec(4, 1024, "on", method="kto", dataset=str(pairs)), model, packed=True,
                            free_bytes=H200_BYTES, total_bytes=H200_BYTES)
    assert "(kto: examples with their KL completions packed side by side)" in kto.notes[0]
    assert "prompts once per group" in grpo.notes[0]
    repeated = fit.estimate_peak(spec(2, 256, "on", method="grpo", dataset=str(prompts), num_generations=8,
                                      max_completion_length=128), model, free_bytes=H200_BYTES,
                                 total_bytes=H200_BYTES, prompts_once=False, prompt_len=100)
    assert repeated.tokens == 2 * 8 * (100 + 128) and "once per group" not in repeated.notes[0]


def _grpo(tmp_path, checkpointing="auto", **extra):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "q", "answer": "1"}\n')
    values = {"method": "grpo", "dataset": str(prompts), "num_generations": 8, "max_completion_length": 2048,
              "dtype": "bf16", **extra}
    return spec(8, 512, checkpointing, **values)


def test_grpo_sampling_holds_each_completions_kv_cache_and_a_budget_splits_it_into_passes(tmp_path):
    """Sampling (jobs/models/fit_rollout.py): a completion of the 8B shape holds 32 layers x K and V
    of 1,024 values x (512 + 2,048) slots in bf16 plus its prefill and logits; without a budget one
    pass takes all 64, within 29.58 GiB (the 512-token peer's peak) the most groups that fit beside the
    weights and the adapter's state, and one more would not."""
    model = config("llama-3.1-8b")
    rows, per_row = fit.rollout_rows(_grpo(tmp_path), model)
    kv = 32 * 2 * 1024 * (512 + 2048) * 2
    assert rows == 64 and kv < per_row < 1.25 * kv
    budget = _grpo(tmp_path, max_gpu_memory_gb=29.58)
    rows, per_row = fit.rollout_rows(budget, model)
    shape = fit._Shape.of(model)
    static = fit._static_bytes(budget, shape, 2, True, None)
    room = fit.allocatable_bytes(29.58) - static
    # passes of whole groups (each prompt prefilled once for its 8 completions), one more would not fit
    assert 1 < rows < 64 and rows % 8 == 0 and rows * per_row <= room < (rows + 8) * per_row
    assert (static + rows * per_row) / fit.GIB <= 29.58   # the budget bounds the allocated peak
    rows_now, _ = fit.rollout_rows(budget, model, allocated=static + 4 * fit.GIB)   # more held now: fewer rows
    assert rows_now < rows


def test_a_grpo_estimate_reports_the_phase_that_peaks(tmp_path):
    """Long completions on a big-KV model peak while sampling: the estimate then carries the KV
    cache, not the policy step's activations; short ones peak in the policy step, noted either way."""
    model = AutoConfig.for_model("llama", **{**SHAPES["llama-3.2-1b"], "num_key_value_heads": 32})  # MHA: 4x the KV
    long = fit.estimate_peak(_grpo(tmp_path, "offload"), model,
                             free_bytes=H200_BYTES, total_bytes=H200_BYTES)
    assert "sampling KV cache" in long.parts and "activations kept" not in long.parts
    assert any(n.startswith("grpo peaks in sampling") and "all 64 completions in one pass" in n for n in long.notes)
    short = fit.estimate_peak(_grpo(tmp_path, "off", max_completion_length=64), model,
                              free_bytes=H200_BYTES, total_bytes=H200_BYTES)
    assert "activations kept" in short.parts and "sampling KV cache" not in short.parts
    assert any(n.startswith("grpo peaks in the policy step") for n in short.notes)


def test_a_grpo_micro_batch_no_plan_fits_trains_in_passes_that_fit(tmp_path, monkeypatch):
    """The 8B shape, 64 completions of 512 + 2,048 tokens within 29.58 GiB: no checkpointing plan fits
    them in one policy pass (the H200 run of 2026-12-03 peaked at 37.9 GiB), so the step trains them in
    the fewest passes for which one does; the plan, the estimate and its note agree, and without a
    budget there is one pass. (A prompt per completion, as that run's passes held: `repeated`.)"""
    import kernels.checkpoint
    monkeypatch.setattr(kernels.checkpoint, "_host_free_bytes", lambda: 120 * fit.GIB)   # the H200 host
    model, budget = config("llama-3.1-8b"), _grpo(tmp_path, max_gpu_memory_gb=29.58)
    repeated = {"prompts_once": False}
    part = fit.grpo_policy_rows(budget, model, **repeated)
    assert 1 < part < 64 and fit.grpo_policy_rows(_grpo(tmp_path), model, **repeated) == 64
    flags, offload, description, hosted = fit.plan_within_budget(budget, model, **repeated)
    assert f"passes of up to {part} of its 64 completions" in description and "does not fit" not in description
    estimate = fit.estimate_peak(budget, model, free_bytes=H200_BYTES, total_bytes=H200_BYTES, **repeated)
    assert estimate.allocated_gb <= 29.58 and estimate.tokens == part * (512 + 2048)
    assert f"passes of up to {part}" in estimate.notes[0]
    bigger = -(-64 // (-(-64 // part) - 1))     # one pass fewer: more completions a pass
    view = fit.dataclasses.replace(budget, batch_size=1, num_generations=bigger)
    shape = fit._Shape.of(model)
    assert fit._first_fit(view, shape, 2, fit._static_bytes(budget, shape, 2, True, None), True,
                          120 * fit.GIB, None) is None


def test_a_recomputed_layer_is_charged_without_the_down_projection_the_fused_engine_skips():
    """kernels/lora_patch.py skips the MLP's down projection in a recompute where the MLP only joins the
    residual: the plan's time model charges the rest (Llama-3.2-1B: 1 - 16.8M / 60.8M weights a layer)."""
    llama = fit._Shape.of(config("llama-3.2-1b"))
    assert llama.recompute_share(fused=True) == pytest.approx(1 - 2048 * 8192 / 60_817_408)
    assert llama.recompute_share(fused=False) == 1.0
    gemma2 = AutoConfig.for_model("gemma2", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=2, num_key_value_heads=1, head_dim=32, vocab_size=256)
    assert fit._Shape.of(gemma2).recompute_share(fused=True) == 1.0   # its post-feed-forward norm reads the output
