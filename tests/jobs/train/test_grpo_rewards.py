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
    path = tmp_path / "r.py"
    path.write_text("raise SystemExit('never run at preflight')\n\ndef mine(prompts, completions, **kw):\n    return []\n")
    data = tmp_path / "p.jsonl"
    data.write_text('{"question": "2+2?", "answer": "4"}\n')
    spec = JobSpec.from_dict({"method": "grpo", "dataset": str(data), "reward_file": str(path),
                              "rewards": "mine, nope", "model": "builtin:smollm2-135m-instruct"})
    from jobs.checks.grpo import check_grpo
    from jobs.checks.preflight import DatasetSummary, PreflightReport
    report = PreflightReport(spec=spec)
    check_grpo(spec, tmp_path, report, DatasetSummary)
    assert [p.key for p in report.problems] == ["rewards"] and "'nope'" in report.problems[0].message
    assert "answer" in report.notes[0]


def test_the_builtin_prompt_task_passes_the_studio_read_policy(tmp_path):
    assert DataAccess.for_studio(tmp_path, allow_dirs=[]).dataset("builtin:arithmetic") == "builtin:arithmetic"
