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
    groups["Training"] = tuple(n for n in groups["Training"] if n != "seed")
    monkeypatch.setattr(form, "GROUPS", groups)
    placed = dict(form.grouped_widgets())
    assert "seed" in [w.name for w in placed["More"]]
    assert "seed" in form.form_names()


def test_widgets_follow_field_metadata():
    fields = spec_fields()
    widgets = {w.name: w for w in form.field_widgets()}
    for name, widget in widgets.items():
        meta = fields[name].metadata
        if name not in ("model", "target_modules"):
            assert widget.info == meta["help"]
        if "choices" in meta:
            assert widget.kind == "dropdown" and widget.choices == tuple(meta["choices"])
        assert widget.minimum == meta.get("min") and widget.maximum == meta.get("max")
    assert widgets["load_in_4bit"].kind == "checkbox"
    assert widgets["lora_r"].kind == "int" and widgets["learning_rate"].kind == "float"
    assert widgets["model"].kind == "dropdown" and widgets["model"].allow_custom
    assert widgets["model"].default == BUILTIN_MODEL and ".gguf" in widgets["model"].info


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


def test_empty_numbers_fall_back_to_spec_defaults():
    names = form.form_names()
    values = [None] * len(names)
    values[names.index("max_steps")] = 9.0  # gr.Number hands floats over
    spec = JobSpec.from_dict(form.values_to_dict(names, values))
    assert spec.max_steps == 9 and isinstance(spec.max_steps, int)
    assert spec.lora_r == JobSpec().lora_r


@pytest.mark.parametrize("name, bad", [("learning_rate", 0.0), ("lora_r", 0), ("batch_size", 2.5),
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
    assert form.range_text(widgets["lora_r"]) == "(1 to 1024)"
    assert form.range_text(widgets["learning_rate"]) == "(1e-08 to 1)"
    assert form.range_text(widgets["bot_name"]) == ""
