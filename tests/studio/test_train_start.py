"""Start (studio/train_start.py + studio/start_check.py) on a tiny real model: the read policy, the
shared preflight (bad rows named, nothing queued, in process and in a child for large data), the
model files kept between clicks, and the fit check's warning and "Start anyway"."""
import html
import json

import pytest

from jobs.models import load as models
from jobs.spec import JobSpec
from studio.start_check import StartCheck
from studio.train_start import confirm_key, fit_for_form, start_job
from tests.studio.fakes import RecordingRunner
from tests.studio.form_fill import form_values

ROW = {"instruction": "Add", "input": "2+2", "output": "4"}
pytestmark = pytest.mark.usefixtures("step_measured_once")   # one measured CPU step for the module (conftest)


def write_csv(path, bad_rows: int):
    lines = ["instruction,input,output"] + [f"q{i},,a{i}" for i in range(20)]
    for i in range(bad_rows):
        lines.insert(3 + i, f"q-bad{i},,")   # an alpaca row without an answer
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_start_refuses_a_path_outside_the_data_dir_like_a_missing_one(data_dir, tmp_path):
    runner, check = RecordingRunner(), StartCheck(data_dir, free_memory=lambda _i: None)
    outside = tmp_path / "secret.jsonl"
    outside.write_text(json.dumps(ROW) + "\n")
    messages = []
    for path in (str(outside), "/no/such/file.jsonl"):
        names, values = form_values(data_dir, dataset=path)
        with pytest.warns(UserWarning, match=r"Dataset \(dataset\)"):
            result = start_job(runner, check, names, values)
        assert result.job_id == "" and runner.submitted == []
        messages.append(result.status.replace(path, "PATH"))
    assert messages[0] == messages[1] and "not available to the studio" in messages[0]


def test_start_refuses_a_bad_number_and_starts_nothing(data_dir):
    runner, check = RecordingRunner(), StartCheck(data_dir, free_memory=lambda _i: None)
    for bad in ("abc", "", "2.5"):
        names, values = form_values(data_dir, batch_size=bad)
        with pytest.warns(UserWarning, match=r"Batch size \(batch_size\)"):
            assert start_job(runner, check, names, values).job_id == ""
    assert runner.submitted == []


@pytest.mark.parametrize("in_child", [False, True])
def test_bad_rows_are_refused_at_start_naming_them(data_dir, in_child):
    """12 rows without an answer: nothing queued; the first 10 named by row, and the count; the
    same answer whether the studio or a child process reads the file."""
    runner = RecordingRunner()
    check = StartCheck(data_dir, free_memory=lambda _i: None, in_process_bytes=0 if in_child else 2 ** 30)
    dataset = write_csv(data_dir / "datasets" / f"bad-{in_child}.csv", bad_rows=12)
    names, values = form_values(data_dir, dataset=dataset)
    with pytest.warns(UserWarning, match="Not queued"):
        result = start_job(runner, check, names, values)
    assert result.job_id == "" and runner.submitted == []
    text = result.status
    assert "1 problem(s)" in text and "Dataset (dataset)" in text and "12 bad rows (the first 10 shown)" in text
    assert "row 3 (line 4" in text and "row 12 (line 13" in text and "row 13 (line 14" not in text
    with pytest.warns(UserWarning, match="未加入队列"):
        zh = start_job(runner, check, names, values, "zh-CN").status
    assert "数据集（dataset）" in zh and "12 条错误数据（显示前 10 条）" in zh   # the rows named in Chinese too (jobs/messages/)
    assert "第 3 条（第 4 行，alpaca）" in zh and "bad rows" not in zh


def test_a_good_job_is_queued_and_the_model_files_are_kept(data_dir, monkeypatch):
    runner, check = RecordingRunner(), StartCheck(data_dir, free_memory=lambda _i: None)
    dataset = write_csv(data_dir / "datasets" / "good.csv", bad_rows=0)
    names, values = form_values(data_dir, dataset=dataset, name="my run", bot_name="Ada")
    result = start_job(runner, check, names, values)
    assert result.job_id == "job-1" and "job-1" in result.status
    (spec,) = runner.submitted
    assert spec.name == "my run" and spec.max_steps == 3 and spec.dataset == dataset

    loads = []
    real = models.load_tokenizer
    monkeypatch.setattr(models, "load_tokenizer", lambda source: loads.append(source) or real(source))
    builtin = form_values(data_dir, dataset="builtin:identity", bot_name="Zed")
    assert start_job(runner, check, *builtin).job_id == "job-1"   # the identity rows change the template
    assert start_job(runner, check, names, values).job_id == "job-1"
    assert loads == []   # the tokenizer of the first click served both
    _config, tokenizer = check._files.load(str(data_dir / "models" / "tiny"))
    assert "Zed" not in tokenizer.chat_template   # the default system line did not stick to the cache


def test_a_job_that_will_not_fit_waits_for_start_anyway(data_dir):
    runner = RecordingRunner()
    check = StartCheck(data_dir, free_memory=lambda _i: 0.25)   # GiB: less than the CUDA context alone
    names, values = form_values(data_dir, dataset="builtin:identity")
    fit = html.unescape(fit_for_form(check, names, values, "en"))
    assert "Will not fit" in fit and "GPU 0 has 0.2 GiB free" in fit and "batch_size 4 -> 2" in fit
    with pytest.warns(UserWarning, match="would likely run out of memory"):
        warned = start_job(runner, check, names, values)
    assert warned.job_id == "" and runner.submitted == [] and warned.confirm
    assert "Start anyway" in warned.status

    other = form_values(data_dir, dataset="builtin:identity", lora_r="8")   # a changed form warns again
    with pytest.warns(UserWarning, match="run out of memory"):
        assert start_job(runner, check, *other, confirmed=warned.confirm).job_id == ""
    assert runner.submitted == []
    started = start_job(runner, check, names, values, confirmed=warned.confirm)
    assert started.job_id == "job-1" and started.confirm == ""
    assert confirm_key(runner.submitted[0]) == warned.confirm


def test_fit_check_on_cpu_and_on_a_big_gpu(data_dir):
    names, values = form_values(data_dir)
    cpu = fit_for_form(StartCheck(data_dir, free_memory=lambda _i: None), names, values, "en")
    assert "runs on the CPU" in cpu and "GiB" in cpu
    assert "在 CPU 上运行" in fit_for_form(StartCheck(data_dir, free_memory=lambda _i: None), names, values, "zh-CN")
    gpu = StartCheck(data_dir, free_memory=lambda index: {0: 0.5, 1: 80.0}[index])
    assert "Will not fit" in fit_for_form(gpu, names, values, "en")
    names, values = form_values(data_dir, gpus="1")
    assert "Fits" in fit_for_form(gpu, names, values, "en") and "GPU 1 has 80.0 GiB free" in fit_for_form(
        gpu, names, values, "en")
    bigger = fit_for_form(gpu, *form_values(data_dir, gpus="1", batch_size="64", max_seq_length="4096"), "en")
    smaller = fit_for_form(gpu, *form_values(data_dir, gpus="1"), "en")
    assert _gib(bigger) > _gib(smaller)


def _gib(html: str) -> float:
    return float(html.split("about ")[1].split(" GiB")[0])


def test_on_a_cpu_the_fit_check_speaks_of_this_machines_ram_not_a_gpu(data_dir):
    import psutil
    names, values = form_values(data_dir)
    cpu = fit_for_form(StartCheck(data_dir, free_memory=lambda _i: None), names, values, "en")
    assert "On a GPU" not in cpu
    total = f"{psutil.virtual_memory().total / 2 ** 30:.1f} GiB"
    assert "in its RAM" in cpu and total in cpu and _gib(cpu) > 0
    unmeasured = data_dir / "datasets" / "unmeasured.jsonl"   # not measured yet: rows of max_seq_length count
    unmeasured.write_text(json.dumps({"instruction": "Add", "input": "2+2", "output": "4"}) + "\n")
    huge = fit_for_form(StartCheck(data_dir, free_memory=lambda _i: None),
                        *form_values(data_dir, batch_size="4096", max_seq_length="8192", dataset=str(unmeasured)), "en")
    assert "but only" in huge and "lower batch_size" in huge


def test_once_the_data_is_measured_a_cpu_job_is_sized_by_its_longest_row(data_dir):
    """Issue 40 item 4: before Start (or the statistics) measured the data, rows of max_seq_length (an
    upper bound); after, the longest row's tokens (jobs/models/fit_cpu.py)."""
    data = data_dir / "datasets" / "short-rows.jsonl"   # where the studio may read it
    data.write_text(json.dumps({"instruction": "Add", "input": "2+2", "output": "4"}) + "\n")
    spec = JobSpec.from_dict({"model": str(data_dir / "models" / "tiny"), "dataset": str(data),
                              "max_seq_length": 512})
    check = StartCheck(data_dir, free_memory=lambda _i: None)
    before = check.fit(spec).estimate.allocated_gb
    assert check.longest_row(spec) is None and check.preflight(spec).ok
    assert 0 < check.longest_row(spec) < 100 and check.fit(spec).estimate.allocated_gb < before
    identity = JobSpec.from_dict({"model": str(data_dir / "models" / "tiny"), "max_seq_length": 512})
    assert 0 < check.longest_row(identity) < 200   # a built-in dataset: measured before Start
