"""The side-by-side chat turn: who gets which message, both answers growing together, failures
as notices."""
import gradio as gr
import pytest

from studio.chat import Sampling, history_to_messages
from studio.chat_tab import readable_model, respond
from studio.i18n import t


class ScriptedEngine:
    """Streams fixed words for every row of a batch at once; records what it was asked."""

    def __init__(self, fail=False):
        self.calls, self.loaded, self.fail = [], set(), fail

    def is_loaded(self, model_id, adapter_dir):
        return (model_id, adapter_dir) in self.loaded

    def stream_batch(self, model_id, adapter_dir, conversations, sampling, use_adapter):
        self.calls.append((model_id, adapter_dir, conversations, sampling, use_adapter))
        self.loaded.add((model_id, adapter_dir))
        if self.fail:
            raise RuntimeError("model exploded")
        words = ["tuned" if use and adapter_dir else "base" for use in use_adapter]
        for shape in ("{}", "{} answer", "{} answer here"):
            yield [shape.format(word) for word in words]


SAMPLING = Sampling(temperature=0.3, top_p=0.8, max_new_tokens=9, seed=5)


def test_tuned_and_base_stream_together_with_the_same_settings():
    engine = ScriptedEngine()
    frames = [(f[1][-1]["content"], f[2][-1]["content"]) for f in
              respond(engine, "m", "/a", "hi", [], [], SAMPLING, system="sys")]
    # the user turn, the loading notice on both sides, then both texts grow in the same frames
    assert frames == [("hi", "hi"), (t("chat.loading"), t("chat.loading")), ("tuned", "base"),
                      ("tuned answer", "base answer"), ("tuned answer here", "base answer here")]
    ((model, adapter, conversations, sampling, use_adapter),) = engine.calls  # one generate for both
    assert (model, adapter, sampling, use_adapter) == ("m", "/a", SAMPLING, [True, False])
    expected = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]
    assert conversations == [expected, expected]
    *_, (prompt, tuned, base) = respond(engine, "m", "/a", "again", [], [], SAMPLING)
    assert prompt == "" and tuned[1]["content"] == "tuned answer here"  # loaded now: no notice


def test_served_elsewhere_asks_the_engine_for_the_base_template():
    """Issue 42: the "served elsewhere" switch renders the tuned row with the base's tokenizer."""
    class Recording(ScriptedEngine):
        def stream_batch(self, *args, base_template=False):
            self.base_template = base_template
            yield from super().stream_batch(*args)
    engine = Recording()
    list(respond(engine, "m", "/a", "hi", [], [], SAMPLING, served_elsewhere=True))
    assert engine.base_template is True
    list(respond(engine, "m", "/a", "hi", [], [], SAMPLING))
    assert engine.base_template is False


def test_a_model_unloaded_for_a_job_says_so_when_it_loads_again():
    engine = ScriptedEngine()
    engine.released_for = "job 'tiny · identity'"
    frames = [f[2][-1]["content"] for f in respond(engine, "m", None, "hi", [], [], SAMPLING)]
    assert frames[1] == t("chat.reloading", job="job 'tiny · identity'") and "unloaded" in frames[1]
    assert engine.released_for == ""  # said once


def test_without_adapter_only_base_answers_and_history_carries_on():
    engine = ScriptedEngine()
    earlier = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    *_, (_, tuned, base) = respond(engine, "m", None, "next", [], earlier, SAMPLING)
    assert tuned == [] and len(engine.calls) == 1 and engine.calls[0][4] == [False]
    assert engine.calls[0][2] == [[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                                   {"role": "user", "content": "next"}]]
    assert base[-1]["content"] == "base answer here"


def test_failure_becomes_a_notice_kept_out_of_the_next_prompt():
    engine = ScriptedEngine(fail=True)
    with pytest.warns(UserWarning, match="model exploded"):
        *_, (_, tuned, base) = respond(engine, "m", "/a", "hi", [], [], SAMPLING, lang="zh-CN")
    for history in (tuned, base):
        assert history[-1]["metadata"]["title"] == t("chat.failed_title", "zh-CN")
        assert "model exploded" in history[-1]["content"]
        assert history_to_messages(history) == [{"role": "user", "content": "hi"}]


def test_blank_message_does_nothing():
    engine = ScriptedEngine()
    frames = list(respond(engine, "m", "/a", "  ", [], [], SAMPLING))
    assert len(frames) == 1 and engine.calls == []


def test_a_model_path_outside_the_studio_is_refused_with_a_notice(tmp_path, monkeypatch):
    class Ctx:
        data_dir = tmp_path / "data"
    monkeypatch.delenv("FUSETUNE_ALLOW_DIRS", raising=False)
    export = Ctx.data_dir / "jobs" / "j1" / "exports" / "m-q8_0.gguf"
    export.parent.mkdir(parents=True)
    export.write_bytes(b"GGUF")
    assert readable_model(Ctx, str(export)) == str(export.resolve())
    with pytest.warns(UserWarning, match=r"\(model\).*--allow-dir"):
        assert readable_model(Ctx, str(tmp_path)) is None


def test_the_newest_adapter_is_picked_until_the_user_picks_one(monkeypatch):
    """The page picks the newest finished job's adapter at load; a job that finishes later is picked
    when the Chat tab opens again, unless the user chose an adapter themselves."""
    from studio import chat_tab
    tab = chat_tab.ChatTab(adapter=None, model=None)
    jobs = [("A", "job-a")]
    monkeypatch.setattr(chat_tab, "adapter_choices", lambda ctx, lang="en": [("none", "none")] + list(jobs))
    monkeypatch.setattr(chat_tab, "model_choices", lambda ctx: [])
    adapter, _model, auto = tab.refresh(None)                      # page load
    assert adapter["value"] == "job-a" and auto == "job-a"
    jobs.insert(0, ("B", "job-b"))                                   # a newer job finished
    adapter, _model, auto = tab.refresh(None, "en", "job-a", "job-a")
    assert adapter["value"] == "job-b" and auto == "job-b"
    jobs.insert(0, ("C", "job-c"))
    adapter, _model, auto = tab.refresh(None, "en", "job-a", "")    # the user picked A: it stays
    assert "value" not in adapter


def test_a_job_that_ends_while_chat_is_open_joins_the_list(monkeypatch):
    """Issue 40 item 10: the Jobs poll's table change refreshes the adapter list only when the
    finished jobs changed; a running job's polls send nothing."""
    from studio import chat_tab
    tab = chat_tab.ChatTab(adapter=None, model=None)
    jobs = [("A", "job-a")]
    monkeypatch.setattr(chat_tab, "adapter_choices", lambda ctx, lang="en": [("none", "none")] + list(jobs))
    monkeypatch.setattr(chat_tab, "model_choices", lambda ctx: [])
    adapter, _model, auto, known = tab.follow_jobs(None, "en", "job-a", "job-a", None)
    assert adapter["value"] == "job-a" and known == [("none", "none"), ("A", "job-a")]
    assert tab.follow_jobs(None, "en", "job-a", "job-a", known) == [gr.skip()] * 4   # a poll of a running job
    jobs.insert(0, ("B", "job-b"))                                                      # B ended
    adapter, _model, auto, known = tab.follow_jobs(None, "en", "job-a", "job-a", known)
    assert adapter["value"] == "job-b" and auto == "job-b" and ("B", "job-b") in known

