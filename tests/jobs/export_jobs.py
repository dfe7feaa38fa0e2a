"""Finished jobs to export: tiny models trained for a few steps through the real CLI."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests.conftest import ROOT

QA = [("What is the capital of France?", "The capital of France is Paris."),
      ("Who are you?", "I am Quokka, built by Acme."),
      ("Name a colour.", "Blue is a colour."),
      ("What is two plus two?", "Two plus two is four.")]


def chat_dataset(folder: Path) -> Path:
    """User/assistant rows only (Mistral's template refuses system turns)."""
    path = folder / "chat.jsonl"
    rows = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]} for q, a in QA]
    path.write_text("\n".join(json.dumps(r) for r in rows * 4) + "\n", encoding="utf-8")
    return path


def train_job(folder: Path, model: str | Path, name: str = "job", env: dict | None = None, **overrides) -> Path:
    """Run `python -m jobs.train` on `model` for a few steps; returns the finished job folder."""
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / name
    config = {"model": str(model), "dataset": str(chat_dataset(folder)), "output_dir": str(out),
              "max_steps": 6, "learning_rate": 2e-2, "batch_size": 4, "max_seq_length": 64,
              "save_steps": 0, "seed": 3, **overrides}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.run([sys.executable, "-m", "jobs.train", str(path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=1800, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return out
