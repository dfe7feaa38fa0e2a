"""GRPO's rewards: the built-in ones, a reward file, a reward that raises, and the read policy
that keeps a reward file (code) outside the studio's allowed folders from ever running."""
import pytest

from jobs.checks.access import DataAccess
from jobs.checks.preflight import run_preflight
from jobs.spec import JobSpec, SpecError
from jobs.train.rewards import builtin
from jobs.train.rewards.score import RewardError, RewardSet


def test_answer_is_extracted_from_boxed_tags_or_the_last_number_and_compared_as_a_number():
    completions = ["so \\boxed{1,000}", "<answer> 7.0 </answer>", "3 then 4 so 12", "no number", "<answer>x</answer>"]
    expected = ["1000", "7", "12", "5", "X"]
    assert builtin.answer([], completions, answer=expected) == [1.0, 1.0, 1.0, 0.0, 1.0]
    assert builtin.answer([], [[{"role": "assistant", "content": "<answer>9</answer>"}]], answer=["8"]) == [0.0]


def test_format_think_format_length_and_json():
    assert builtin.format([], ["<answer>3</answer>", "<answer>3", "3"]) == [1.0, 0.5, 0.0]
    assert builtin.format([], ["abc", "xyz"], format_regex=["^a", "^a"]) == [1.0, 0.0]
    assert builtin.think_format([], ["<think>hm</think>\n<answer>1</answer>", "<answer>1</answer>"]) == [1.0, 0.0]
    assert builtin.length([], ["a", "b"], completion_lengths=[8, 16], max_completion_length=16) == [-0.5, -1.0]
    assert builtin.json_reward([], ['{"a": 1}', "```json\n[1, 2]\n```", "{nope"]) == [1.0, 1.0, 0.0]


def test_a_reward_file_gives_its_public_functions_weighted(tmp_path):
    path = tmp_path / "rewards.py"
    path.write_text("import math\n\ndef shout(prompts, completions, **kw):\n    return [c.count('!') for c in completions]\n\n"
                    "def _helper():\n    pass\n")
    spec = JobSpec.from_dict({"method": "grpo", "dataset": "builtin:arithmetic", "reward_file": str(path),
                              "rewards": "shout:2, format"})
    rewards = RewardSet.for_spec(spec)
    assert rewards.names == ["shout", "format"]
    totals, each = rewards.score(["p", "p"], ["hi!!", "<answer>1</answer>"], {}, [3, 4], 8)
    assert each == {"shout": [2.0, 0.0], "format": [0.0, 1.0]} and totals == [4.0, 1.0]
    with pytest.raises(SpecError, match="unknown reward 'math'"):
        RewardSet(["math"], str(path))


def test_a_reward_that_raises_fails_with_its_name_and_logs_the_traceback(tmp_path):
    path = tmp_path / "bad.py"
    path.write_text("def broken(prompts, completions, **kw):\n    raise KeyError('test_cases')\n")
    lines = []
    rewards = RewardSet(["broken:1"], str(path), log=lines.append)
    with pytest.raises(RewardError, match="reward broken raised KeyError") as info:
        rewards.score(["p"], ["c"], {}, [1], 4)
    assert info.value.key == "rewards" and "Traceback" in lines[0] and "bad.py" in lines[0]


def test_rewards_key_is_parsed_and_checked_by_name():
    spec = JobSpec.from_dict({"method": "grpo", "dataset": "builtin:arithmetic", "rewards": ["answer", "format:0.5"]})
    assert spec.rewards == "answer:1, format:0.5"
    with pytest.raises(SpecError, match="rewards"):
        JobSpec.from_dict({"method": "grpo", "dataset": "builtin:arithmetic", "rewards": "answer:lots"})
    with pytest.raises(SpecError, match="dataset.*method: grpo"):
        JobSpec.from_dict({"dataset": "builtin:arithmetic"})


def test_a_reward_file_outside_the_allowed_folders_is_refused_before_the_job_starts(tmp_path):
    data_dir = tmp_path / "data"
    (data_dir / "datasets").mkdir(parents=True)
    (data_dir / "datasets" / "p.jsonl").write_text('{"prompt": "hi", "answer": "1"}\n')
    outside = tmp_path / "elsewhere" / "r.py"
    outside.parent.mkdir()
    outside.write_text("def r(prompts, completions, **kw):\n    return [0.0] * len(completions)\n")
    spec = JobSpec.from_dict({"method": "grpo", "dataset": str(data_dir / "datasets" / "p.jsonl"),
                              "reward_file": str(outside)})
    access = DataAccess.for_studio(data_dir, allow_dirs=[])
    report = run_preflight(spec, data_dir=data_dir, access=access)
    assert not report.ok and report.problems[0].key == "reward_file", report.problems
    assert "not available to the studio" in report.problems[0].message
    allowed = DataAccess.for_studio(data_dir, allow_dirs=[str(outside.parent)])
    assert allowed.reward_file(str(outside)) == str(outside.resolve())


def test_preflight_reads_reward_names_from_the_file_without_running_it(tmp_path):
    path = tmp_path / "own" / "r.py"
    path.parent.mkdir()
    path.write_text("raise SystemExit('never run at preflight')\n\ndef mine(prompts, completions, **kw):\n    return []\n")
    data = tmp_path / "p.jsonl"
    data.write_text('{"question": "2+2?", "answer": "4"}\n')
    spec = JobSpec.from_dict({"method": "grpo", "dataset": str(data), "reward_file": str(path),
                              "rewards": "mine, nope", "model": "builtin:smollm2-135m-instruct"})
    from jobs.checks.grpo import check_grpo
    from jobs.checks.preflight import DatasetSummary, PreflightReport
    report = PreflightReport(spec=spec)
    check_grpo(spec, tmp_path / "data", report, DatasetSummary)
    assert [p.key for p in report.problems] == ["rewards"] and "'nope'" in report.problems[0].message
    assert "answer" in report.notes[0]
    refused = PreflightReport(spec=spec)   # the same file inside the data dir: the trainer would refuse it
    check_grpo(spec, tmp_path, refused, DatasetSummary)
    assert [p.key for p in refused.problems] == ["reward_file"] and "never runs" in refused.problems[0].message


def test_preflight_names_every_bad_prompt_row_as_sft_does(tmp_path):
    """Issue 36 item 6: the GRPO preflight named only the first bad row; the rows without a prompt
    and the rows the reader refused are named together, by row and line."""
    data = tmp_path / "p.jsonl"
    data.write_text('{"question": "2+2?", "answer": "4"}\n{"answer": "5"}\n{"prompt": ""}\nnot json\n'
                    '{"messages": [{"role": "assistant", "content": "hi"}]}\n{"prompt": "1+1?", "answer": "2"}\n')
    spec = JobSpec.from_dict({"method": "grpo", "dataset": str(data), "model": "builtin:smollm2-135m-instruct"})
    from jobs.checks.grpo import check_grpo
    from jobs.checks.preflight import DatasetSummary, PreflightReport
    report = PreflightReport(spec=spec)
    check_grpo(spec, tmp_path, report, DatasetSummary)
    assert [p.key for p in report.problems] == ["dataset"]
    message = report.problems[0].message
    assert message.startswith("p.jsonl has 4 bad rows: row 2 (line 2): has no prompt: a row needs a `prompt` column")
    assert "row 3 (line 3): `prompt` is empty" in message and "row 4 (line 4) is not valid JSON" in message
    assert "row 5 (line 5): `messages` has no user turn" in message


def test_the_builtin_prompt_task_passes_the_studio_read_policy(tmp_path):
    assert DataAccess.for_studio(tmp_path, allow_dirs=[]).dataset("builtin:arithmetic") == "builtin:arithmetic"


# ---- the rule for code (issue 36 item 1, jobs/checks/reward_code.py) ----------------------------
MARKER_CODE = "import pathlib\npathlib.Path(__file__).with_suffix('.ran').write_text('ran')\n\n" \
              "def r(prompts, completions, **kw):\n    return [0.0] * len(completions)\n"


def _reward_in(folder, name="evil.py"):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(MARKER_CODE)
    return folder / name


def test_the_rule_for_code_refuses_what_the_studio_wrote_on_the_resolved_path(tmp_path, monkeypatch):
    from jobs.checks.reward_code import ALLOW_REWARD_CODE_ENV, reward_code_problem
    monkeypatch.delenv(ALLOW_REWARD_CODE_ENV, raising=False)
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path / "elsewhere-cache"))
    data = tmp_path / "home" / "data"
    own = _reward_in(data / "rewards", "mine.py")
    uploaded = _reward_in(data / "rewards" / "uploads")
    assert reward_code_problem(own, data) is None                                     # the operator's folder
    assert reward_code_problem(_reward_in(tmp_path / "home" / "mine"), data) is None  # an --allow-dir of theirs
    for studio_written in (data / "cache" / "gradio" / "abc" / "evil.py", data / "datasets" / "evil.py",
                           data / "jobs" / "j1" / "evil.py", tmp_path / "elsewhere-cache" / "x" / "evil.py"):
        assert "never runs such a file as code" in reward_code_problem(studio_written, data)
    assert "--allow-reward-code" in reward_code_problem(uploaded, data)
    link = data / "rewards" / "link.py"   # the operator's folder, linking into an upload: the target counts
    link.symlink_to(data / "datasets" / "evil.py")
    assert "never runs" in reward_code_problem(link, data)
    assert "never runs" in reward_code_problem(data / "rewards" / ".." / "datasets" / "evil.py", data)
    monkeypatch.setenv(ALLOW_REWARD_CODE_ENV, "1")
    assert reward_code_problem(uploaded, data) is None                                # the operator said so
    assert "never runs" in reward_code_problem(data / "cache" / "gradio" / "evil.py", data)


def test_the_trainer_refuses_an_uploaded_reward_file_without_running_it(tmp_path, tiny_model, in_process_cli,
                                                                         monkeypatch, capsys):
    """`python -m jobs.train` (in process) on a config naming a file in the data dir's Gradio cache:
    exit 2, an error event naming reward_file and the fix, and the file's code never ran."""
    import json

    import yaml

    from jobs.checks.reward_code import ALLOW_REWARD_CODE_ENV
    from jobs.train.cli import EXIT_CONFIG, main
    monkeypatch.delenv(ALLOW_REWARD_CODE_ENV, raising=False)
    data = tmp_path / "data"
    evil = _reward_in(data / "cache" / "gradio" / "0123abcd")
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump({"method": "grpo", "dataset": "builtin:arithmetic", "model": str(tiny_model),
                                      "reward_file": str(evil), "output_dir": str(tmp_path / "out"), "max_steps": 1}))
    assert main([str(config), "--data-dir", str(data)]) == EXIT_CONFIG
    assert not evil.with_suffix(".ran").exists()
    events = [json.loads(line) for line in (tmp_path / "out" / "events.jsonl").read_text().splitlines()]
    assert events[-1]["type"] == "error" and events[-1]["kind"] == "config"
    assert events[-1]["message"].startswith("reward_file: ") and "--allow-reward-code" in events[-1]["message"]
    assert "Traceback" not in capsys.readouterr().err
