"""The Jobs tab's poll: everything from disk, only what changed is re-sent, and the poll never picks
a job by itself; the actions a job offers follow its state."""
from jobs.io.events import EventWriter
from jobs.queue.store import JobRecord
from studio.context import StudioContext
from studio.jobs_tab import DETAIL_LEN, refresh
from tests.studio.fakes import ListRunner


def is_skip(value):
    return value == {"__type__": "update"}


def step(n):
    return dict(step=n, max_steps=10, loss=3.0 - n / 10, elapsed_s=float(n), eta_s=10.0 - n, rss_gb=1.0, gpus=[])


def unpack(out):
    table, select, progress, failure, loss, rss, cpu, gpu_util, gpu_mem, rewards, completions, report, log, *rest = out
    cancel, remove, delete, start_anyway, resume, more, notice, t_sig, d_sig, timer = rest
    return dict(timer=timer, table=table, select=select, progress=progress, failure=failure, loss=loss, gpu_util=gpu_util,
                rewards=rewards, completions=completions, report=report, cancel=cancel, remove=remove, delete=delete,
                start_anyway=start_anyway, resume=resume, more=more, notice=notice, t_sig=t_sig, d_sig=d_sig)


def job(tmp_path, job_id, state):
    return JobRecord(id=job_id, name=f"tiny {job_id}", state=state, created_at=1.7e9,
                     job_dir=str(tmp_path / job_id), spec={})


def test_refresh_reads_disk_and_skips_unchanged_parts(tmp_path):
    rec = job(tmp_path, "a", "running")
    writer = EventWriter(rec.job_dir)
    writer.emit("start", device="cpu", patch_report=["rms_norm: torch"])
    writer.emit("step", **step(1))
    ctx = StudioContext(data_dir=tmp_path, runner=ListRunner([rec]))

    out = unpack(refresh(ctx, "a", None, None, pick=True))
    assert out["table"]["value"].values.tolist()[0][:4] == ["a", "tiny a", "running", "1/10"]
    assert out["select"]["value"] == "a"
    assert 'data-step="1"' in out["progress"] and out["loss"]["step"].tolist() == [1]
    assert out["gpu_util"]["visible"] is False and "rms_norm: torch" in out["report"]
    assert out["rewards"]["visible"] is False  # an SFT job has no reward curves
    assert (out["cancel"]["visible"], out["remove"]["visible"], out["delete"]["visible"]) == (True, False, False)

    again = refresh(ctx, "a", out["t_sig"], out["d_sig"])
    assert all(is_skip(v) for v in again[:2 + DETAIL_LEN])

    writer.emit("step", **step(2))
    moved = unpack(refresh(ctx, "a", out["t_sig"], out["d_sig"]))
    assert 'data-step="2"' in moved["progress"] and moved["loss"]["loss"].tolist() == [2.9, 2.8]
    assert not is_skip(moved["table"]) and "value" not in moved["select"]  # a poll keeps the user's pick

    rec.state = "done"
    finished = unpack(refresh(ctx, "a", moved["t_sig"], moved["d_sig"]))
    assert 'data-state="done"' in finished["progress"]
    assert (finished["cancel"]["visible"], finished["delete"]["visible"]) == (False, True)


def test_an_idle_page_polls_ever_more_slowly_and_a_running_job_or_a_click_brings_it_back(tmp_path):
    """Issue 40: an open, idle Jobs page polled every 1.5 s (a third of a core in chromium)."""
    rec = job(tmp_path, "a", "done")
    EventWriter(rec.job_dir).emit("start", device="cpu")
    ctx = StudioContext(data_dir=tmp_path, runner=ListRunner([rec]))
    first = unpack(refresh(ctx, "a", None, None, pick=True))
    assert first["timer"]["value"] == 1.5                     # a click: back to the fast poll
    sigs, interval, seen = (first["t_sig"], first["d_sig"]), 1.5, []
    for _ in range(6):
        out = unpack(refresh(ctx, "a", *sigs, shared=True, interval=interval))
        interval = interval if is_skip(out["timer"]) else out["timer"]["value"]
        seen.append(interval)
    assert seen == [3.0, 6.0, 12.0, 24.0, 30.0, 30.0]         # nothing runs, nothing changes
    running = job(tmp_path, "b", "running")
    busy = StudioContext(data_dir=tmp_path, runner=ListRunner([rec, running]))
    out = unpack(refresh(busy, "a", *sigs, shared=True, interval=30.0))
    assert out["timer"]["value"] == 1.5                        # another job runs: follow it closely


def test_nothing_is_picked_for_the_user(tmp_path):
    records = [job(tmp_path, "new", "queued"), job(tmp_path, "old", "running")]
    ctx = StudioContext(data_dir=tmp_path, runner=ListRunner(records))
    out = unpack(refresh(ctx, None, None, None))
    assert "value" not in out["select"] and len(out["select"]["choices"]) == 2
    assert "Pick a job" in out["progress"]
    assert not any(out[b]["visible"] for b in ("cancel", "remove", "delete"))
    queued = unpack(refresh(ctx, "new", None, None, pick=True))
    assert (queued["cancel"]["visible"], queued["remove"]["visible"]) == (False, True)


def test_a_deleted_job_is_unpicked_and_language_rerenders(tmp_path):
    records = [job(tmp_path, "a", "done")]
    ctx = StudioContext(data_dir=tmp_path, runner=ListRunner(records))
    first = unpack(refresh(ctx, "a", None, None, pick=True))
    chinese = unpack(refresh(ctx, "a", first["t_sig"], first["d_sig"], "zh-CN"))
    assert chinese["table"]["value"].columns.tolist()[2] == "状态" and "已完成" in chinese["progress"]
    records.clear()
    gone = unpack(refresh(ctx, "a", chinese["t_sig"], chinese["d_sig"], "zh-CN"))
    assert gone["select"]["value"] is None and "选择一个任务" in gone["progress"]


def test_before_its_first_step_a_job_says_what_it_does_and_elapsed_counts_from_start(tmp_path):
    rec = job(tmp_path, "a", "running")
    rec.started_at = 1000.0
    writer = EventWriter(rec.job_dir)
    writer.emit("phase", phase="preparing data", done=40, total=121, unit="answers")
    ctx = StudioContext(data_dir=tmp_path, runner=ListRunner([rec]))
    out = unpack(refresh(ctx, "a", None, None, pick=True))
    assert "preparing data: 40/121 answers" in out["progress"] and "step 0" not in out["progress"]
    writer.emit("start", device="cpu", resumed_at=0)
    writer.emit("step", **step(1))
    rec.state, rec.finished_at = "done", 1390.0
    done = unpack(refresh(ctx, "a", out["t_sig"], out["d_sig"]))
    assert "preparing" not in done["progress"] and "elapsed 6:30" in done["progress"]


def test_the_loss_plot_is_told_its_series_once_they_change(tmp_path):
    from studio.jobs_view import loss_frame
    from studio.plots import color_sync
    rec = job(tmp_path, "a", "running")
    EventWriter(rec.job_dir).emit("step", **step(1))
    frame = loss_frame(StudioContext(data_dir=tmp_path, runner=ListRunner([rec])).events.get(rec.job_dir))
    update, sent = color_sync(frame, None)
    assert list(update["color_map"]) == list(sent) == ["training loss"]
    assert is_skip(color_sync(frame, sent)[0])


def test_a_notice_about_a_job_goes_when_it_ends_or_another_is_picked(tmp_path):
    a, b = job(tmp_path, "a", "running"), job(tmp_path, "b", "running")
    ctx = StudioContext(data_dir=tmp_path, runner=ListRunner([a, b]))
    first = unpack(refresh(ctx, "a", None, None, pick=True))
    assert first["notice"] == ""
    assert is_skip(unpack(refresh(ctx, "a", first["t_sig"], first["d_sig"]))["notice"])
    a.state = "cancelled"
    assert unpack(refresh(ctx, "a", first["t_sig"], first["d_sig"]))["notice"] == ""
    assert unpack(refresh(ctx, "b", first["t_sig"], first["d_sig"], pick=True))["notice"] == ""


def test_a_stopped_job_with_a_checkpoint_offers_resume_a_done_one_more_steps(tmp_path):
    cancelled, done = job(tmp_path, "c", "cancelled"), job(tmp_path, "d", "done")
    for record in (cancelled, done):
        folder = tmp_path / record.id / "checkpoints" / "step-3"
        folder.mkdir(parents=True)
        (folder / "trainer_state.json").write_text('{"step": 3}')
    ctx = StudioContext(data_dir=tmp_path, runner=ListRunner([cancelled, done]))
    c = unpack(refresh(ctx, "c", None, None, pick=True))
    assert (c["resume"]["visible"], c["more"]["visible"], c["delete"]["visible"]) == (True, False, True)
    d = unpack(refresh(ctx, "d", None, None, pick=True))
    assert (d["resume"]["visible"], d["more"]["visible"]) == (False, True)


def test_the_colour_sync_reads_the_series_the_page_holds():
    from studio.plots import color_sync
    shown = {"columns": ["step", "loss", "series"], "data": [[1, 2.0, "training loss"], [2, 1.5, "eval loss"]]}
    update, sent = color_sync(shown, None)
    assert list(sent) == ["training loss", "eval loss"]
    assert is_skip(color_sync({"columns": ["step", "loss", "series"], "data": []}, None)[0])


def test_thirty_pages_polling_share_one_reading_per_change(tmp_path, monkeypatch):
    import threading

    from studio import jobs_tab
    rec = job(tmp_path, "a", "running")
    writer = EventWriter(rec.job_dir)
    writer.emit("start", device="cpu")
    writer.emit("step", **step(1))
    runner = ListRunner([rec])
    listed = []
    real_list = runner.list_jobs
    runner.list_jobs = lambda: listed.append(1) or real_list()
    computed = []
    real_values = jobs_tab._detail_values
    monkeypatch.setattr(jobs_tab, "_detail_values", lambda *a: computed.append(1) or real_values(*a))
    monkeypatch.setattr(jobs_tab, "SHARED_TTL_S", 60.0)   # a loaded test machine: no second reading
    ctx = StudioContext(data_dir=tmp_path, runner=runner)
    pages = [unpack(refresh(ctx, "a", None, None, pick=True)) for _ in range(30)]   # clicks: fresh reads
    assert len(listed) == 30 and len(computed) == 30
    writer.emit("step", **step(2))
    listed.clear(), computed.clear()
    answers = [None] * 30

    def poll(i):
        answers[i] = unpack(refresh(ctx, "a", pages[i]["t_sig"], pages[i]["d_sig"], shared=True))

    threads = [threading.Thread(target=poll, args=(i,)) for i in range(30)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert len(listed) == 1 and len(computed) == 1      # one store read, one detail, 30 answers
    assert all('data-step="2"' in a["progress"] for a in answers)
    assert all(a["cancel"] is not answers[0]["cancel"] for a in answers[1:])   # updates made per answer


def test_a_preference_job_shows_its_margin_and_accuracy_beside_the_loss(tmp_path):
    rec = job(tmp_path, "p", "running")
    writer = EventWriter(rec.job_dir)
    for n, (margin, accuracy) in enumerate([(0.0, 0.0), (0.4, 0.75), (0.9, 1.0)], start=1):
        writer.emit("step", **step(n), chosen_reward=margin / 2, rejected_reward=-margin / 2,
                    reward_margin=margin, reward_accuracy=accuracy)
    writer.emit("eval", step=3, eval_loss=0.5, eval_reward_margin=0.7, eval_reward_accuracy=0.9)
    ctx = StudioContext(data_dir=tmp_path, runner=ListRunner([rec]))
    out = unpack(refresh(ctx, "p", None, None, pick=True))
    assert out["rewards"]["visible"] is True
    frame = out["rewards"]["value"]
    series = {name: group[["step", "value"]].values.tolist() for name, group in frame.groupby("series")}
    assert series == {"reward margin": [[1, 0.0], [2, 0.4], [3, 0.9]],
                      "reward accuracy": [[1, 0.0], [2, 0.75], [3, 1.0]],
                      "eval reward margin": [[3, 0.7]], "eval reward accuracy": [[3, 0.9]]}


def test_a_poll_reading_while_start_adds_a_job_sends_nothing_and_the_next_one_shows_it(tmp_path, monkeypatch):
    """CI, 2026-12-04: a poll that read the table before Start queued a job answered after Start's own
    answer, and its list (without the new job) replaced the page's; the page then sent a value the
    list lacked. Now a studio change bumps the shared views' generation: that poll sends nothing."""
    from studio import jobs_tab
    old = job(tmp_path, "a", "done")
    runner = ListRunner([old])
    ctx = StudioContext(data_dir=tmp_path, runner=runner)
    monkeypatch.setattr(jobs_tab, "SHARED_TTL_S", 60.0)
    page = unpack(refresh(ctx, "a", None, None, pick=True))
    real_list = runner.list_jobs

    def list_then_start():   # the poll's reading, during which Start queues job b
        records = real_list()
        runner.records.insert(0, job(tmp_path, "b", "queued"))
        ctx.shared.invalidate()
        return records
    runner.list_jobs = list_then_start
    late = unpack(refresh(ctx, "a", None, page["d_sig"], shared=True))   # a page whose table differs
    assert is_skip(late["table"]) and is_skip(late["select"]) and late["t_sig"] is None
    runner.list_jobs = real_list
    shown = unpack(refresh(ctx, "a", None, page["d_sig"], shared=True))   # not the stale reading
    assert [c[1] if isinstance(c, tuple) else c for c in shown["select"]["choices"]][:2] == ["b", "a"]


def test_a_running_jobs_charts_follow_at_most_every_chart_every_s_and_owed_ones_come_when_due(tmp_path, monkeypatch):
    """A chart redraw is vega rebuilding its view in the browser: a poll sends the progress at once and
    the charts when CHART_EVERY_S has passed since the page's last ones, also when nothing moved since."""
    from studio import jobs_tab, poll_pace
    rec = job(tmp_path, "a", "running")
    writer = EventWriter(rec.job_dir)
    writer.emit("start", device="cpu")
    writer.emit("step", **step(1))
    ctx = StudioContext(data_dir=tmp_path, runner=ListRunner([rec]))
    clock = [100.0]
    monkeypatch.setattr(jobs_tab.time, "monotonic", lambda: clock[0])
    page = unpack(refresh(ctx, "a", None, None, pick=True))   # a pick: everything
    assert page["loss"]["step"].tolist() == [1]
    writer.emit("step", **step(2))
    clock[0] += 1.6
    soon = unpack(refresh(ctx, "a", page["t_sig"], page["d_sig"], shared=True))
    assert 'data-step="2"' in soon["progress"] and is_skip(soon["loss"])
    clock[0] += poll_pace.CHART_EVERY_S
    owed = unpack(refresh(ctx, "a", soon["t_sig"], soon["d_sig"], shared=True))   # nothing new, charts owed
    assert owed["loss"]["step"].tolist() == [1, 2]
    clock[0] += 1.6
    quiet = refresh(ctx, "a", owed["t_sig"], owed["d_sig"], shared=True)
    assert all(is_skip(v) for v in quiet[:2 + DETAIL_LEN])


def test_a_poll_that_read_the_job_picked_before_a_pick_sends_none_of_its_detail(tmp_path):
    """CI, 2026-12-04 (once, under load): a poll sent before Start's pick answered after it with the
    job picked before, and the page showed that job's progress under the new pick. A poll now sends
    no detail for a job that is no longer its page's pick (another page's poll still gets it)."""
    running, queued = job(tmp_path, "a", "running"), job(tmp_path, "b", "queued")
    EventWriter(running.job_dir).emit("step", **step(1))
    runner = ListRunner([queued, running])
    ctx = StudioContext(data_dir=tmp_path, runner=runner)
    shown = unpack(refresh(ctx, "a", None, None, pick=True, page="p"))
    unpack(refresh(ctx, "a", None, None, pick=True, page="q"))
    real_list, picked = runner.list_jobs, {}

    def list_then_pick():   # the poll's reading, during which the page picks job b
        if not picked:
            picked["b"] = None
            picked["b"] = unpack(refresh(ctx, "b", None, None, pick=True, page="p"))
        return real_list()
    runner.list_jobs = list_then_pick
    late = unpack(refresh(ctx, "a", shown["t_sig"], shown["d_sig"], shared=True, page="p"))
    assert "queued" in picked["b"]["progress"] and picked["b"]["select"]["value"] == "b"
    detail = ("progress", "failure", "loss", "report", "cancel", "remove", "notice", "d_sig")
    assert all(is_skip(late[name]) for name in detail) and "value" not in late["select"]
    runner.list_jobs = real_list
    sent_late = unpack(refresh(ctx, "a", shown["t_sig"], shown["d_sig"], shared=True, page="p"))
    assert is_skip(sent_late["progress"])   # sent before the pick's answer came, run after it: the same
    other = unpack(refresh(ctx, "a", None, None, shared=True, page="q"))
    assert "running" in other["progress"] and other["cancel"]["visible"] is True
    now = unpack(refresh(ctx, "b", shown["t_sig"], shown["d_sig"], shared=True, page="p"))
    assert "queued" in now["progress"] and now["remove"]["visible"] is True
