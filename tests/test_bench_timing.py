"""The benchmarks time our steps by the step events' own durations (step_s), not by the events'
time stamps: the loop writes a step's event while the next step runs, so the stamps lag by up to
a step and their last interval is only the last step's tail (bench/bench_job.py window_stats,
bench/bench_grpo.py step_stats)."""
from bench.bench_grpo import step_stats
from bench.bench_job import window_stats


def test_grpo_steps_are_timed_by_their_durations_not_the_late_stamps():
    # a 4 s step (3.6 s sampling + 0.4 s policy): stamps after each NEXT step's sampling, the last at the end
    stamps = [4.0, 8.0, 12.0, 12.4]
    assert step_stats(stamps, 1)["step_s_mean"] == 2.2          # what the stamps alone say: wrong
    timed = step_stats(stamps, 1, durations=[4.5, 4.0, 4.0, 4.0])
    assert timed["step_s_mean"] == 4.0 and timed["measured_steps"] == 3


def test_job_throughput_uses_step_s_where_the_events_have_it():
    steps = [{"time": t, "tokens": 1000, "loss": 1.0, "peak_gib": 1.0, "step_s": 0.5} for t in (0.5, 1.0, 1.5, 1.6)]
    assert window_stats(steps, 0)["real_tokens_per_s"] == 2000.0
    stamped = [{k: v for k, v in s.items() if k != "step_s"} for s in steps]   # the peers' step-end stamps
    assert window_stats(stamped, 0)["real_tokens_per_s"] == round(3000 / 1.1, 1)


def test_a_peer_cut_off_by_the_step_limit_still_gives_its_last_row(tmp_path, monkeypatch):
    # a stand-in peer: one step's row, then a step slower than the time left (2,048-token completions)
    import argparse
    import bench.bench_grpo as bench_grpo
    peer = tmp_path / "peer.py"
    peer.write_text('import json, time\nprint(json.dumps({"stack": "unsloth+trl (b)", "partial": True, '
                    '"steps_per_s": 0.01, "peak_gib": 9.5}), flush=True)\ntime.sleep(60)\n')
    monkeypatch.setattr(bench_grpo.subprocess, "Popen", _running(peer, bench_grpo.subprocess.Popen))
    monkeypatch.setenv("BENCH_STEP_LIMIT", "17")                   # 2 s for the peer after the 15 s margin
    args = argparse.Namespace(shape="s", dir=tmp_path, prompts=1, generations=2, completion_len=8, steps=2,
                              warmup=1, timeout=560)
    row = bench_grpo.run_unsloth(args)
    assert row["partial"] and row["peak_gib"] == 9.5 and "error" not in row


def test_our_run_cut_off_by_the_step_limit_keeps_the_steps_it_wrote(tmp_path, monkeypatch):
    # a stand-in job: two step events, then a step slower than the time left (a GRPO 8B run, session 59)
    import argparse
    import bench.bench_grpo as bench_grpo
    events = tmp_path / "job-grpo-s" / "events.jsonl"
    job = tmp_path / "job.py"
    job.write_text(f"import json, os, time\nos.makedirs({str(events.parent)!r})\n"
                   f"with open({str(events)!r}, 'w') as f:\n"
                   "    for i in range(2):\n"
                   "        f.write(json.dumps({'type': 'step', 'time': i, 'step_s': 2.0, 'peak_gb': 7.5}) + '\\n')\n"
                   "time.sleep(60)\n")
    monkeypatch.setattr(bench_grpo.subprocess, "Popen", _running(job, bench_grpo.subprocess.Popen))
    monkeypatch.setenv("BENCH_STEP_LIMIT", "18")                   # 3 s for the job after the 15 s margin
    args = argparse.Namespace(shape="s", dir=tmp_path, prompts=1, generations=2, completion_len=8, steps=30,
                              warmup=1, timeout=560, device="cpu", max_gpu_memory_gb=7.6, what="run")
    row = bench_grpo.run_fusetune(args)
    assert row["partial"] and row["steps_done"] == 2 and row["peak_gib"] == 7.5 and "error" not in row
    assert row["step_s"] == [2.0] and "stopped after 3 s" in row["note"]


def _running(script, popen):
    def start(cmd, **kwargs):
        return popen([cmd[0], str(script)], **kwargs)
    return start
