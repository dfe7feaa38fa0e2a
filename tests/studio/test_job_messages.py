"""Issue 24's last item: every sentence jobs/ writes for a person is a jobs/messages/ template,
and the studio shows it in 简体中文 by that template (studio/server_text.py), nested and joined
messages piece by piece; English and unknown text stay as written."""
import json
import string

import pytest

from jobs.checks.preflight import PreflightError, run_preflight
from jobs.data.dataset import scan_rows, to_conversations
from jobs.data.readers import iter_rows
from jobs.export.adapter import export_adapter_zip
from jobs.export.files import ExportError
from jobs.messages import MESSAGES, say
from jobs.queue.outcome import FINISHED_BEFORE_CANCEL
from jobs.spec import JobSpec
from studio import form
from studio.i18n import catalogue
from studio.server_text import NUMBER_NAMES, message_matchers, translated
from tests.tiny import make_tiny_model

ZH = "zh-CN"
GOOD = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-llama")


def _fields(template):
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


def test_every_template_has_chinese_with_the_same_placeholders():
    chinese = catalogue(ZH)
    for key, template in MESSAGES.items():
        assert f"msg.{key}" in chinese, key
        assert _fields(chinese[f"msg.{key}"]) == _fields(template), key


# placeholders whose pattern is shaped (studio/server_text.py _group, LIST_SPLITS): a value of that shape
SAMPLE_VALUES = {
    "where": "row 3 (line 4)",
    "problems": "row 1 (line 1) is a list, not an object with fields; row 2: boom",
    "findings": "model: it is gone; rewards: unknown",
    "field": "rewards",
    "config_file": "/jobs/a/config.yaml",
    "gpu_reasons": "GPU 0 is kept for a job queued earlier; GPU 1 is in use by job 'a'",
}


def _sample(template):
    """Values a real caller could pass: numbers, a row's place, a joined list, a word."""
    values = {}
    for _, name, spec, conversion in string.Formatter().parse(template):
        if name is None or name in values:
            continue
        if name in NUMBER_NAMES or (spec or "").endswith((",", "d")):   # server_text reads "d" as a number too
            values[name] = 1234
        elif (spec or "").endswith(("f", "x")):   # GB to one decimal, a byte in hex
            values[name] = 255 if spec.endswith("x") else 1.5
        else:
            values[name] = SAMPLE_VALUES.get(name, f"Q{name}Q")
    return values


def test_each_template_is_matched_by_its_own_pattern_first():
    """The most specific template wins: no generic one ("{where}: {problem}") swallows another."""
    for key, template in MESSAGES.items():
        text = say(key, **_sample(template))
        first = next(k for k, _anchor, pattern in message_matchers() if pattern.fullmatch(text))
        assert first == key, (key, text)
        assert translated(text, ZH) != text, key
        assert translated(text, "en") == text


def _bad_rows(tmp_path):
    lines = [json.dumps(GOOD), '{"messages": [', json.dumps({"messages": [{"role": "user", "content": "hi"}]}),
             json.dumps({"messages": [{"role": "robot", "content": "hi"}, {"role": "assistant", "content": "x"}]}),
             "[1, 2]"]
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_real_bad_rows_come_out_chinese_row_by_row(tmp_path):
    rows, problems = scan_rows(str(_bad_rows(tmp_path)))
    to_conversations(rows, "messages", problems)
    english = str(problems.error(rows.name))
    assert english.startswith("bad.jsonl has 4 bad rows: row 2 (line 2) is not valid JSON (column 15)")
    chinese = translated(english, ZH)
    assert chinese.startswith("bad.jsonl 有 4 条错误数据：第 2 条（第 2 行）不是有效的 JSON（第 15 列）")
    # each joined piece, its nested `where` and inner reason translated too; the parser's own words stay
    assert "第 3 条（第 3 行，messages）：没有 assistant 轮次" in chinese
    assert "第 4 条（第 4 行，messages）：第 1 轮的角色是 'robot'" in chinese
    assert "第 5 条（第 5 行）是列表，不是带字段的对象" in chinese
    assert "Expecting value" in chinese and "row " not in chinese
    assert translated(english, "en") == english


def test_not_utf8_and_too_large_rows_come_out_chinese(tmp_path):
    path = tmp_path / "raw.jsonl"
    path.write_bytes(json.dumps(GOOD).encode() + b"\n" + b'{"text": "\xff"}\n' + b'{"text": "' + b"a" * 300 + b'"}\n')
    problems = [item.message for item in iter_rows(path, 100) if hasattr(item, "message")]
    assert len(problems) == 2, problems
    utf8, large = (translated(p, ZH) for p in problems)
    assert utf8.startswith("第 2 条（第 2 行）不是 UTF-8 文本（文件偏移 ") and "请将文件另存为 UTF-8" in utf8
    assert large.startswith("第 3 条（第 3 行）大小为 313 字节，超过了单行上限 100 字节") and "FUSETUNE_MAX_ROW_BYTES" in large


def test_preflight_findings_and_their_also_list_come_out_chinese(tmp_path, tiny_model):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps(GOOD))
    spec = JobSpec.from_dict({"model": str(tiny_model), "dataset": str(data), "target_modules": "q_proj,qkv_proj",
                              "max_seq_length": 4096})
    report = run_preflight(spec, log=lambda _: None)
    refused = report.error()
    assert isinstance(refused, PreflightError) and "(also: " in str(refused)
    chinese = form.error_text(refused, ZH)
    assert "不是此模型的线性层" in chinese and "超过了此模型的上限 512 个词元" in chinese
    assert "qkv_proj" in chinese and "also" not in chinese and "is not a linear layer" not in chinese
    assert form.error_text(refused, "en").endswith(str(refused).removeprefix(f"{refused.key}: "))


def test_an_export_refusal_and_a_job_end_reason_come_out_chinese(tmp_path):
    with pytest.raises(ExportError) as refused:
        export_adapter_zip(tmp_path)
    assert translated(str(refused.value), ZH).startswith(f"任务 {tmp_path.name} 还没有完成的适配器（缺少 ")
    assert translated(FINISHED_BEFORE_CANCEL, ZH) == "在取消生效前它已完成全部步骤"


@pytest.mark.parametrize("text", ["something no template knows", "Triton said: boom; row 3 is odd", ""])
def test_unknown_text_is_shown_as_written(text):
    assert translated(text, ZH) == text


def test_a_known_frame_keeps_an_unknown_inner_reason_as_written():
    assert translated("row 3 (line 9): a reason from elsewhere", ZH) == "第 3 条（第 9 行）：a reason from elsewhere"


def test_reward_file_and_reward_refusals_come_out_chinese(tmp_path):
    from jobs.errors import SpecError
    from jobs.train.rewards.score import RewardError, RewardSet
    from jobs.train.rewards.user_file import load_reward_file
    broken = tmp_path / "broken.py"
    broken.write_text("import no_such_module_here\n")
    with pytest.raises(SpecError) as refused:
        load_reward_file(broken)
    assert form.error_text(refused.value, ZH).endswith("broken.py 导入失败：ModuleNotFoundError: No module named "
                                                       "'no_such_module_here'")
    raising = tmp_path / "raising.py"
    raising.write_text("def boom(prompts, completions, **kw):\n    raise KeyError('x')\n")
    with pytest.raises(RewardError) as failed:
        RewardSet(["boom:1"], str(raising), log=lambda _: None).score(["p"], ["c"], {}, [1], 4)
    # the job's error event holds "rewards: ..." (str of the SpecError): the field stays, the rest translates
    assert translated(str(failed.value), ZH) == "rewards：奖励 boom 抛出了 KeyError: 'x'（调用栈在 train.log 中）"


def test_gpu_choice_refusals_and_wait_reasons_come_out_chinese():
    from jobs.io import gpus
    machine = [gpus.GpuInfo(i, "NVIDIA H200", free_gb=80.0 - used, total_gb=80.0) for i, used in enumerate((70, 0))]
    with pytest.raises(ValueError) as refused:
        gpus.check_request("3", 0, machine)
    assert form.error_text(refused.value, ZH).endswith("GPU 3 不存在；这台机器有 GPU 0, 1")
    wait = gpus.place("0,1", 0, machine, held={1: "job-a"})
    assert wait.reason == "waiting: GPU 0 has 70.0 of 80.0 GiB in use by other processes; GPU 1 is in use by job 'job-a'"
    assert translated(wait.reason, ZH) == "等待中：GPU 0 的 80.0 GiB 中有 70.0 GiB 被其他进程占用；GPU 1 正被任务 'job-a' 使用"
    _placed, warning = gpus.place_now("auto", 2, machine)
    assert translated(warning, ZH).startswith("仍在 GPU 0,1 上开始（本需 2 个空闲 GPU（当前空闲 1 个））：GPU 0 的")
    _placed, listed = gpus.place_now("0", 0, machine)
    assert listed == "starting on GPU 0 anyway: GPU 0 has 70.0 of 80.0 GiB in use by other processes"
    assert translated(listed, ZH) == "仍在 GPU 0 上开始：GPU 0 的 80.0 GiB 中有 70.0 GiB 被其他进程占用"


def test_config_refusals_come_out_chinese(tmp_path):
    from jobs.errors import SpecError
    from jobs.train.cli import read_config
    with pytest.raises(SpecError) as bad_modules:
        JobSpec.from_dict({"target_modules": "q_proj,v-proj!"})
    assert form.error_text(bad_modules.value, ZH).endswith("'v-proj!' 不是模块名（只能用字母、数字、_ 和 .）")
    listed = tmp_path / "list.yaml"
    listed.write_text("- 1\n- 2\n")
    with pytest.raises(SpecError) as not_mapping:
        read_config(listed)
    assert form.error_text(not_mapping.value, ZH) == f"{listed} 必须是一个扁平的 key: value 映射"


def test_export_and_zip_upload_refusals_come_out_chinese(tmp_path):
    from jobs.export import export
    from studio.uploads import store_zip_upload
    with pytest.raises(ExportError) as refused:
        export(tmp_path, "onnx")
    assert translated(str(refused.value), ZH).startswith("--format 'onnx' 不是 ")
    fake = tmp_path / "pics.zip"
    fake.write_text("not a zip")
    with pytest.raises(form.FieldError) as unzipped:
        store_zip_upload(tmp_path / "data", fake)
    chinese = form.error_text(unzipped.value, ZH)
    assert "pics.zip 未解压：pics.zip 不是可读取的 .zip 文件（File is not a zip file）" in chinese, chinese


def test_an_image_text_row_too_long_comes_out_chinese_inside_its_row_frame():
    """jobs/data/vision_encode.py's refusal, as the preview shows it: "row N (line L): is ... tokens"."""
    english = say("row_problem", where="row 3 (line 3)",
                  problem=say("vision_row_too_long_images", length=5000, shown=1234, limit=4096))
    assert english == ("row 3 (line 3): is 5,000 tokens (1,234 of them image tokens), more than "
                       "max_seq_length=4,096: raise max_seq_length or use smaller images")
    chinese = translated(english, ZH)
    assert "5,000" in chinese and "1,234" in chinese and "max_seq_length=4,096" in chinese
    assert "调大 max_seq_length" in chinese and "raise" not in chinese


def test_export_notes_come_out_chinese_in_the_export_result():
    """An export's notes (jobs/export/: the Modelfile without TEMPLATE and why, f16 fallbacks) in the Export tab."""
    from studio.export_tab import ExportOutcome, outcome_html
    notes = [say("export_note_no_template", message=say("template_not_reproduced", count=3)),
             say("export_note_f16_tensors", count=3, quant="q4_k_m", tensor="blk.0.attn_q.weight")]
    assert notes[0] == ("Modelfile without TEMPLATE (the measured format does not reproduce 3-turn chats); "
                        "Ollama falls back to the GGUF's chat template")
    page = outcome_html("gguf", ExportOutcome(files=[("/tmp/m.gguf", "1 MB")], notes=notes), ZH)
    assert "Modelfile 未写 TEMPLATE" in page and "测得的格式无法复现 3 轮对话" in page
    assert "3 个张量以 f16 存储" in page and "blk.0.attn_q.weight" in page
    assert "falls back" not in page and "tensors stored" not in page


def test_vision_model_refusals_come_out_chinese_and_their_english_is_unchanged():
    """jobs/models/vision.py's refusals, as preflight's model finding and a ModelError show them."""
    from transformers import AutoConfig
    from jobs.models import vision
    from jobs.models.errors import ModelError
    english = vision.refusal(AutoConfig.for_model("mllama"))
    assert english == ("'mllama' is a vision-language model that Fusetune does not train yet (its image tokens "
                       "are not wired in); supported: Qwen2-VL, Qwen2.5-VL")
    assert translated(english, ZH) == "'mllama' 是 Fusetune 尚不能训练的视觉语言模型（其图片 token 尚未接入）；支持的有：Qwen2-VL, Qwen2.5-VL"
    assert translated(f"model: {english}", ZH).startswith("model：'mllama' 是 Fusetune 尚不能训练的视觉语言模型")

    class TextTokenizer:
        unk_token_id = 0

        def convert_tokens_to_ids(self, token):
            return 0
    with pytest.raises(ModelError) as no_token:
        vision.image_token(TextTokenizer())
    assert str(no_token.value) == "the tokenizer has no <|image_pad|> token: it is not a Qwen2-VL tokenizer"
    assert translated(str(no_token.value), ZH) == "分词器没有 <|image_pad|> token：它不是 Qwen2-VL 的分词器"


def test_a_text_only_method_refuses_a_vision_model_in_both_languages():
    """methods/base.py's refusal when DPO (or any method but sft) meets a vision-language model."""
    from types import SimpleNamespace

    from transformers import AutoConfig
    from jobs.models.errors import ModelError
    from jobs.train.methods.preference import DPO
    trainer = SimpleNamespace(spec=SimpleNamespace(method="dpo"))
    with pytest.raises(ModelError) as refused:
        DPO(trainer).for_model(AutoConfig.for_model("qwen2_5_vl"))
    assert str(refused.value) == "method dpo does not train vision-language models yet; use method sft"
    assert translated(str(refused.value), ZH) == "方法 dpo 尚不能训练视觉语言模型；请使用方法 sft"
