"""The fit check on image-text models (jobs/models/fit_vision.py): the vision tower's weights as
transformers builds it, its LoRA and its activations as measured on CPU, budget plans with a flag for
every checkpointing layer, text models' numbers unchanged, and the prediction against the H200 vision
bench (bench/results/vision.jsonl)."""
import json

import pytest
import torch

from jobs.models import fit, fit_vision
from jobs.spec import JobSpec
from tests.conftest import ROOT
from tests.jobs.models import vision_memory
from tests.jobs.models.model_shapes import H200_BYTES, config, seven_b, spec, vl_spec

GIB = 2 ** 30


@pytest.fixture(scope="module")
def tiny_configs(tmp_path_factory):
    from transformers import AutoConfig

    from tests.tiny import make_tiny_vision_model
    return {family: AutoConfig.from_pretrained(make_tiny_vision_model(tmp_path_factory.mktemp(family) / "m",
                                                                      family=family))
            for family in ("qwen2_5_vl", "qwen2_vl")}


@pytest.mark.parametrize("which", ["qwen2.5-vl-7b", "qwen2_5_vl", "qwen2_vl"])
def test_the_tower_is_counted_as_transformers_builds_it(which, tiny_configs):
    from transformers import AutoModelForImageTextToText
    model_config = seven_b() if which == "qwen2.5-vl-7b" else tiny_configs[which]
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(model_config)
    built = sum(p.numel() for name, p in model.named_parameters() if name.startswith("model.visual."))
    linear = {name for name, m in model.named_modules()
              if isinstance(m, torch.nn.Linear) and name.startswith("model.visual.")}
    vision = fit_vision.VisionShape.of(model_config)
    assert vision.parameters() == built and {name for name, _, _ in vision.linears()} == linear
    estimate = fit.estimate_peak(vl_spec(), model_config)
    assert estimate.parts["vision tower"] == built * 2           # bf16
    assert "vision tower" in estimate.breakdown()
    if which == "qwen2.5-vl-7b":
        assert built == 676_550_144                              # ~0.68 B parameters, 1.26 GiB in bf16


def test_under_qlora_the_towers_linears_are_nf4_as_counted(tmp_path):
    """bitsandbytes quantises every linear of the tower and merger (only lm_head and tied weights are
    skipped), which is what weight_bytes assumes; the rest stays in the dtype."""
    from jobs.models import load
    from tests.tiny import make_tiny_vision_model
    folder = make_tiny_vision_model(tmp_path / "m")
    model = load.load_base_model(str(folder), torch.float32, torch.device("cpu"), load_in_4bit=True)
    vision = fit_vision.VisionShape.of(model.config)
    assert {type(model.get_submodule(name)).__name__ for name, _, _ in vision.linears()} == {"Linear4bit"}
    qlora, bf16 = (fit.estimate_peak(vl_spec(load_in_4bit=q), model.config).parts["vision tower"] for q in (True, False))
    rest = vision.parameters() - vision.linear_weights()
    assert qlora == int(vision.linear_weights() * fit.NF4_BYTES_PER_WEIGHT) + rest * 2 and qlora < bf16


def test_text_models_keep_their_numbers_and_get_no_vision_part():
    """The parts of text estimates as they were before the vision tower was counted (pinned from that code)."""
    assert fit.estimate_peak(spec(2, 2048, "on"), config("llama-3.1-8b")).parts == {
        "base weights": 16059990016, "LoRA + AdamW (fp32)": 671088640, "activations kept": 1073741824,
        "step transient": 620756992, "loss grad (hidden)": 33554432}
    unfused_qlora = spec(8, 4096, "off", qlora=True, fused_kernels=False)
    assert fit.estimate_peak(unfused_qlora, config("llama-3.2-1b")).parts == {
        "base weights (NF4)": 501981184, "embeddings": 525336576, "LoRA + AdamW (fp32)": 180355072,
        "activations kept": 78383153152, "step transient": 42026926080, "loss grad (hidden)": 134217728}


def test_the_decoder_share_of_an_image_text_estimate_is_the_text_models():
    from transformers import Qwen2Config

    from bench.bench_vision import QWEN25_VL_7B
    text = {k: v for k, v in QWEN25_VL_7B["text"].items() if k != "rope_parameters"}
    as_text = fit.estimate_peak(vl_spec(), Qwen2Config(**text, tie_word_embeddings=False)).parts
    with_tower = fit.estimate_peak(vl_spec(), seven_b()).parts
    assert {k: with_tower[k] for k in as_text} == as_text
    assert set(with_tower) - set(as_text) == {"vision tower", "vision activations"}


def test_vision_lora_adds_the_towers_adapters_and_activations(tiny_configs):
    from transformers import AutoModelForImageTextToText

    from jobs.models import load
    job = JobSpec(model="x", lora_r=4, lora_alpha=8, vision_lora=True)
    model = load.add_lora(AutoModelForImageTextToText.from_config(tiny_configs["qwen2_5_vl"]), job)
    in_tower = sum(p.numel() for name, p in model.named_parameters() if p.requires_grad and ".visual." in name)
    assert fit_vision.lora_params(job, fit_vision.VisionShape.of(tiny_configs["qwen2_5_vl"])) == in_tower

    frozen, tuned = (fit.estimate_peak(vl_spec(vision_lora=lora), seven_b()) for lora in (False, True))
    adapters = fit_vision.lora_params(vl_spec(vision_lora=True), fit_vision.VisionShape.of(seven_b()))
    assert tuned.parts["vision LoRA + AdamW (fp32)"] == adapters * 16
    assert "vision LoRA + AdamW (fp32)" not in frozen.parts
    assert tuned.parts["vision activations"] > frozen.parts["vision activations"] and tuned.total_gb > frozen.total_gb


@pytest.mark.parametrize("family, inter", [("qwen2_5_vl", 684), ("qwen2_vl", 1024)])
@pytest.mark.parametrize("fused", [False, True], ids=["pytorch", "fused"])
def test_the_tower_keeps_for_backward_what_the_formula_says(family, inter, fused):
    """Autograd's saved tensors of a 256-patch image through a 2-block tower of width 256 (fp32 on CPU;
    fused: the Triton interpreter), against kept_bytes: nothing frozen, within 2 % with LoRA."""
    model_config = vision_memory.vl_config(family, 256, inter, depth=2)
    vision, grid = fit_vision.VisionShape.of(model_config), (1, 16, 16)
    job = JobSpec(model="x", lora_r=2, batch_size=1, max_seq_length=16 * 16 // 4, vision_lora=True)
    measured = vision_memory.saved_for_backward(vision_memory.lora_model(model_config, True, fused), grid)
    assert measured == pytest.approx(fit_vision.kept_bytes(job, vision, 4, fused, 0, False), rel=0.02)
    frozen = JobSpec(model="x", lora_r=2, batch_size=1, max_seq_length=64)
    assert vision_memory.saved_for_backward(vision_memory.lora_model(model_config, False, fused), grid) == 0
    assert fit_vision.kept_bytes(frozen, vision, 4, fused, 0, False) == 0


@pytest.mark.parametrize("family, inter", [("qwen2_5_vl", 684), ("qwen2_vl", 1024)])
def test_the_frozen_towers_forward_peaks_as_the_formula_says(family, inter):
    model_config = vision_memory.vl_config(family, 256, inter, depth=2)
    measured = vision_memory.forward_peak(vision_memory.lora_model(model_config, False), (1, 16, 16))
    per_patch = fit_vision.forward_transient_bytes(fit_vision.VisionShape.of(model_config), 4)
    assert measured == pytest.approx(256 * per_patch, rel=0.02)


def test_a_budget_plan_flags_every_checkpointing_layer_vision_blocks_first(tiny_configs, roomy_host):
    """kernels.apply_checkpointing wants a flag per GradientCheckpointingLayer, and an image-text
    model's vision blocks are such layers (before the decoder's): a frozen tower's stay off (they
    keep nothing), a LoRA'd tower's are recomputed first."""
    from transformers import AutoModelForImageTextToText

    from jobs.models import load
    from kernels.checkpoint import apply_checkpointing, decoder_layers
    job = vl_spec(gradient_checkpointing="auto", max_gpu_memory_gb=0.001, max_seq_length=64)   # below any plan
    model = load.add_lora(AutoModelForImageTextToText.from_config(tiny_configs["qwen2_5_vl"]), job)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    plan = fit.plan_within_budget(job, model.config, trainable=trainable)
    assert len(plan[0]) == len(decoder_layers(model)) == 4 and plan[0] == [False, False, True, True]
    assert apply_checkpointing(model, "auto", plan=plan) == plan[2]
    loaded = fit.estimate_peak(job, model.config, trainable=trainable, model=model)   # the trainer's estimate
    assert loaded.checkpointing.endswith(f"{sum(plan[0])} of 4 layers recomputed") and "vision tower" in loaded.parts

    for vision_lora, budget in ((False, 24.0), (True, 24.0), (True, 35.0)):
        job = vl_spec(gradient_checkpointing="auto", max_gpu_memory_gb=budget, vision_lora=vision_lora)
        flags, _, description, _ = fit.plan_within_budget(job, seven_b())
        estimate = fit.estimate_peak(job, seven_b(), free_bytes=140 * GIB)
        assert len(flags) == 32 + 28 and estimate.allocated_gb <= budget and estimate.checkpointing == description
        tower, decoder = flags[:32], flags[32:]
        assert not any(tower) if not vision_lora else (all(tower) or not any(decoder))
    assert "vision blocks first" in description


def bench_rows_longest() -> tuple[int, int]:
    """(tokens, patches) of the longest row the vision bench trained: bench_vision.py's 64 rows (seed 0),
    encoded as the job encodes them, in the order its 20 steps of batch 1 ran."""
    import tempfile
    from pathlib import Path

    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from bench.bench_vision import write_rows
    from jobs.data.vision_dataset import vision_examples
    from jobs.data.vision_encode import VisionBatchPlan
    from tests.tiny import QWEN2_VL_TEMPLATE, VISION_SPECIALS, make_qwen2_tokenizer
    tokenizer = make_qwen2_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": VISION_SPECIALS})
    tokenizer.chat_template = QWEN2_VL_TEMPLATE
    image_id = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    with tempfile.TemporaryDirectory() as tmp:
        rows = write_rows(Path(tmp) / "rows", rows=64, sizes=[(448, 448), (640, 480), (1024, 768)])
        job = JobSpec(model="x", dataset=str(rows), max_seq_length=4096)
        examples = vision_examples(job, "dataset", tokenizer, Qwen2VLImageProcessorPil(), image_id, Path(tmp) / "d",
                                   log=lambda _: None)
    ran = [group[0] for group in VisionBatchPlan(examples, 1, 4096, 0, tokenizer.pad_token_id, image_id)
           .epoch_batches(0)[:20]]
    return max((len(examples[i].input_ids), int(examples[i].image_grid_thw.prod(-1).sum())) for i in ran)


def test_the_prediction_against_the_vision_benchs_measured_peak():
    """bench/results/vision.jsonl: Fusetune on the Qwen2.5-VL-7B shape, one example a row, auto
    checkpointing (no recompute on the H200), no budget, batch 1, max_seq_length 4096: 21.66 GiB
    max_memory_allocated. Its longest row is 1,667 tokens (a 1024x768 image, 3,996 patches); sized for
    that row the estimate is 21.61 GiB (-0.2 %; the decoder alone, as before the tower was counted:
    20.32, -6 %). The fit check sizes full 4,096-token rows of image tokens: 29.36 GiB, an upper
    bound 36 % over this run's short rows. Nothing here is fitted to the row."""
    (row,) = [r for r in map(json.loads, (ROOT / "bench" / "results" / "vision.jsonl").read_text().splitlines())
              if r.get("stack") == "fusetune" and r.get("packing", "off") == "off"
              and r.get("checkpointing", "auto") == "auto" and not r.get("measurement_note")]
    # the row as the bench ran it: 1,667 tokens. tests/tiny.py's tokenizer is trained on the identity
    # rows, so a change of those (issue 42) re-splits the rows' words; the images' patches stay
    tokens, (_, patches) = 1667, bench_rows_longest()
    assert patches == 3996
    kwargs = dict(free_bytes=140 * GIB, total_bytes=H200_BYTES)
    bench = dict(gradient_checkpointing="auto", packing="off")
    like_for_like = fit.estimate_peak(vl_spec(max_seq_length=tokens, **bench), seven_b(), **kwargs)
    assert "no recompute" in like_for_like.checkpointing
    assert like_for_like.allocated_gb == pytest.approx(row["peak_gib"], rel=0.03)
    decoder_only = like_for_like.allocated_gb - (like_for_like.parts["vision tower"]
                                                 + like_for_like.parts["vision activations"]) / GIB
    assert decoder_only < 0.95 * row["peak_gib"]
    assert fit.estimate_peak(vl_spec(**bench), seven_b(), **kwargs).allocated_gb > row["peak_gib"]
