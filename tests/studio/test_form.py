"""The Train form is generated from JobSpec: every field shows up, with its help, bounds and
choices, and form values map back to the same JobSpec."""
import dataclasses

import pytest

from jobs.spec import BUILTIN_MODEL, JobSpec, SpecError
from studio import form


def spec_fields():
    return {f.name: f for f in dataclasses.fields(JobSpec)}


def test_every_spec_field_is_in_the_form_once():
    names = form.form_names()
    assert len(names) == len(set(names))
    assert set(names) == set(spec_fields()) - set(form.NOT_IN_FORM)


def test_a_field_missing_from_the_layout_still_appears(monkeypatch):
    groups = dict(form.GROUPS)
    groups["training"] = tuple(n for n in groups["training"] if n != "seed")
    monkeypatch.setattr(form, "GROUPS", groups)
    placed = dict(form.grouped_widgets())
    assert "seed" in [w.name for w in placed["more"]]
    assert "seed" in form.form_names()


def test_widgets_follow_field_metadata():
    fields = spec_fields()
    widgets = {w.name: w for w in form.field_widgets()}
    for name, widget in widgets.items():
        meta = fields[name].metadata
        if name not in ("model", "target_modules"):
            assert widget.info("en") == f"{meta['help']} {form.range_text(widget)}".strip()
        if "choices" in meta and name != "base_precision":
            assert widget.kind == "dropdown" and widget.choices == tuple(meta["choices"])
        assert widget.minimum == meta.get("min") and widget.maximum == meta.get("max")
    assert widgets["load_in_4bit"].kind == "checkbox"
    assert widgets["base_precision"].kind == "checkbox" and widgets["base_precision"].default is False
    assert widgets["lora_r"].kind == "int" and widgets["learning_rate"].kind == "float"
    assert widgets["model"].kind == "dropdown" and widgets["model"].allow_custom
    assert widgets["model"].default == BUILTIN_MODEL and ".gguf" in widgets["model"].info("en")
    assert widgets["name"].kind == "text" and "name" in form.GROUPS["data"]


def test_values_round_trip_to_the_same_spec(tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text('{"instruction": "hi", "output": "hello"}\n')
    spec = JobSpec(dataset=str(data), dataset_format="alpaca", lora_r=8, lora_alpha=19,
                   lora_dropout=0.05, target_modules=["q_proj", "v_proj"], load_in_4bit=True,
                   gradient_checkpointing="on", dtype="bf16", learning_rate=3e-5, max_steps=7,
                   batch_size=3, gradient_accumulation_steps=5, max_seq_length=77, seed=11)
    names = form.form_names()
    values = form.spec_to_values(spec, names)
    assert values[names.index("target_modules")] == "q_proj, v_proj"
    again = JobSpec.from_dict(form.values_to_dict(names, values))
    assert again.to_dict() == spec.to_dict()


def test_numbers_are_text_parsed_strictly():
    names = form.form_names()
    values = form.spec_to_values(JobSpec(learning_rate=1e-5, max_steps=9), names)
    assert values[names.index("learning_rate")] == "1e-05" and values[names.index("max_steps")] == "9"
    values[names.index("max_seq_length")] = " 1,048,576 "  # as the range hint prints it
    values[names.index("batch_size")] = "4.0"
    spec = JobSpec.from_dict(form.values_to_dict(names, values))
    assert spec.learning_rate == 1e-5 and spec.max_steps == 9 and spec.max_seq_length == 1048576
    assert spec.batch_size == 4 and isinstance(spec.batch_size, int)


@pytest.mark.parametrize("name, raw, code", [
    ("learning_rate", "abc", "number_invalid"), ("max_steps", "", "number_blank"), ("lora_r", "   ", "number_blank"),
    ("batch_size", "2.5", "number_not_integer"), ("lora_dropout", "nan", "number_invalid"),
    ("max_steps", None, "number_blank"), ("seed", "1,2", "number_invalid"), ("warmup_steps", True, "number_invalid"),
    ("learning_rate", "7", "number_above_max"), ("lora_r", "0", "number_below_min")])
def test_a_bad_number_is_refused_naming_the_field(name, raw, code):
    names = form.form_names()
    values = form.spec_to_values(JobSpec(), names)
    values[names.index(name)] = raw
    with pytest.raises(form.FieldError) as info:
        form.values_to_dict(names, values)
    assert info.value.key == name and info.value.code == code
    assert str(info.value).startswith(f"{name}: ")


@pytest.mark.parametrize("name, bad", [("learning_rate", "0.0"), ("lora_r", "0"), ("batch_size", "2.5"),
                                       ("target_modules", "q proj")])
def test_bad_values_are_refused_naming_the_field(name, bad):
    names = form.form_names()
    values = form.spec_to_values(JobSpec(), names)
    values[names.index(name)] = bad
    with pytest.raises(SpecError) as info:
        JobSpec.from_dict(form.values_to_dict(names, values))
    assert info.value.key == name


def test_range_text():
    widgets = {w.name: w for w in form.field_widgets()}
    assert form.range_text(widgets["lora_r"]) == "(1 to 1,024)"
    assert form.range_text(widgets["max_seq_length"]) == "(8 to 1,048,576)"
    assert form.range_text(widgets["max_grad_norm"]) == "(0 to 1,000,000)"
    assert form.range_text(widgets["learning_rate"]) == "(1e-08 to 1)"
    assert form.range_text(widgets["bot_name"]) == ""
    assert form.range_text(widgets["lora_r"], "zh-CN") == "（1 到 1,024）"


def test_fp8_switch_maps_to_base_precision():
    names = form.form_names()
    spec = JobSpec(base_precision="fp8", fused_kernels=True)
    values = form.spec_to_values(spec, names)
    assert values[names.index("base_precision")] is True
    assert JobSpec.from_dict(form.values_to_dict(names, values)).base_precision == "fp8"
    values[names.index("base_precision")] = False
    assert JobSpec.from_dict(form.values_to_dict(names, values)).base_precision == "bf16"
    assert form.field_label("base_precision", "en") == "FP8 base weights (Hopper and newer)"
