"""YAML configs whose aliases expand past a bound are refused fast, naming the key (issue 23 item 7)."""
import time

import pytest

from jobs.spec import JobSpec, SpecError
from jobs.yaml_bounded import MAX_YAML_VALUES, load_config_yaml
from tests.jobs.train.job_runs import one_line, run_cli


def _bomb(levels: int, key: str = "target_modules") -> str:
    """`key` holding `levels` anchored lists, each of 9 references to the one before (the shape of
    the issue's file): 9**levels values once written out, a few hundred bytes as YAML."""
    parts = ['&l0 [q_proj, q_proj, q_proj, q_proj, q_proj, q_proj, q_proj, q_proj, q_proj]']
    for level in range(1, levels):
        parts.append(f"&l{level} [" + ", ".join([f"*l{level - 1}"] * 9) + "]")
    return f"{key}: [{', '.join(parts)}]\n"


def test_an_alias_bomb_is_refused_at_once_naming_the_key():
    began = time.time()
    with pytest.raises(SpecError) as refused:
        load_config_yaml(_bomb(9), "job.yaml")
    assert time.time() - began < 2
    assert refused.value.key == "target_modules"
    assert str(refused.value) == (f"target_modules: job.yaml: key 'target_modules' expands through aliases to "
                                  f"more than {MAX_YAML_VALUES:,} values, over the limit of {MAX_YAML_VALUES:,}: write its values out without "
                                  "YAML aliases (&anchor / *alias)")


def test_small_aliases_self_reference_and_deep_nesting(tmp_path):
    assert load_config_yaml("a: &m [q_proj, v_proj]\ntarget_modules: *m\n", "x") == {
        "a": ["q_proj", "v_proj"], "target_modules": ["q_proj", "v_proj"]}
    assert load_config_yaml("", "x") is None
    with pytest.raises(SpecError, match="key 'target_modules' refers to itself through an alias"):
        load_config_yaml("target_modules: &m [q_proj, *m]\n", "x")
    for text in ("target_modules: " + "[" * 300 + "]" * 300, "[" * 5000 + "]" * 5000):
        with pytest.raises(SpecError, match="nests more than 100 levels deep: a job config is one flat mapping"):
            load_config_yaml(text, "x")
    path = tmp_path / "c.yaml"
    path.write_text(_bomb(9))
    with pytest.raises(SpecError, match="expands through aliases"):
        JobSpec.from_yaml(path)


def test_the_cli_refuses_an_alias_bomb_in_one_line(tmp_path):
    config = tmp_path / "bomb.yaml"
    config.write_text(_bomb(6))  # 9**6 values: few enough for the old loader to survive
    proc = run_cli(str(config), "--dry-run")
    assert proc.returncode == 2
    assert one_line(proc.stderr).startswith(f"fusetune: config error: target_modules: {config}: key "
                                            "'target_modules' expands through aliases to more than")


def test_a_key_written_twice_is_refused_naming_it_and_both_lines(tmp_path):
    """Issue 36 item 6: PyYAML keeps the last of two equal keys without a word."""
    config = tmp_path / "job.yaml"
    config.write_text("learning_rate: 0.001\nmethod: sft\n# tuned later\nlearning_rate: 0.1\n")
    with pytest.raises(SpecError) as refused:
        JobSpec.from_yaml(config)
    assert refused.value.key == "learning_rate"
    assert f"{config}: the key 'learning_rate' is written twice, on line 1 and on line 4" in str(refused.value)
    with pytest.raises(SpecError, match="the key 'a' is written twice, on line 2 and on line 3"):
        load_config_yaml("x:\n  a: 1\n  a: 2\n", "nested.yaml")
    with pytest.raises(SpecError, match="the key 'seed' is written twice, on line 1 and on line 1"):
        load_config_yaml("{seed: 1, seed: 2}", "flow.yaml")
    assert load_config_yaml("base: &b {a: 1}\nother:\n  <<: *b\n  b: 2\n", "merge.yaml")["other"] == {"a": 1, "b": 2}
