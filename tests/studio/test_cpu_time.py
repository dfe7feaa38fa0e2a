"""On a CPU the fit check says about how long the job runs: one short training step of the chosen
model measured once (cached per model and LoRA shape), scaled by the job's steps and tokens."""
import html
import json
import re

import pytest

from jobs.models import step_time
from jobs.spec import JobSpec
from studio.start_check import StartCheck
from studio.train_start import fit_for_form, start_job
from tests.studio.fakes import RecordingRunner
from tests.studio.form_fill import form_values
from tests.tiny import make_tiny_model

# a shape measured by an earlier test is reused by a later StartCheck (tests/studio/conftest.py); the
# first test still counts the measurements its own StartCheck asks for
pytestmark = pytest.mark.usefixtures("step_measured_once")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("studio-data")
    make_tiny_model(root / "models" / "tiny")
    (root / "datasets").mkdir()
    return root


def step_seconds(text: str) -> float:
    return float(re.search(r"of (?:about|at most) ([\d.]+) s each", html.unescape(text)).group(1))


def test_a_real_step_is_measured_once_and_scaled_by_the_jobs_tokens(data_dir, monkeypatch):
    measured = []
    real = StartCheck.measure_step   # the child process, for real

    def counting(self, spec, source):
        measured.append(source)
        return real(self, spec, source)

    monkeypatch.setattr(StartCheck, "measure_step", counting)
    check = StartCheck(data_dir, free_memory=lambda _i: None)
    short = fit_for_form(check, *form_values(data_dir, max_steps="10", max_seq_length="64"), "en")
    # the built-in dataset's rows are measured at once (jobs/models/fit_cpu.py): its mean, not the bound
    assert "About" in short and "min on this CPU: 10 steps" in short and "this data&#x27;s mean" in short
    longer = fit_for_form(check, *form_values(data_dir, max_steps="40", max_seq_length="256"), "en")
    assert "40 steps" in longer
    assert measured == [str(data_dir / "models" / "tiny")]   # form changes re-scale, never re-measure
    # scaled to the data's own rows (their mean, cut at max_seq_length), not to max_seq_length itself
    assert step_seconds(short) <= step_seconds(longer) < 2 * step_seconds(short)
    assert "在本机 CPU 上" in fit_for_form(check, *form_values(data_dir, max_steps="10"), "zh-CN")
    fit_for_form(check, *form_values(data_dir, lora_r="32"), "en")
    assert len(measured) == 2   # another LoRA shape is another step


def test_after_start_the_estimate_uses_the_datas_own_rows(data_dir):
    rows = data_dir / "datasets" / "short.jsonl"
    rows.write_text("".join(json.dumps({"instruction": f"q{i}", "input": "", "output": f"a{i}"}) + "\n"
                            for i in range(12)))
    check, runner = StartCheck(data_dir, free_memory=lambda _i: None), RecordingRunner()
    names, values = form_values(data_dir, dataset=str(rows), max_steps="0", num_epochs="2", batch_size="4")
    assert "min on this CPU" not in fit_for_form(check, names, values, "en")   # epochs: no row count yet
    result = start_job(runner, check, names, values, "en")
    assert result.job_id and "About " in result.fit and "min on this CPU: 6 steps" in result.fit
    assert "this data's mean" in html.unescape(result.fit)


def test_estimate_time_arithmetic():
    spec = JobSpec(max_steps=100, batch_size=2, gradient_accumulation_steps=3, max_seq_length=128)
    plain = step_time.estimate_time(spec, 0.001, tokens_per_row=50)
    assert plain.step_seconds == pytest.approx(0.001 * 2 * 3 * 50) and plain.seconds == pytest.approx(30.0)
    assert step_time.estimate_time(spec, 0.001).tokens_per_row == 128   # unknown rows: max_seq_length
    recomputed = step_time.estimate_time(JobSpec(max_steps=100, batch_size=2, gradient_accumulation_steps=3,
                                                 max_seq_length=128, gradient_checkpointing="on"), 0.001, 50)
    assert recomputed.seconds == pytest.approx(40.0)
    assert step_time.estimate_time(JobSpec(max_steps=0, num_epochs=1.0), 0.001) is None
