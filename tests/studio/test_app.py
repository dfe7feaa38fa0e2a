"""build_studio builds on a fresh data dir, starts no threads, and has the ids the browser test uses."""
import threading

from jobs.runner import Runner
from studio.app import build_studio

IDS = ["ft-start", "ft-field-model", "ft-field-dataset", "ft-field-max_steps", "ft-upload", "ft-preview-btn",
       "ft-command", "ft-jobs-table", "ft-job-select", "ft-cancel", "ft-job-progress", "ft-loss-plot",
       "ft-rss-plot", "ft-gpu-util", "ft-gpu-mem", "ft-kernel-report", "ft-log", "ft-export-select",
       "ft-export-download", "ft-model-card", "ft-chat-model", "ft-chat-adapter", "ft-chat-tuned",
       "ft-chat-base", "ft-chat-input", "ft-chat-send", "ft-tabs"]


def test_builds_on_an_empty_data_dir(tmp_path):
    before = {t.ident for t in threading.enumerate()}
    demo = build_studio(tmp_path / "fresh", Runner(tmp_path / "fresh"))
    assert {t.ident for t in threading.enumerate()} - before == set()
    ids = {c.get("props", {}).get("elem_id") for c in demo.config["components"]}
    assert set(IDS) <= ids
    assert not demo.is_running
    fused = next(c for c in demo.config["components"] if c.get("props", {}).get("elem_id") == "ft-field-fused_kernels")
    assert fused["props"]["interactive"] is False and "CUDA" in fused["props"]["info"]  # CPU-only CI


def test_number_fields_show_their_range_and_leave_checking_to_jobspec(tmp_path):
    demo = build_studio(tmp_path, Runner(tmp_path))
    by_id = {c.get("props", {}).get("elem_id"): c["props"] for c in demo.config["components"]}
    lr = by_id["ft-field-learning_rate"]
    assert "(1e-08 to 1)" in lr["info"] and lr.get("maximum") is None
