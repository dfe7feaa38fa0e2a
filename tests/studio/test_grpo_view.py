"""The studio's grpo views: the reward curve per step and name, the sampled completions table,
and the preview of prompt data (the prompt as the model sees it, the columns the rewards get)."""
import json

from jobs.data.prompts import preview_rows
from jobs.io.events import summarize_events
from jobs.spec import JobSpec
from studio import jobs_view as view
from studio import render


def test_reward_frame_has_the_mean_and_each_named_reward():
    events = [{"type": "step", "step": s, "loss": 0.0, "reward_mean": 0.1 * s, "reward/answer": 0.2 * s,
               "reward/format": 1.0} for s in (1, 2)]
    frame = view.reward_frame(summarize_events(events), "en")
    assert sorted(set(frame["series"])) == ["answer", "format", "mean reward"]
    assert frame[frame["series"] == "answer"]["reward"].tolist() == [0.2, 0.4]
    assert view.reward_frame(summarize_events([{"type": "step", "step": 1, "loss": 1.0}]), "en").empty


def test_completions_frame_shows_the_latest_first_with_their_rewards(tmp_path):
    lines = [{"step": s, "prompt": "p", "completion": f"c{s}", "reward": s, "rewards": {"answer": s}} for s in range(12)]
    (tmp_path / "completions.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n{\"step\": 12, ")
    frame = view.completions_frame(str(tmp_path), "zh-CN")
    assert len(frame) == view.COMPLETIONS_SHOWN - 1   # the half-written last line is skipped
    assert frame.iloc[0].tolist() == [11, "p", "c11", 11, "answer 11"] and "回答" in frame.columns
    assert list(frame.columns[:2]) == ["步数", "提示"]
    long = {"step": 1, "prompt": "system part " * 40 + "What is 2 + 3?", "completion": "5", "reward": 1}
    (tmp_path / "completions.jsonl").write_text(json.dumps(long) + "\n")
    shown = view.completions_frame(str(tmp_path), "en").iloc[0, 1]
    assert shown.endswith("What is 2 + 3?") and shown.startswith("…") and len(shown) == view.PROMPT_SHOWN + 1
    assert view.completions_frame(str(tmp_path / "none"), "en").empty


def test_preview_of_prompt_data_shows_the_rendered_prompt_and_the_reward_columns(tmp_path):
    from tests.tiny import make_tiny_model
    tiny_model = make_tiny_model(tmp_path / "tiny")
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"question": "What is 2 + 3?", "answer": "5", "level": 1}) + "\n")
    spec = JobSpec.from_dict({"model": str(tiny_model), "method": "grpo", "dataset": str(data)})
    rows = preview_rows(spec, n=3)
    assert len(rows) == 1 and rows[0]["columns"] == {"question": "What is 2 + 3?", "answer": "5", "level": 1}
    text = rows[0]["segments"][0][0]
    assert "<|im_start|>user\nWhat is 2 + 3?" in text and text.endswith("<|im_start|>assistant\n")
    html = render.preview_html(rows, "en")
    assert "answer = 5, level = 1" in html


def test_a_reward_file_is_uploaded_only_with_allow_reward_code(tmp_path, monkeypatch):
    import pytest
    from jobs.checks.access import ALLOW_REWARD_CODE_ENV
    from jobs.spec import SpecError
    from studio.train_tab import known_datasets, store_reward_upload
    source = tmp_path / "my rewards.py"
    source.write_text("def r(prompts, completions, **kw):\n    return [1.0] * len(completions)\n")
    monkeypatch.delenv(ALLOW_REWARD_CODE_ENV, raising=False)
    with pytest.raises(SpecError, match="reward_file.*--allow-reward-code"):
        store_reward_upload(tmp_path / "data", str(source))
    monkeypatch.setenv(ALLOW_REWARD_CODE_ENV, "1")
    stored = store_reward_upload(tmp_path / "data", str(source))
    assert stored.parent == tmp_path / "data" / "rewards" / "uploads" and stored.suffix == ".py"
    assert "builtin:arithmetic" in known_datasets(tmp_path / "data")
