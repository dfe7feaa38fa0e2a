"""The planner tests' shared fixture."""
import pytest

from tests.jobs.models.model_shapes import HOST


@pytest.fixture
def roomy_host(monkeypatch):
    """Offloaded plans assume HOST bytes of pinned host memory free, whatever the machine running the
    tests has (kernels.checkpoint caps offloading at what the host can pin)."""
    monkeypatch.setattr("kernels.checkpoint._host_free_bytes", lambda: HOST)
