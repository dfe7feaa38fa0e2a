"""Issue 36 item 5: user text (a bot name, a job name, a dataset path) with quotes incl. three in a
row, backslashes, newlines, emoji (with a zero-width joiner) or right-to-left marks reaches the
Ollama Modelfile and the model cards intact, as Ollama's parser and a markdown reader read them; a
GGUF export writes its file and Modelfile together or not at all, and a refused one leaves no folder."""
import re
import shutil

import pytest
import yaml

from jobs.data import encode
from jobs.data.builtin.identity import system_line
from jobs.export import ExportError, card, export, ollama
from jobs.models.load import load_tokenizer
from jobs.spec import JobSpec
from tests.jobs.export import gotemplate
from tests.jobs.export.templates import with_template
from tests.tiny import CHATML

NAMES = {"triple quotes": 'Tri"""ple "Bot"', "backslashes": "back\\slash\\ C:\\bots\\", "newline": "Two\nLines",
         "emoji": "Dev 👩\u200d💻 😀", "rtl marks": "\u200fبوت\u200f \u202bمرحبا\u202c", "braces": "{{ .Content }} `x`"}
USER = {"role": "user", "content": "Who are you?"}


def _template_of(modelfile: str) -> str:
    values = dict(gotemplate.parse_modelfile(modelfile))
    assert values["model"].startswith("./")
    return values["template"]


@pytest.mark.parametrize("name", list(NAMES.values()), ids=list(NAMES))
def test_a_bot_name_reaches_the_modelfile_as_ollama_reads_it(base_tokenizer, tmp_path, name):
    """The tuned tokenizer's default system line holds the bot name; Ollama's parser (ported in
    tests/jobs/export/gotemplate.py) and Go's template give back the Jinja prompt exactly."""
    tokenizer = with_template(base_tokenizer, CHATML)
    encode.set_default_system(tokenizer, system_line(name, 'Acme "Labs" \\ 😀'))
    tokenizer.save_pretrained(tmp_path / "tok")
    path, notes = ollama.write_modelfile(tmp_path / "m.gguf", tmp_path / "tok", {}, {})
    assert not notes
    text = path.read_text(encoding="utf-8")
    expected = tokenizer.apply_chat_template([USER], tokenize=False, add_generation_prompt=True)
    assert gotemplate.render(_template_of(text), {"Messages": [{"Role": "user", "Content": USER["content"]}]}) \
        == expected
    assert '"""' not in text.split('TEMPLATE """', 1)[1].rsplit('"""', 1)[0]


def _yaml_block(text: str) -> dict:
    fence = re.search(r"^(`{3,})yaml\n(.*?)\n\1$", text, re.S | re.M)
    return yaml.safe_load(fence.group(2))


@pytest.mark.parametrize("name", list(NAMES.values()), ids=list(NAMES))
def test_names_and_paths_stay_text_in_the_model_cards(tmp_path, name):
    folder = tmp_path / f"data `{name.splitlines()[0]}` "
    spec = JobSpec(name=name.replace("\n", " "), bot_name=name, bot_author=name, model=str(tmp_path / "base"),
                   dataset=str(folder / "d.jsonl"))
    for text in (card.model_card(spec, str(tmp_path / "base"), 1.0, 3), card.merged_card(spec, "merged", [])):
        meta = yaml.safe_load(text.split("---\n")[1])
        assert meta["tags"][0] == "fusetune"
        ran = _yaml_block(text)
        assert ran["bot_name"] == name and ran["bot_author"] == name and ran["dataset"] == spec.dataset
    merged = card.merged_card(spec, "merged", [])
    heading = next(line for line in merged.splitlines() if line.startswith("# "))
    assert heading == f"# {card.one_line(spec.name)} (merged), exported by Fusetune Studio"
    dataset_line = next(line for line in merged.splitlines() if line.startswith("- Dataset: "))
    span = re.match(r"- Dataset: (`+) ?(.*?) ?\1;", dataset_line)
    assert span and span.group(2) == spec.dataset   # a code span that the path's backticks cannot end


@pytest.fixture
def quoted_job(tiny_job, tmp_path):
    """The tiny llama job whose tuned tokenizer's default system line names a bot with three quotes
    (as an identity job's would): today's GGUF export crashed there and left a .gguf alone."""
    job = shutil.copytree(tiny_job, tmp_path / "job")
    tokenizer = load_tokenizer(str(job / "adapter"))
    encode.set_default_system(tokenizer, system_line(NAMES["triple quotes"], "Acme"))
    tokenizer.save_pretrained(job / "adapter")
    return job


def test_a_gguf_of_a_bot_named_with_three_quotes_has_its_modelfile(quoted_job):
    result = export(quoted_job, "gguf", "q8_0", device="cpu")
    gguf_path, modelfile = result.files
    assert gguf_path.is_file() and modelfile.name == "Modelfile" and modelfile.parent == gguf_path.parent
    template = _template_of(modelfile.read_text(encoding="utf-8"))
    prompt = gotemplate.render(template, {"Messages": [{"Role": "user", "Content": "Hi"}]})
    assert 'Tri"""ple "Bot"' in prompt
    assert sorted(p.name for p in gguf_path.parent.iterdir()) == sorted([gguf_path.name, "Modelfile"])
    assert sorted(p.name for p in (quoted_job / "exports").iterdir()) == [gguf_path.parent.name]


def test_a_refused_gguf_export_leaves_no_folder(quoted_job, monkeypatch):
    import shutil as shutil_module
    from collections import namedtuple
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil_module, "disk_usage", lambda _path: usage(10**9, 10**9, 1000))
    with pytest.raises(ExportError, match="not enough disk space"):
        export(quoted_job, "gguf", "f16", device="cpu")
    assert not (quoted_job / "exports").exists()
