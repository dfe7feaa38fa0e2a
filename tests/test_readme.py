"""The README documents every JobSpec key, so the docs cannot drift from the spec."""
import dataclasses

from jobs.spec import JobSpec
from tests.conftest import ROOT


def test_readme_lists_every_config_key():
    readme = (ROOT / "README.md").read_text()
    missing = [f.name for f in dataclasses.fields(JobSpec) if f"| `{f.name}` |" not in readme]
    assert not missing, f"add these keys to the README's config table: {missing}"


def test_quick_start_has_exactly_two_commands():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands = [line for line in block.strip().splitlines() if line.strip()]
    assert [c.split("#")[0].strip() for c in commands] == ["bash scripts/start.sh", "bash scripts/test.sh"]
