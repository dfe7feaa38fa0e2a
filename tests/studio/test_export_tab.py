"""Export tab: the newest finished job is pre-selected, the user's pick is kept, and the model
card's front matter shows as metadata rather than as markdown."""
from jobs.export import model_card
from jobs.layout import JobLayout
from jobs.spec import JobSpec
from jobs.store import JobRecord
from studio.context import StudioContext
from studio.export_tab import ExportTab, model_card_text, split_front_matter
from tests.studio.fakes import ListRunner


def finished(tmp_path, job_id, state="done", adapter=True):
    layout = JobLayout(tmp_path / job_id)
    if adapter:
        layout.adapter.mkdir(parents=True)
        (layout.adapter / "adapter_model.safetensors").write_bytes(b"")
        (layout.adapter / "adapter_config.json").write_text("{}")
    return JobRecord(id=job_id, name=job_id, state=state, created_at=0.0, job_dir=str(layout.root))


def test_newest_finished_job_is_preselected_and_a_pick_is_kept(tmp_path):
    records = [finished(tmp_path, "running", "running", adapter=False), finished(tmp_path, "newest"),
               finished(tmp_path, "failed", "failed", adapter=False), finished(tmp_path, "older")]
    ctx = StudioContext(data_dir=tmp_path, runner=ListRunner(records))
    tab = ExportTab(select=None)
    update = tab.refresh(ctx, None, "en")
    assert update["value"] == "newest" and [v for _, v in update["choices"]] == ["newest", "older"]
    assert tab.refresh(ctx, "older", "en")["value"] == "older"
    assert tab.refresh(ctx, "deleted-meanwhile", "en")["value"] == "newest"
    assert "已完成" in tab.refresh(ctx, None, "zh-CN")["choices"][0][0]
    assert ExportTab(select=None).refresh(StudioContext(data_dir=tmp_path, runner=ListRunner([])), None, "en")[
        "value"] is None


def test_front_matter_becomes_a_metadata_table(tmp_path):
    card = model_card(JobSpec(), "HuggingFaceTB/SmolLM2-135M-Instruct", 1.23, 60)
    meta, body = split_front_matter(card)
    assert meta["library_name"] == "peft" and meta["tags"] == ["fusetune", "lora"]
    assert body.startswith("# LoRA adapter trained with Fusetune Studio")
    record = finished(tmp_path, "a")
    JobLayout(record.job_dir).model_card.write_text(card)
    shown = model_card_text(record.job_dir)
    assert not shown.startswith("---") and "\n---\n#" not in shown
    assert "| `base_model` | HuggingFaceTB/SmolLM2-135M-Instruct |" in shown
    assert "| `tags` | fusetune, lora |" in shown and "| 键 | 值 |" in model_card_text(record.job_dir, "zh-CN")


def test_cards_without_front_matter_are_unchanged():
    assert split_front_matter("# Title\ntext") == ({}, "# Title\ntext")
    assert split_front_matter("---\n: : bad\n---\nbody")[0] == {}
    assert split_front_matter("---\nonly open") == ({}, "---\nonly open")
