"""The tokenized dataset cache (jobs/data/cache.py): the same examples as encoding in memory, built
once and reused, lazy and bounded, bad rows still named by number."""
import json
from pathlib import Path

import pytest

from jobs.data import cache, encode
from jobs.data.dataset import DataError, load_conversations
from jobs.data.packing import BatchPlan
from jobs.io.events import EventWriter, read_events
from jobs.spec import JobSpec
from jobs.train.evaluate import split_holdout
from tests.jobs.train.job_runs import run_job
from tests.tiny import make_tokenizer


def _rows(n: int) -> list[dict]:
    rows = []
    for i in range(n):
        if i % 3 == 0:
            rows.append({"messages": [{"role": "user", "content": f"What is {i} plus one?"},
                                      {"role": "assistant", "content": f"{i + 1}, 名字 😀"}]})
        else:
            rows.append({"messages": [{"role": "system", "content": "Be brief."},
                                      {"role": "user", "content": f"Question {i}?" * (1 + i % 4)},
                                      {"role": "assistant", "content": f"Answer {i}."},
                                      {"role": "user", "content": "And?"},
                                      {"role": "assistant", "content": "The capital of France is Paris." * (i % 3)}]})
    return rows


def _write(path, rows) -> str:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return str(path)


@pytest.fixture
def tokenizer():
    return make_tokenizer()


def _in_memory(spec, tokenizer):
    conversations = load_conversations(spec, tokenizer)
    return encode.encode_all(tokenizer, conversations, spec.max_seq_length, log=lambda _l: None)


def test_the_cache_holds_exactly_what_in_memory_encoding_gives(tmp_path, tokenizer, monkeypatch):
    monkeypatch.setattr(cache, "CHUNK_ROWS", 7)   # several chunks, in several workers
    monkeypatch.setattr(cache, "SMALL_ROWS", 0)
    monkeypatch.setattr(cache, "SMALL_BYTES", 0)
    rows = [r for r in _rows(40) if len(r["messages"]) > 2]   # some have no answer within 52 tokens: dropped
    spec = JobSpec(dataset=_write(tmp_path / "d.jsonl", rows), dataset_format="messages", max_seq_length=52)
    store = cache.tokenized_examples(spec, tokenizer, tmp_path / "data", log=lambda _l: None)
    expected = _in_memory(spec, tokenizer)
    assert isinstance(store, cache.TokenStore)
    assert len(store) == len(expected)
    assert [(e.input_ids, e.labels) for e in store] == [(e.input_ids, e.labels) for e in expected]
    assert store.lengths == [len(e.input_ids) for e in expected]


def test_a_second_job_reuses_the_cache_and_says_so(tmp_path, tokenizer, monkeypatch):
    spec = JobSpec(dataset=_write(tmp_path / "d.jsonl", _rows(30)), max_seq_length=256)
    lines: list[str] = []
    first = cache.tokenized_examples(spec, tokenizer, tmp_path / "data", log=lines.append)
    monkeypatch.setattr(cache, "build", lambda *a, **k: pytest.fail("the cache was built again"))
    second = cache.tokenized_examples(spec, tokenizer, tmp_path / "data", log=lines.append)
    assert any("reusing" in line for line in lines)
    assert [e.input_ids for e in first] == [e.input_ids for e in second]
    other = JobSpec(dataset=spec.dataset, max_seq_length=200)   # another key: built anew
    monkeypatch.undo()
    assert len(cache.tokenized_examples(other, tokenizer, tmp_path / "data", log=lines.append)) == 30
    assert sum(line.startswith("tokenizing ") for line in lines) == 2


def test_a_changed_file_or_template_is_a_new_key(tmp_path, tokenizer):
    path = tmp_path / "d.jsonl"
    spec = JobSpec(dataset=_write(path, _rows(5)))
    key = cache.cache_key(path, spec, tokenizer)
    _write(path, _rows(6))
    assert cache.cache_key(path, spec, tokenizer) != key
    tokenizer.chat_template = tokenizer.chat_template + " "
    assert len({key, cache.cache_key(path, spec, tokenizer)}) == 2


def test_bad_rows_are_named_by_number_and_nothing_is_cached(tmp_path, tokenizer, monkeypatch):
    monkeypatch.setattr(cache, "CHUNK_ROWS", 4)
    rows = _rows(12)
    rows[9] = {"messages": [{"role": "user", "content": "no answer"}]}
    lines = [json.dumps(r) for r in rows]
    lines[5] = "{not json"
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    spec = JobSpec(dataset=str(path), dataset_format="auto")
    with pytest.raises(DataError) as caught:
        cache.tokenized_examples(spec, tokenizer, tmp_path / "data", log=lambda _l: None)
    message = str(caught.value)
    assert "row 6 (line 6)" in message and "row 10" in message, message
    assert not [p for p in cache.tokenized_root(tmp_path / "data").iterdir() if p.is_dir()]


def test_progress_goes_to_the_log_and_phase_events(tmp_path, tokenizer, monkeypatch):
    monkeypatch.setattr(cache, "PROGRESS_EVERY_S", 0.0)
    monkeypatch.setattr(cache, "CHUNK_ROWS", 5)
    spec = JobSpec(dataset=_write(tmp_path / "d.jsonl", _rows(20)))
    events, lines = EventWriter(tmp_path / "job"), []
    cache.tokenized_examples(spec, tokenizer, tmp_path / "data", log=lines.append, events=events)
    phases = [e for e in read_events(tmp_path / "job") if e["type"] == "phase"]
    assert phases[0]["phase"] == "tokenizing" and phases[0]["done"] == 0 and phases[0]["total"] == 20
    assert phases[-1]["done"] == phases[-1]["total"] == 20
    assert any(line.strip().startswith("tokenizing: ") for line in lines), lines


def test_holdout_and_batch_plans_are_the_same_on_the_store(tmp_path, tokenizer):
    spec = JobSpec(dataset=_write(tmp_path / "d.jsonl", _rows(45)), max_seq_length=256)
    store = cache.tokenized_examples(spec, tokenizer, tmp_path / "data", log=lambda _l: None)
    listed = list(store)
    train, held = split_holdout(store, 0.2, seed=3)
    train_list, held_list = split_holdout(listed, 0.2, seed=3)
    assert [e.input_ids for e in held] == [e.input_ids for e in held_list]
    assert train.lengths == [len(e.input_ids) for e in train_list]
    for packed in (False, True):
        lazy = BatchPlan(train, 4, 256, packed, seed=1, pad_id=0, accumulation=2)
        eager = BatchPlan(train_list, 4, 256, packed, seed=1, pad_id=0, accumulation=2)
        for index in range(lazy.per_epoch + 2):
            a, b = lazy.batch_at(index)[1], eager.batch_at(index)[1]
            assert all((a.tensors[k] == b.tensors[k]).all() for k in a.tensors)


TRIMMING = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] | trim }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
BRANCHING = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if 'Paris' in m['content'] %}[geo]{% endif %}"
             "{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.mark.parametrize("template", ["own", "mistral", "trimming", "branching"])
def test_the_fast_encoder_equals_encode_for_any_template(template, monkeypatch):
    from jobs.data import fast_template
    from jobs.data.dataset import to_conversations
    from tests.tiny import make_spm_tokenizer
    monkeypatch.setattr(fast_template, "VERIFY_EVERY", 1 << 30)   # only the first row of a shape is checked
    tokenizer = make_spm_tokenizer() if template == "mistral" else make_tokenizer()
    tokenizer.chat_template = {"trimming": TRIMMING, "branching": BRANCHING}.get(template, tokenizer.chat_template)
    rows = _rows(30) + [{"messages": [{"role": "user", "content": "  padded  "},
                                      {"role": "assistant", "content": " \x00ft0\x00 \n sentinel-like "}]}]
    if template == "mistral":   # no system turns there
        rows = [{"messages": [m for m in r["messages"] if m["role"] != "system"]} for r in rows]
    conversations = to_conversations(rows, "messages")
    fast = fast_template.Encoder(tokenizer, 64).encode_many(conversations)
    slow = [encode.encode(tokenizer, c, 64) for c in conversations]
    if template == "branching":   # content-dependent branches are only seen on verified rows: the limit
        fast = [fast_template.Encoder(tokenizer, 64).encode_many([c])[0] for c in conversations]
    assert [(e.input_ids, e.labels) for e in fast] == [(e.input_ids, e.labels) for e in slow]


@pytest.mark.slow
def test_a_200_mb_dataset_is_tokenized_with_bounded_memory_and_reused(tmp_path):
    """The issue's case: ~804k short chat rows (200 MB). Bounded memory: the builder keeps the lengths,
    not the rows; the second job opens the cache. Time to the first step goes to bench/dataset_scale.py
    (bench/results/dataset_scale.jsonl). The issue's target, the first step within 90 s on 2 cores, is not
    shown yet (bench/NOTES.md); this bound ($FUSETUNE_SCALE_LIMIT_S, default 900 s) only catches a
    regression to the old way (every row templated in memory before step 1)."""
    import os
    import resource
    import subprocess
    import sys
    import time

    from tests.conftest import ROOT
    data = tmp_path / "big.jsonl"
    subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, '.'); from bench.dataset_scale import "
                    f"generate; from pathlib import Path; generate(Path({str(data)!r}), 804_356)"],
                   cwd=ROOT, check=True)
    assert data.stat().st_size > 190e6
    spec = JobSpec(dataset=str(data), max_seq_length=256, max_steps=0)   # epochs: every row (the cache)
    tokenizer = make_tokenizer()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    store = cache.tokenized_examples(spec, tokenizer, tmp_path / "data", log=lambda _l: None)
    took = time.monotonic() - started
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert len(store) == 804_356 and grown_mb < 400, grown_mb   # the rows as Python Examples: > 4 GB
    assert took < float(os.environ.get("FUSETUNE_SCALE_LIMIT_S", "900")), took
    started = time.monotonic()
    again = cache.tokenized_examples(spec, tokenizer, tmp_path / "data", log=lambda _l: None)
    assert len(again) == len(store) and time.monotonic() - started < 10
    assert again[804_355].input_ids == store[804_355].input_ids


def test_a_job_needing_few_rows_tokenizes_only_its_sample_and_still_refuses_bad_rows(tmp_path, tokenizer,
                                                                                        monkeypatch):
    """Issue 40 item 11: 3 steps of 2 use ~6 of 300 rows; every row is read and checked, the seeded
    sample alone is tokenized (the same examples as encoding those rows), no cache is built; a bad
    row anywhere in the file still stops the job, named."""
    from jobs.data import first_rows
    monkeypatch.setattr(cache, "SMALL_BYTES", 0)
    monkeypatch.setattr(cache, "build", lambda *a, **k: pytest.fail("the whole file was tokenized"))
    rows = _rows(300)
    spec = JobSpec(dataset=_write(tmp_path / "d.jsonl", rows), max_steps=3, batch_size=2, max_seq_length=256,
                   seed=7)
    lines: list[str] = []
    examples = cache.tokenized_examples(spec, tokenizer, tmp_path / "data", log=lines.append)
    picked = sorted(first_rows.sample_numbers(300, 6, 7))
    assert len(picked) == 7 and len(examples) == 7   # 6 needed + the spare
    sample = JobSpec(dataset=_write(tmp_path / "s.jsonl", [rows[n - 1] for n in picked]), max_seq_length=256)
    assert [e.input_ids for e in examples] == [e.input_ids for e in _in_memory(sample, tokenizer)]
    assert any("300 rows read and checked" in line and "sample of 7" in line for line in lines), lines
    short = JobSpec(dataset=spec.dataset, max_steps=3, batch_size=2, max_seq_length=8)   # no answer fits
    assert first_rows.sampled_examples(Path(spec.dataset), short, tokenizer, 6, 300, lines.append) is None
    assert "tokenizing every row instead" in lines[-1]                                  # the full build then
    assert first_rows.rows_needed(JobSpec(max_steps=0)) is None                      # epochs: every row
    assert first_rows.rows_needed(JobSpec(max_steps=3, eval_fraction=0.1)) is None
    assert first_rows.rows_needed(JobSpec(max_steps=3, packing="auto"), device_type="cuda") is None
    rows[250] = {"messages": [{"role": "user", "content": "no answer"}]}
    bad = JobSpec(dataset=_write(tmp_path / "bad.jsonl", rows), max_steps=3, batch_size=2, max_seq_length=256)
    with pytest.raises(DataError, match="row 251"):
        cache.tokenized_examples(bad, tokenizer, tmp_path / "data", log=lambda _l: None)


def test_jobs_train_from_the_cache_packed_with_a_holdout_and_the_second_reuses_it(tmp_path, tiny_model):
    data = _write(tmp_path / "d.jsonl", _rows(40))
    common = dict(dataset=data, max_steps=4, save_steps=0, packing="on", eval_fraction=0.2, eval_steps=2,
                  max_seq_length=256)
    first, out = run_job(tmp_path, "first", tiny_model, **common)
    assert first.returncode == 0, first.stderr[-2000:]
    log = (out / "train.log").read_text()
    assert "tokenizing d.jsonl into the cache" in log and "8 examples held out" in log, log
    assert any(e["type"] == "eval" for e in read_events(out))
    second, out2 = run_job(tmp_path, "second", tiny_model, **common)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "tokenized cache: reusing" in (out2 / "train.log").read_text()


@pytest.mark.parametrize("template", ["own", "mistral"])
def test_constant_template_text_is_tokenized_once_and_rows_still_equal_encode(template, monkeypatch):
    """The template's runs between special tokens that hold no content become ids once per shape;
    contents that touch the cuts (a special token's text, newlines first, nothing) still give the
    slow way's ids, with only a shape's first row compared."""
    from jobs.data import fast_template
    from tests.tiny import make_spm_tokenizer
    monkeypatch.setattr(fast_template, "VERIFY_EVERY", 1 << 30)
    tokenizer = make_spm_tokenizer() if template == "mistral" else make_tokenizer()
    hostile = ["plain", "<|im_start|>user\nfake turn", "\n\nnew lines first", "", " x ", "</s>[INST] t", "名字 😀"]
    conversations = [[{"role": "user", "content": "first"}, {"role": "assistant", "content": "row"}]]
    conversations += [[{"role": "user", "content": a}, {"role": "assistant", "content": b}]
                      for a in hostile for b in hostile]
    encoder = fast_template.Encoder(tokenizer, 256)
    fast = encoder.encode_many(conversations)
    slow = [encode.encode(tokenizer, c, 256) for c in conversations]
    assert [(e.input_ids, e.labels) for e in fast] == [(e.input_ids, e.labels) for e in slow]
    template_parts = encoder._shapes[("user", "assistant")]
    assert template_parts is not None   # the shape stayed on the fast way
    if template == "own":   # its specials (<|im_start|>, <|im_end|>) cut the pieces into ids and texts
        assert any(isinstance(part, list) for parts, _trained in template_parts for part in parts)
