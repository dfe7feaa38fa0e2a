"""base_precision: fp8 in a job: refused with QLoRA or without the fused engine (naming the key and
the fix), and on a machine without an FP8 GPU the job trains in bf16 and its report says why."""
import pytest

from jobs.io.events import summarize
from jobs.spec import JobSpec, SpecError
from tests.jobs.train.job_runs import run_job


@pytest.mark.parametrize("data,fix", [
    ({"base_precision": "fp8", "load_in_4bit": True, "fused_kernels": True}, "load_in_4bit: false"),
    ({"base_precision": "fp8"}, "fused_kernels: true"),
])
def test_fp8_combinations_that_cannot_run_are_refused(data, fix):
    with pytest.raises(SpecError) as info:
        JobSpec.from_dict(data)
    assert info.value.key == "base_precision" and fix in str(info.value)


def test_fp8_with_the_fused_engine_is_accepted():
    assert JobSpec.from_dict({"base_precision": "fp8", "fused_kernels": True}).base_precision == "fp8"


def test_fp8_job_on_cpu_trains_in_bf16_and_the_report_says_why(tmp_path, tiny_model):
    proc, out = run_job(tmp_path, "fp8", tiny_model, fused_kernels=True, base_precision="fp8",
                        max_steps=2, save_steps=0)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = "\n".join(summarize(out).start["patch_report"])
    assert "fp8_linear" in report and "base weights stay bf16" in report, report
