"""bench/fsdp_fit_check.py on the CPU: the real trainer runs as rank 0 of 2 over PyTorch's fake process
group and shards (what the device's one-GPU run of issue 37 measures memory with), so a broken script is
found here rather than in a device call."""
import json
import subprocess
import sys

from tests.conftest import ROOT


def test_the_fake_group_runs_the_sharded_trainer_as_rank_0_of_2(tiny_model, tmp_path):
    data = tmp_path / "chat.jsonl"
    rows = [{"messages": [{"role": "user", "content": f"What is {i} plus {i}?"},
                          {"role": "assistant", "content": f"It is {2 * i}."}]} for i in range(16)]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "fit.jsonl"
    proc = subprocess.run([sys.executable, "bench/fsdp_fit_check.py", "--model", str(tiny_model), "--data", str(data),
                           "--world", "2", "--max-len", "128", "--steps", "1", "--budget", "3",
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    row = json.loads(out.read_text().splitlines()[-1])
    assert row["world"] == 2 and "error" not in row and row["budget_gib"] == 3
    assert "base weights (1/2 each)" in row["parts_gib"] and row["predicted_gib"] > 0
