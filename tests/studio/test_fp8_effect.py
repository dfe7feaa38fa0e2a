"""The FP8 switch's help: the measured effect read from bench/results rows, or "not measured"."""
import json

from jobs.train.graph_steps import CAPTURED_LINE
from studio.fp8_effect import effect_text, measured_effects


def row(precision, shape, tokens, gib, time, mode="off", variant=None, stack="fusetune"):
    return {"gpu": "NVIDIA H200", "stack": stack, "shape": shape, "bs": 2, "seq": 2048, "checkpointing": mode,
            "variant": variant or f"{precision}:{mode}", "base_precision": precision, "tokens_per_s": tokens,
            "peak_gib": gib, "time": time}


def test_no_rows_says_not_measured(tmp_path):
    (tmp_path / "lora.jsonl").write_text(json.dumps(row("bf16", "llama-3.1-8b", 9000, 30.0, "t1")) + "\n")
    assert measured_effects(tmp_path) == []
    assert "has not been measured on this install" in effect_text("en", tmp_path)
    assert "尚未测量" in effect_text("zh-CN", tmp_path)


def test_newest_pair_per_shape_largest_first(tmp_path):
    rows = [row("bf16", "llama-3.1-8b", 9000, 30.0, "t1"), row("fp8", "llama-3.1-8b", 11000, 24.0, "t1"),
            row("bf16", "llama-3.1-8b", 9500, 30.0, "t2"), row("fp8", "llama-3.1-8b", 12350, 23.5, "t2"),
            row("fp8", "llama-3.1-8b", 99999, 1.0, "t3", variant="fp8+savex:off"),   # a switch, not the toggle
            row("fp8", "llama-3.1-8b", 99999, 1.0, "t3", stack="unsloth"),
            row("bf16", "llama-3.2-1b", 40000, 8.0, "t1"), row("fp8", "llama-3.2-1b", 48000, 7.1, "t1")]
    (tmp_path / "lora.jsonl").write_text("\n".join(json.dumps(r) for r in rows[:6]) + "\nnot json\n")
    (tmp_path / "fp8_rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows[6:]) + "\n")
    effects = measured_effects(tmp_path)
    assert [e.shape for e in effects] == ["llama-3.1-8b", "llama-3.2-1b"]
    assert (effects[0].fp8_tokens_per_s, effects[0].bf16_tokens_per_s) == (12350, 9500)
    text = effect_text("en", tmp_path)
    assert text.startswith("Measured on NVIDIA H200, FP8 against bf16: llama-3.1-8b benchmark step (checkpointing off): "
                           "12,350 vs 9,500 tokens/s (1.30x), 23.5 vs 30.0 GiB peak")
    assert "llama-3.2-1b" in text and "1.20x" in text


def job(precision, tokens, gib, time, mode="offload", graph=None, stack="fusetune (a)", returncode=0, **extra):
    config = {"batch_size": 2, "max_seq_length": 4096, "gradient_checkpointing": mode, "fused_kernels": True}
    if precision != "bf16":   # older job rows have no base_precision: they ran bf16
        config["base_precision"] = precision
    return {"gpu": "NVIDIA H200", "stack": stack, "shape": "llama-3.1-8b", "returncode": returncode,
            "real_tokens_per_s": tokens, "peak_gib": gib, "time": time, "config": config, "cuda_graph_env": graph,
            **extra}


CAPTURED = ["  cuda graph: on (the step is captured once and replayed)", CAPTURED_LINE]
EAGER = ["  cuda graph: off (not switched on: FUSETUNE_CUDA_GRAPH=1 captures it)"]


def test_a_training_job_pair_wins_over_the_benchmark_step_of_its_shape(tmp_path):
    bench = [row("bf16", "llama-3.1-8b", 11597, 16.4, "t1", mode="offload"),
             row("fp8", "llama-3.1-8b", 11277, 10.2, "t1", mode="offload"),
             row("bf16", "llama-3.2-1b", 40000, 8.0, "t1"), row("fp8", "llama-3.2-1b", 48000, 7.1, "t1")]
    jobs = [job("bf16", 11688, 16.96, "t2"), job("fp8", 17081, 10.79, "t3"),
            job("fp8", 99999, 1.0, "t4", graph="auto", log_head=CAPTURED),   # a captured step: not the default
            job("fp8", 99999, 1.0, "t4", graph="1"),                  # captured, from before rows kept the log
            job("fp8", 99999, 1.0, "t4", cuda_graph="on"),
            job("fp8", 99999, 1.0, "t4", graph="auto", switch="fullx", log_head=EAGER),  # an engine switch
            job("fp8", 99999, 1.0, "t4", stack="unsloth+trl (c)"),
            job("fp8", 99999, 1.0, "t4", returncode=1),
            job("fp8", 50000, 20.0, "t4", mode="off")]                  # no bf16 job of that mode: no pair
    (tmp_path / "lora.jsonl").write_text("\n".join(json.dumps(r) for r in bench) + "\n")
    (tmp_path / "job.jsonl").write_text("\n".join(json.dumps(r) for r in jobs) + "\ncut li\n")
    effects = measured_effects(tmp_path)
    assert [(e.shape, e.source) for e in effects] == [("llama-3.1-8b", "job"), ("llama-3.2-1b", "benchmark")]
    assert (effects[0].fp8_tokens_per_s, effects[0].bf16_tokens_per_s, effects[0].fp8_gib) == (17081, 11688, 10.79)
    text = effect_text("en", tmp_path)
    assert ("llama-3.1-8b training job (checkpointing offload): 17,081 vs 11,688 tokens/s (1.46x), "
            "10.8 vs 17.0 GiB peak") in text
    assert "llama-3.2-1b benchmark step (checkpointing off): 48,000 vs 40,000 tokens/s (1.20x)" in text
    assert "训练任务" in effect_text("zh-CN", tmp_path)


def test_eager_jobs_with_the_graph_switch_unset_pair_up(tmp_path):
    """Since capture became opt-in, an unset switch ("auto") is the eager default: what the job logged
    decides, and of a shape's pairs the one measured last is shown (not the first conditions seen)."""
    jobs = [job("bf16", 11688, 16.96, "t1"), job("fp8", 17081, 10.79, "t2"),
            job("bf16", 17000, 43.0, "t1.5", mode="off"), job("fp8", 24000, 36.0, "t2.5", mode="off"),  # older
            job("bf16", 12267, 16.96, "t3", graph="auto", log_head=EAGER, cuda_graph="off"),
            job("fp8", 17122, 10.76, "t4", graph="auto", log_head=EAGER, cuda_graph="off"),
            job("fp8", 17185, 10.79, "t5", graph="auto", log_head=EAGER, cuda_graph="off", switch="fullx")]
    (tmp_path / "job.jsonl").write_text("\n".join(json.dumps(r) for r in jobs) + "\n")
    [effect] = measured_effects(tmp_path)
    assert (effect.source, effect.fp8_tokens_per_s, effect.bf16_tokens_per_s) == ("job", 17122, 12267)
    assert "17,122 vs 12,267 tokens/s (1.40x)" in effect_text("en", tmp_path)
