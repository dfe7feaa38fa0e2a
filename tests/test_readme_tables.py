"""The README's preference-speed table is the one bench/readme_tables.py generates from the recorded
lines of bench/results/job.jsonl (issue 38), and the generator refuses a row no line backs."""
import json

import pytest

from bench import readme_tables


def test_the_readme_table_is_generated_from_the_recorded_lines():
    assert readme_tables.main(["--check"]) == 0


def test_a_row_with_no_recorded_line_is_refused_and_ratios_come_from_the_lines(tmp_path):
    lines = [{"shape": "s", "method": "dpo", "stack": "fusetune (a)", "time": "2026-01-01T00:01", "steps": 40,
              "pair_tokens_per_s": 3000.0, "peak_gib": 5.0},
             {"shape": "s", "method": "dpo", "stack": "unsloth+trl dpo (c)", "time": "2026-01-01T00:00", "steps": 40,
              "pair_tokens_per_s": 1000.0, "peak_gib": 5.5}]
    row = readme_tables.Row("x", readme_tables.Pick("s", "dpo", "fusetune", "2026-01-01T00:01"),
                            readme_tables.Pick("s", "dpo", "unsloth+trl", "2026-01-01T00:00"))
    assert readme_tables.render_row(row, lines) == "| x | 3,000 (5.00) | 1,000 (5.50) | **3.0x at 0.91x memory** |"
    missing = readme_tables.Pick("s", "orpo", "fusetune", "2026-01-01T00:01")
    with pytest.raises(SystemExit, match="no line"):
        readme_tables.find(lines, missing)
    path = tmp_path / "job.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n", encoding="utf-8")
    assert len(readme_tables.load(path)) == 2
