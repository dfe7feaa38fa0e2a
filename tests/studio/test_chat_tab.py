"""The side-by-side chat turn: who gets which message, streaming order, failures as notices."""
import pytest

from studio.chat import Sampling, history_to_messages
from studio.chat_tab import LOADING, respond


class ScriptedEngine:
    """Streams fixed words; records what each call was asked."""

    def __init__(self, fail_on=None):
        self.calls, self.loaded, self.fail_on = [], set(), fail_on

    def is_loaded(self, model_id, adapter_dir):
        return (model_id, adapter_dir) in self.loaded

    def stream(self, model_id, adapter_dir, messages, sampling, use_adapter=True):
        self.calls.append((model_id, adapter_dir, messages, sampling, use_adapter))
        self.loaded.add((model_id, adapter_dir))
        word = "tuned" if use_adapter and adapter_dir else "base"
        if self.fail_on == word:
            raise RuntimeError("model exploded")
        text = ""
        for piece in (word, " answer", " here"):
            text += piece
            yield text


SAMPLING = Sampling(temperature=0.3, top_p=0.8, max_new_tokens=9, seed=5)


def test_tuned_streams_first_then_base_with_same_settings():
    engine = ScriptedEngine()
    frames, tuned_seen, base_seen = [], [], []
    for frame in respond(engine, "m", "/a", "hi", [], [], SAMPLING, system="sys"):
        frames.append(frame)  # Gradio renders each yield at once, so record what it would show
        tuned_seen.append(frame[1][-1]["content"])
        base_seen.append(frame[2][-1]["content"])
    tuned_seen = [t for i, t in enumerate(tuned_seen) if i == 0 or t != tuned_seen[i - 1]]
    base_seen = [b for i, b in enumerate(base_seen) if i == 0 or b != base_seen[i - 1]]
    # first load shows a notice, then the text grows; base starts only after tuned is done
    assert tuned_seen == ["hi", LOADING, "tuned", "tuned answer", "tuned answer here"]
    assert base_seen == ["hi", "", "base", "base answer", "base answer here"]
    assert base_seen.count("hi") == 1 and len(frames) == 1 + 4 + 4
    _, tuned, base = frames[-1]
    assert [m["content"] for m in tuned] == ["hi", "tuned answer here"]
    assert [m["content"] for m in base] == ["hi", "base answer here"]
    (m1, a1, msgs1, s1, use1), (m2, a2, msgs2, s2, use2) = engine.calls
    assert (use1, use2) == (True, False) and a1 == a2 == "/a" and s1 is s2 is SAMPLING
    assert msgs1 == msgs2 == [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]
    assert all(f[0] == "" for f in frames)  # the input box is cleared


def test_without_adapter_only_base_answers_and_history_carries_on():
    engine = ScriptedEngine()
    earlier = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    *_, (_, tuned, base) = respond(engine, "m", None, "next", [], earlier, SAMPLING)
    assert tuned == [] and len(engine.calls) == 1
    assert engine.calls[0][2] == [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                                  {"role": "user", "content": "next"}]
    assert base[-1]["content"] == "base answer here"


def test_failure_becomes_a_notice_kept_out_of_the_next_prompt():
    engine = ScriptedEngine(fail_on="tuned")
    with pytest.warns(UserWarning, match="model exploded"):
        *_, (_, tuned, base) = respond(engine, "m", "/a", "hi", [], [], SAMPLING)
    assert tuned[-1]["metadata"] and "model exploded" in tuned[-1]["content"]
    assert base[-1]["content"] == "base answer here"  # the other side still answers
    assert history_to_messages(tuned) == [{"role": "user", "content": "hi"}]


def test_blank_message_does_nothing():
    engine = ScriptedEngine()
    frames = list(respond(engine, "m", "/a", "  ", [], [], SAMPLING))
    assert len(frames) == 1 and engine.calls == []
