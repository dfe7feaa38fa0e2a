"""Every text key the studio uses exists in English and 简体中文 with the same placeholders; the
language follows the browser and the selector; the Train form's labels and help translate."""
import ast
import dataclasses
import string
from pathlib import Path

import pytest

from jobs.io import phases
from jobs.messages import MESSAGES
from jobs.spec import JobSpec
from jobs.queue.store import JobState
from studio import export_tab, form, i18n, job_actions, server_text
from studio.i18n import PageText, catalogue, normalize, t

STUDIO = Path(__file__).resolve().parents[2] / "studio"
# Keys built at run time from a prefix, and every value each prefix can take.
DYNAMIC = {
    "field.": {f"field.{f.name}" for f in dataclasses.fields(JobSpec)},
    "help.": {f"help.{f.name}" for f in dataclasses.fields(JobSpec)},
    "state.": {f"state.{s.value}" for s in JobState},
    "group.": {f"group.{g}" for g in form.GROUPS},
    "confirm.": {f"confirm.{a}" for a in (job_actions.CANCEL, job_actions.REMOVE, job_actions.DELETE,
                                          job_actions.START_ANYWAY, job_actions.RESUME, job_actions.MORE)},
    "jobs.action_": {f"jobs.action_{a}" for a in (job_actions.CANCEL, job_actions.REMOVE, job_actions.DELETE,
                                                  job_actions.START_ANYWAY, job_actions.RESUME, job_actions.MORE)},
    "phase.": {f"phase.{p}" for p in phases.PHASES},
    "phase.unit_": {"phase.unit_answers"},
    "reason.": ({f"reason.{name}" for name in [*server_text.PATTERNS, *server_text.REPORT_LINES]}
                | {f"reason.{key}" for key in server_text.CHECKPOINTING.values()} | {"reason.cpu_only_build"}),
    "msg.": {f"msg.{key}" for key in MESSAGES},
    "export.format_": {f"export.format_{f}" for f in export_tab.FORMATS},
    "export.quant_": {f"export.quant_{q}" for q in export_tab.QUANTS},
    "export.hint_": {f"export.hint_{f}" for f in export_tab.FORMATS},
}
# Texts that are the same in Chinese (units, and a format of placeholders only).
SAME_IN_CHINESE = {"plot.gb", "plot.percent", "error.field", "phase.counted", "msg.row_problem",
                   "msg.field_error", "msg.in_eval_dataset", "msg.export_config_refused"}  # "<name>: <why>" frames


def _key_strings(node, out, problems, where):
    """String keys an argument can evaluate to: literals, both arms of `a if c else b`, or the
    prefix of an f-string (which must be a known dynamic prefix)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        out.add(node.value)
    elif isinstance(node, ast.IfExp):
        _key_strings(node.body, out, problems, where)
        _key_strings(node.orelse, out, problems, where)
    elif isinstance(node, ast.JoinedStr):
        prefix = node.values[0].value if node.values and isinstance(node.values[0], ast.Constant) else ""
        if prefix == "error.":
            return  # error.<code>: the codes are collected from FieldError(...) calls
        if prefix not in DYNAMIC:
            problems.append(f"{where}: a key built from an unknown prefix {prefix!r}")
        else:
            out.update(DYNAMIC[prefix])
    elif not isinstance(node, (ast.Lambda, ast.Name, ast.Attribute)) or where.startswith("t("):
        problems.append(f"{where}: a key that is not a literal ({ast.dump(node)[:60]})")


def used_keys():
    keys, problems = set(), []
    for path in sorted(STUDIO.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            where = f"{name}() in {path.name}:{node.lineno}"
            if name == "t" and node.args and not (path.name == "i18n.py" and isinstance(node.args[0], ast.Name)):
                _key_strings(node.args[0], keys, problems, f"t() in {path.name}:{node.lineno}")
            elif name == "bind":
                for keyword in node.keywords:
                    _key_strings(keyword.value, keys, problems, where)
            elif name == "FieldError" and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
                keys.add(f"error.{node.args[1].value}")
    return keys, problems


def placeholders(text):
    return {name for _, name, _, _ in string.Formatter().parse(text) if name}


def test_every_used_key_is_in_both_catalogues():
    keys, problems = used_keys()
    assert not problems, problems
    assert len(keys) > 100  # the scan sees the studio, not nothing
    for lang in i18n.LANGUAGES:
        missing = sorted(keys - set(catalogue(lang)))
        assert not missing, f"{lang} lacks {missing}"


def test_catalogues_match_and_hold_no_dead_keys():
    english, chinese = catalogue("en"), catalogue("zh-CN")
    assert set(english) == set(chinese), set(english) ^ set(chinese)
    keys, _ = used_keys()
    assert not set(english) - keys, f"unused keys: {sorted(set(english) - keys)}"
    for key, text in english.items():
        assert placeholders(text) == placeholders(chinese[key]), key


def test_chinese_catalogue_is_chinese():
    untranslated = [k for k, v in catalogue("zh-CN").items()
                    if k not in SAME_IN_CHINESE and not any("\u4e00" <= ch <= "\u9fff" for ch in v)]
    assert not untranslated


def test_field_help_comes_from_jobspec_in_english():
    for f in dataclasses.fields(JobSpec):
        assert i18n.field_help(f.name, "en") == f.metadata["help"]
        assert i18n.field_help(f.name, "zh-CN") != f.metadata["help"]


@pytest.mark.parametrize("tag, lang", [("zh-CN", "zh-CN"), ("zh", "zh-CN"), ("zh-Hans-SG", "zh-CN"),
                                       ("zh_TW", "zh-CN"), ("en-US", "en"), ("de-DE", "en"), ("", "en"),
                                       (None, "en")])
def test_browser_language_maps_to_a_catalogue(tag, lang):
    assert normalize(tag) == lang


def test_formatting_and_fallbacks():
    assert t("action.deleted", "en", job="j1") == "Deleted job j1 and its folder."
    assert "j1" in t("action.deleted", "zh-CN", job="j1")
    assert t("no.such.key", "zh-CN") == "no.such.key"


def test_page_text_rebinds_props_per_language():
    class Box:
        def __init__(self):
            self.label = self.info = None

        def postprocess(self, value):
            return value

    page, box = PageText(), Box()
    assert page.bind(box, label="field.batch_size") is box and box.label == "Batch size"
    page.bind(box, info=lambda lang: t("hint.target_modules", lang))
    assert page.components() == [box]
    (update,) = page.updates("zh-CN")
    assert update["label"] == catalogue("zh-CN")["field.batch_size"]
    assert update["info"] == catalogue("zh-CN")["hint.target_modules"]


def test_form_error_text_is_translated():
    with pytest.raises(form.FieldError) as info:
        form.parse_number("batch_size", "abc")
    assert form.error_text(info.value, "en") == "Batch size (batch_size): 'abc' is not a number"
    chinese = form.error_text(info.value, "zh-CN")
    assert "batch_size" in chinese and "abc" in chinese and catalogue("zh-CN")["field.batch_size"] in chinese


def test_the_engine_reasons_the_server_sends_are_translated():
    from jobs.io.telemetry import fused_kernels_available
    from studio.server_text import translated
    reason = ("No CUDA GPU found (torch 2.13.0+cpu, a CPU-only build): the Triton kernels need an NVIDIA GPU, "
              "so training runs on the PyTorch path.")
    assert translated(reason, "en") == reason
    chinese = translated(reason, "zh-CN")
    assert "未找到 CUDA GPU" in chinese and "2.13.0+cpu" in chinese and "仅 CPU 版本" in chinese
    here = fused_kernels_available()[1]
    assert translated(here, "zh-CN") != here  # this machine's own reason is a known sentence
    assert translated("something new", "zh-CN") == "something new"


def test_catalogues_name_each_key_once():
    """A key written twice (two features merged) would silently keep only its last text."""
    import json
    for name in ("en.json", "zh-CN.json"):
        keys = [k for k, _ in json.loads((i18n.LOCALES_DIR / name).read_text(encoding="utf-8"),
                                          object_pairs_hook=lambda pairs: pairs)]
        assert len(keys) == len(set(keys)), sorted({k for k in keys if keys.count(k) > 1})


def test_the_kernel_report_and_a_stopped_jobs_reason_are_translated():
    """The report lines the trainer and kernels/report.py write, as the Jobs tab shows them."""
    from kernels.report import PatchReport
    from studio.server_text import report_line, translated
    report = PatchReport(backend="torch", architecture="llama")
    report.fallback("rms_norm", 9, "No CUDA GPU found (torch 2.13.0+cpu, a CPU-only build): the Triton kernels "
                                   "need an NVIDIA GPU, so training runs on the PyTorch path.")
    report.patched("rope", 4)
    lines = report.lines() + ["  checkpointing: off", "fused kernels: off (PyTorch path)",
                              "  loss: label rows only through the LM head (the prompt's and padding's logits are "
                              "skipped)", "  loss: transformers' own, every position through the LM head (lm_head "
                              "weight is quantized)"]
    assert [report_line(line, "en") for line in lines] == lines
    chinese = [report_line(line, "zh-CN") for line in lines]
    assert chinese[0] == "融合内核：后端=torch 架构=llama"
    assert chinese[1].startswith("  torch（回退） rms_norm x9：未找到 CUDA GPU") and "仅 CPU 版本" in chinese[1]
    assert chinese[2] == "  triton  rope x4"   # op names stay as the kernels name them
    assert chinese[3:5] == ["  激活检查点：关闭", "融合内核：关闭（PyTorch 路径）"]
    assert chinese[5].startswith("  损失：只有标签行") and chinese[6].startswith("  损失：transformers 自带")
    assert translated("cancelled by the user", "zh-CN") == "已由用户取消"
    nested = translated("FP8 base weights run on the fused engine: Triton is not installed "
                        "(pip install -r requirements.txt); training uses PyTorch.", "zh-CN")
    assert nested.startswith("FP8 基础权重运行在融合引擎上：未安装 Triton")
