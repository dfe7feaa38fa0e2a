"""Fixtures the studio tests share."""
import pytest

from tests.tiny import make_tiny_model


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """A data dir whose model cache holds the tiny model (a folder the studio may read) and an empty
    datasets folder; one a test module."""
    root = tmp_path_factory.mktemp("studio-data")
    make_tiny_model(root / "models" / "tiny")
    (root / "datasets").mkdir()
    return root


@pytest.fixture(scope="module")
def step_measured_once():
    """On a CPU each StartCheck measures one real training step in a child process (`python -m
    jobs.models.step_time`: 6-10 s, mostly that process's imports), once per instance and per model and
    LoRA shape (jobs.models.step_time.measure_key). A module whose subject is Start or the fit check's
    words, not the measurement (tests/studio/test_cpu_time.py's first test), makes a fresh StartCheck per
    test: with this fixture its StartChecks share one real measurement per shape instead of each
    measuring again (test_train_start.py measured the same shape 6 times)."""
    from jobs.models import step_time
    from studio.start_check import StartCheck
    real, measured = StartCheck.measure_step, {}

    def once(self, spec, source):
        key = step_time.measure_key(spec, source)
        if key not in measured:
            measured[key] = real(self, spec, source)
        return measured[key]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(StartCheck, "measure_step", once)
        yield
