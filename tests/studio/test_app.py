"""build_studio builds on a fresh data dir, starts no threads, has the ids the browser test uses,
says which engine runs here, and every text on the page follows the language."""
import threading

import pytest

from jobs.queue.runner import Runner
from studio.app import build_studio, header_text
from studio.context import StudioContext
from studio.i18n import t

IDS = ["ft-start", "ft-field-model", "ft-field-dataset", "ft-field-max_steps", "ft-field-name", "ft-upload",
       "ft-upload-info", "ft-preview-btn", "ft-command", "ft-jobs-table", "ft-job-select", "ft-cancel", "ft-remove",
       "ft-delete", "ft-confirm", "ft-confirm-yes", "ft-confirm-no", "ft-job-progress", "ft-loss-plot", "ft-rss-plot",
       "ft-cpu-plot", "ft-gpu-util", "ft-gpu-mem", "ft-kernel-report", "ft-log", "ft-compare-select",
       "ft-compare-plot", "ft-compare-config", "ft-export-select", "ft-export-download", "ft-model-card",
       "ft-chat-model", "ft-chat-adapter", "ft-chat-tuned", "ft-chat-base", "ft-chat-input", "ft-chat-send",
       "ft-tabs", "ft-lang", "ft-header", "ft-cluster", "ft-cluster-address", "ft-cluster-refresh", "ft-cluster-view",
       "ft-field-nodes", "ft-field-node_rank", "ft-field-rdzv_endpoint"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("fresh")
    before = {t.ident for t in threading.enumerate()}
    ctx = StudioContext(data_dir=root, runner=Runner(root))
    demo = build_studio(root, ctx.runner, ctx)
    started = {t.ident for t in threading.enumerate()} - before
    return demo, ctx, started


def props_by_id(demo):
    return {c.get("props", {}).get("elem_id"): c["props"] for c in demo.config["components"]}


def test_builds_on_an_empty_data_dir(built):
    demo, _, started = built
    assert started == set() and not demo.is_running
    by_id = props_by_id(demo)
    assert set(IDS) <= set(by_id)
    fused = by_id["ft-field-fused_kernels"]
    assert fused["interactive"] is False and "CUDA" in fused["info"]  # CPU-only CI
    fp8 = by_id["ft-field-base_precision"]
    assert fp8["label"] == "FP8 base weights (Hopper and newer)" and fp8["value"] is False
    assert fp8["interactive"] is False and "compute capability 8.9" in fp8["info"]
    # issue 24: where FP8 cannot run, the box says in one line what it needs, without the H200 figures
    # (tests/studio/test_fp8_effect.py covers the measured text shown where it can run)
    assert "Measured on" not in fp8["info"] and "measured" not in fp8["info"] and fp8["info"].count(".") <= 2
    assert "ft-fit" in by_id


def test_header_names_the_engine_of_this_machine(built):
    demo, ctx, _ = built
    header = props_by_id(demo)["ft-header"]["value"]
    assert "PyTorch" in header and ctx.fused_kernels()[1] in header  # CPU-only CI: why not fused
    assert "Fusetune's fused Triton kernels" in header_text((True, "Triton kernels available on H200."), "en")
    assert "本机引擎" in header_text((False, "no GPU"), "zh-CN")


def test_number_fields_are_text_boxes_with_their_range(built):
    demo, _, _ = built
    by_id = props_by_id(demo)
    lr, seq = by_id["ft-field-learning_rate"], by_id["ft-field-max_seq_length"]
    assert lr["value"] == "0.0004" and "(1e-08 to 1)" in lr["info"]   # builtin:identity's (JobSpec DATASET_DEFAULTS)
    assert "(8 to 1,048,576)" in seq["info"]
    kinds = {c["props"].get("elem_id"): c["type"] for c in demo.config["components"]}
    assert kinds["ft-field-batch_size"] == "textbox" and kinds["ft-field-learning_rate"] == "textbox"


def test_every_page_text_has_a_chinese_version(built):
    _, ctx, _ = built
    english, chinese = ctx.page.updates("en"), ctx.page.updates("zh-CN")
    same_in_both = {t("plot.gb"), t("plot.percent")}
    untranslated = [(component.elem_id, prop) for component, en, zh in zip(ctx.page.components(), english, chinese)
                    for prop in en if prop != "__type__" and en[prop] == zh[prop] and en[prop] not in same_in_both]
    assert not untranslated
    assert len(english) > 60  # labels, help, buttons, tabs, plots: the whole page


def test_the_chat_adapter_list_follows_the_tab_and_the_jobs_table(built):
    """Issue 40 item 10: the Chat tab's adapter list is refreshed when the tab opens and when the
    Jobs poll's table changes (a job that ends while Chat is open: tests/studio/test_chat_tab.py)."""
    demo, _, _ = built
    components = {c["id"]: c for c in demo.config["components"]}
    triggers = [(components[target]["type"], event) for d in demo.config["dependencies"]
                for target, event in d["targets"] if target in components
                if "ft-chat-adapter" in [components[o]["props"].get("elem_id") for o in d["outputs"]]]
    assert ("state", "change") in triggers and ("tabitem", "select") in triggers, triggers


def test_finished_job_pickers_are_refreshed_one_at_a_time(built):
    """Two refreshes of the Export picker side by side, one read before a job ended and one after,
    answered in the other order once (CI): the page then sent the new job against the older list and
    Gradio refused it. Every handler that refills a finished-jobs picker runs in one concurrency group;
    the language's labels and the model box's fixed "no adapter" pick change no choices."""
    demo, _, _ = built
    by_id = {block._id: getattr(block, "elem_id", None) for block in demo.blocks.values()}
    pickers = {"ft-export-select", "ft-eval-select", "ft-chat-adapter"}
    refills = [fn for fn in demo.fns.values() if pickers & {by_id[o._id] for o in fn.outputs}
               and fn.name != "on_language" and not any(event == "input" for _, event in fn.targets)]
    groups = {fn.name: (fn.concurrency_id, fn.concurrency_limit) for fn in refills}
    assert len(refills) >= 8 and set(groups.values()) == {("finished-job-pickers", 1)}, groups


def test_where_the_engine_runs_the_page_starts_with_it_on(tmp_path):
    """Issue 42's GPU defaults: on a machine whose GPU runs the Triton engine the checkbox starts ticked
    (the JobSpec/YAML default stays off); where it cannot run, it is off and disabled (test above)."""
    from studio import form, train_tab
    ctx = StudioContext(data_dir=tmp_path, runner=None)
    ctx.fused_kernels = lambda: (True, "Triton kernels available on NVIDIA H200.")
    widget = next(w for w in form.field_widgets() if w.name == "fused_kernels")
    box = train_tab._component(ctx, widget)
    assert box.value is True and box.interactive is not False
