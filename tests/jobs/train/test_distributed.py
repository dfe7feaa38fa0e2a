"""Data-parallel jobs (jobs/train/distributed.py, jobs/launch.py) on CPU with gloo: the same update as
one process with the same global batch, two nodes simulated on one host, resume, and the DDP hooks
under the fused engine."""
import os
import signal
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
import yaml

from jobs import launch
from jobs.train.distributed import Distributed, rescale_micro_index
from jobs.io.events import summarize
from jobs.io.layout import JobLayout
from tests.conftest import ROOT
from tests.jobs.data.example_lengths import long_tailed, make_examples
from tests.jobs.train.job_runs import ENV, assert_same_training, finish, free_port, grads, train, write_config
from tests.kernels.tiny_peft import lora_model
from tests.tiny import make_tiny_model
from tests.waiting import wait_for


# ---- pure parts ------------------------------------------------------------------------------
def test_shards_are_contiguous_disjoint_and_cover_the_batch():
    items = list(range(10))
    for world in (1, 2, 3, 4):
        parts = [Distributed(rank=r, world_size=world).shard(items) for r in range(world)]
        assert sum(parts, []) == items
        assert max(map(len, parts)) - min(map(len, parts)) <= 1
    # a full global micro-batch gives each rank exactly batch_size rows, in order
    assert Distributed(rank=1, world_size=2).shard(list("abcd")) == ["c", "d"]
    # a short last batch can leave a rank with nothing (the trainer gives it an untrained stand-in)
    assert Distributed(rank=0, world_size=2).shard(["x"]) == []


def _steps(plan, epoch):
    """Per optimizer step (or its part in this epoch): the units of each of its micro-batches."""
    steps: dict[int, list] = {}
    for index, (units, _) in enumerate(plan.my_batches(epoch)):
        steps.setdefault((epoch * plan.per_epoch + index) // plan.accumulation, []).append(units)
    return list(steps.values())


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("per_rank, accumulation", [(1, 3), (2, 2), (3, 1)])
def test_every_step_is_dealt_to_the_ranks_whole_disjoint_and_balanced(packed, per_rank, accumulation):
    """Two (and three) ranks together train on exactly the units of each optimizer step of one
    process with the same global batch, no unit twice; each rank's real tokens a step differ from
    the others' by at most the step's longest unit."""

    from jobs.data.packing import BatchPlan
    examples = make_examples(long_tailed(77, 256, seed=5))
    for world in (2, 3):
        def plan(rank, size, ranks=world):
            return BatchPlan(examples, size, 256, packed, seed=4, pad_id=0, accumulation=accumulation,
                             rank=rank, world=ranks)
        one = plan(0, per_rank * world, ranks=1)
        ranks = [plan(rank, per_rank * world) for rank in range(world)]
        for epoch in (0, 1):
            reference = _steps(one, epoch)
            dealt = [_steps(rank, epoch) for rank in ranks]
            assert len({len(d) for d in dealt} | {len(reference)}) == 1
            for step, want in enumerate(reference):
                got = [unit for d in dealt for micro in d[step] for unit in micro]
                assert sorted(got) == sorted(u for micro in want for u in micro)
                assert all(len(micro) <= per_rank for d in dealt for micro in d[step])
                tokens = [sum(ranks[0].unit_tokens(u) for micro in d[step] for u in micro) for d in dealt]
                biggest = max(ranks[0].unit_tokens(u) for micro in want for u in micro)
                assert max(tokens) - min(tokens) <= biggest, (step, tokens)
        # a rank with nothing in a short last micro-batch still builds an untrained batch
        for units, stand_in in ranks[-1].my_batches(0):
            batch = ranks[-1].build(units, stand_in)
            assert (batch.label_tokens == 0) == (not units) and batch.tensors["input_ids"].shape[0] >= 1


def test_one_process_collectives_are_identities():
    one = Distributed()
    assert one.all_reduce_sum(2, 3.5) == [2.0, 3.5]
    assert one.agree(True) and not one.agree(False)
    model = torch.nn.Linear(2, 2)
    assert one.wrap(model) is model and one.describe() == "1 process"


def test_resume_position_is_rescaled_to_another_number_of_processes():
    # 100 examples, batch 2: 50 micro-batches an epoch with one process, 25 with two
    assert rescale_micro_index(60, 100, 2, then=1, now=2) == 25 + 5
    assert rescale_micro_index(30, 100, 2, then=2, now=1) == 50 + 10
    assert rescale_micro_index(7, 100, 2, then=2, now=2) == 7


def failure(exitcode, timestamp=100, pid=4242):
    return SimpleNamespace(exitcode=exitcode, timestamp=timestamp, pid=pid)


def test_root_cause_prefers_a_killed_rank_over_the_ranks_torchrun_stopped():
    failures = {0: failure(-signal.SIGTERM), 1: failure(-signal.SIGKILL), 2: failure(launch.EXIT_PEER_LOST)}
    assert launch.root_cause(failures)[0] == 1
    failures = {0: failure(launch.EXIT_PEER_LOST, 99), 1: failure(1, 100)}
    assert launch.root_cause(failures)[0] == 1
    assert launch.root_cause({0: failure(130), 1: failure(130)})[0] == 0
    assert launch.root_cause({0: failure(-signal.SIGTERM, 99), 1: failure(-signal.SIGKILL)})[0] == 1


def test_a_cancel_is_not_reported_as_the_sigterm_torchrun_sends_a_slower_rank():
    """CI saw it under load: rank 0 saved and exited 130, torchrun's agent SIGTERMed rank 1 while it
    was already past its handler, and the job's reason became 'rank 1 was killed by SIGTERM'."""
    failures = {0: failure(launch.EXIT_CANCELLED, 100), 1: failure(-signal.SIGTERM, 101)}
    rank, cause = launch.root_cause(failures)
    assert rank == 0 and launch.failure_event(rank, cause, [{"type": "start"}]) is None
    alone = launch.root_cause({0: failure(-signal.SIGTERM), 1: failure(launch.EXIT_PEER_LOST)})
    assert alone[0] == 1  # no cancel: a lost peer is still likelier than the SIGTERMed rank


def test_failure_event_names_the_rank_and_keeps_its_own_report():
    killed = launch.failure_event(1, failure(-signal.SIGKILL), [{"type": "start"}])
    assert killed["kind"] == "killed" and killed["rank"] == 1
    assert killed["message"].startswith("rank 1 (pid 4242) was killed by SIGKILL") and "memory" in killed["message"]
    own = {"type": "error", "kind": "oom", "rank": 1, "message": "rank 1: out of GPU memory", "time": 1}
    victim = {"type": "error", "kind": "internal", "rank": 0, "message": "rank 0: lost contact", "time": 2}
    again = launch.failure_event(1, failure(1), [own, victim])
    assert again == {"kind": "oom", "rank": 1, "message": "rank 1: out of GPU memory"}
    assert launch.failure_event(1, failure(1), [victim, own]) is None  # already the last word
    silent = launch.failure_event(0, failure(7), [])
    assert silent["kind"] == "internal" and "rank 0 (pid 4242) exited with code 7" in silent["message"]
    assert launch.failure_event(0, failure(130), []) is None  # a cancel: rank 0 reported it


def test_launch_argv_adds_torchrun_only_for_several_processes():
    assert launch.launch_argv("py", 1) == ["py"]
    argv = launch.launch_argv("py", 2)
    assert argv[:3] == ["py", "-m", "jobs.launch"] and argv[argv.index("--nproc-per-node") + 1] == "2"


def test_a_job_on_several_machines_runs_this_nodes_share_of_a_static_rendezvous():
    """node_rank decides the ranks (static rendezvous), so node 0, at the endpoint, holds rank 0."""
    spec = {"nodes": 3, "node_rank": 2, "rdzv_endpoint": "10.0.0.1:29500"}
    argv = launch.spec_launch_argv("py", 0, spec)
    assert argv[:3] == ["py", "-m", "jobs.launch"]
    options = dict(zip(argv[3::2], argv[4::2]))
    assert options == {"--nnodes": "3", "--node-rank": "2", "--rdzv-backend": "static",
                       "--rdzv-endpoint": "10.0.0.1:29500", "--nproc-per-node": "1", "--max-restarts": "0"}
    assert launch.spec_launch_argv("py", 1, {"nodes": 1}) == ["py"]


def test_the_studios_queue_starts_this_nodes_share_with_the_jobs_rendezvous(tmp_path):
    from jobs.queue.runner import Runner
    from jobs.spec import JobSpec
    spec = JobSpec.from_dict({"nodes": 2, "node_rank": 1, "rdzv_endpoint": "10.0.0.1:29500"})
    _, argv = Runner(tmp_path).preview_command(spec)
    assert argv[1:3] == ["-m", "jobs.launch"] and argv[argv.index("--node-rank") + 1] == "1"
    assert argv[argv.index("--rdzv-endpoint") + 1] == "10.0.0.1:29500" and "-m" in argv[3:]
    assert argv[argv.index("jobs.train") - 1:][:3] == ["-m", "jobs.train", "<job dir>/config.yaml"]


@pytest.mark.parametrize("data, key, words", [
    ({"nodes": 2}, "rdzv_endpoint", "set it to node 0's host:port"),
    ({"nodes": 2, "rdzv_endpoint": "10.0.0.1"}, "rdzv_endpoint", "'10.0.0.1' is not host:port"),
    ({"nodes": 2, "rdzv_endpoint": "10.0.0.1:70000"}, "rdzv_endpoint", "is not host:port"),
    ({"nodes": 2, "rdzv_endpoint": "10.0.0.1:29500", "node_rank": 2}, "node_rank", "number the nodes 0 to 1"),
    ({"node_rank": 1}, "node_rank", "but nodes is 1"),
    ({"rdzv_endpoint": "10.0.0.1:29500"}, "rdzv_endpoint", "a rendezvous is for several machines"),
    ({"nodes": 2, "rdzv_endpoint": "h:1", "cluster": "http://h:8265"}, "nodes", "Ray places the workers"),
])
def test_the_rendezvous_keys_are_refused_naming_the_field(data, key, words):
    from jobs.spec import JobSpec, SpecError
    with pytest.raises(SpecError) as info:
        JobSpec.from_dict(data)
    assert info.value.key == key and words in str(info.value)
    spec = JobSpec.from_dict({"nodes": 2, "node_rank": 1, "rdzv_endpoint": " [fd00::1]:29500 "})
    assert spec.rdzv_endpoint == "[fd00::1]:29500"


# ---- DDP hooks under the fused engine ------------------------------------------------------------
def _ddp_rank(rank, folder, port, out):
    """One gloo rank: gradients of two accumulated micro-batches through DDP, and (on the same
    weights, before wrapping) of the whole global batch in one process."""
    import torch.distributed as dist
    from kernels import patch_model
    from kernels.checkpoint import _set_policy, decoder_layers
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    model = lora_model(folder)
    report = patch_model(model, backend="triton")
    layers = decoder_layers(model)
    _set_policy(layers, [True] * len(layers), True, torch.device("cpu"))  # offloaded recompute
    ids = torch.randint(3, 300, (2, 4, 9), generator=torch.Generator().manual_seed(5))
    count = 2 * 4 * 8
    model.train()
    for micro in ids:
        model(input_ids=micro, labels=micro, num_items_in_batch=count).loss.backward()
    reference = grads(model)
    model.zero_grad(set_to_none=True)
    group = Distributed(rank=rank, world_size=2, local_world_size=2, local_rank=rank, backend="gloo")
    ddp = group.wrap(model)
    results = []
    for _ in range(2):  # a second step: DDP complains there if a hook was missed in the first
        for i, micro in enumerate(ids):
            mine = torch.stack(group.shard(list(micro)))
            with group.accumulating(ddp, last=i == len(ids) - 1):
                ddp(input_ids=mine, labels=mine, num_items_in_batch=count).loss.backward()
        results.append(grads(model))
        model.zero_grad(set_to_none=True)
    torch.save({"reference": reference, "ddp": results, "report": report.lines()}, out / f"rank{rank}.pt")
    dist.destroy_process_group()


def test_ddp_over_fused_lora_and_offloaded_checkpointing_sums_gradients_like_one_process(tmp_path):
    """The Triton LoRA/loss autograd Functions (interpreted on CPU) and the offloaded checkpoint's
    nested backward feed DDP's hooks: the all-reduced gradients of two ranks equal one process's
    gradients of the same global batch (summed, not averaged: each rank's loss is already divided
    by the global token count)."""
    folder = make_tiny_model(tmp_path / "one-layer", layers=1)
    # spawn, not fork: forked ranks deadlock on locks held by an earlier test's threads (the
    # session's playwright, when the browser tests run first in the same process)
    torch.multiprocessing.start_processes(_ddp_rank, args=(folder, free_port(), tmp_path), nprocs=2,
                                          start_method="spawn")
    for rank in (0, 1):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert any("triton  lora_mlp" in line for line in got["report"]), got["report"]
        for replica in got["ddp"]:
            torch.testing.assert_close(replica, got["reference"], rtol=1e-4, atol=1e-6)
        assert got["reference"].abs().max() > 1e-3


# ---- whole jobs --------------------------------------------------------------------------------
def node(config, port, *extra):
    """One simulated node: `torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d ...`."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "test-two-nodes",
            "--max-restarts", "0", "-m", "jobs.train", str(config), *extra]
    return subprocess.Popen(argv, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def node_by_keys(config, port, rank):
    """One simulated node as the studio starts it: `python -m jobs.train` with the job's own keys
    (nodes, node_rank, rdzv_endpoint), which relaunches itself through torchrun's rendezvous."""
    return train(config, "--nodes", "2", "--node_rank", str(rank), "--rdzv_endpoint", f"127.0.0.1:{port}")


@pytest.mark.parametrize("packing, started", [("off", "torchrun"), ("on", "keys")])
def test_two_nodes_on_one_host_train_the_same_adapter_as_one_process(tmp_path, tiny_model, packing, started):
    """Two torchrun launchers (one process each, rendezvous on localhost, gloo) with batch 2
    per rank against one process with batch 4: the same global batch, so the same loss curve and
    the same LoRA weights, evaluation and best adapter (keep_best). Packed rows of 160 tokens hold
    one or two of the tiny model's examples, so the ranks' rows differ in real tokens. Started as
    the README's hand-typed torchrun command, or by the job's keys (nodes, node_rank,
    rdzv_endpoint: what the studio on each node runs)."""
    steps = 6
    config = write_config(tmp_path, "nodes", tiny_model, packing=packing, max_steps=steps,
                          max_seq_length=160 if packing == "on" else 64, eval_fraction=0.1, eval_steps=2,
                          keep_best=True)
    port = free_port()
    nodes = ([node(config, port), node(config, port)] if started == "torchrun"
             else [node_by_keys(config, port, 1), node_by_keys(config, port, 0)])
    outputs = finish(*nodes, train(config, "--output_dir", str(tmp_path / "one"), "--batch_size", "4"))
    if started == "keys":
        assert "1 process on node 0 of 2 through torchrun" in outputs[1]
    two, one = assert_same_training(tmp_path / "nodes", tmp_path / "one", steps)
    assert (two.start["processes"], two.start["nodes"], two.start["global_batch"]) == (2, 2, 4)
    assert (one.start["processes"], one.start["global_batch"]) == (1, 4)
    assert two.start["packing"] is one.start["packing"] is (packing == "on")
    # each rank evaluated its share; rank 0 reported the whole set's loss and kept the best adapter
    assert [(e["step"], e["eval_tokens"], e["best"]) for e in two.evals] == \
        [(e["step"], e["eval_tokens"], e["best"]) for e in one.evals] and len(two.evals) == 3
    assert [e["eval_loss"] for e in two.evals] == pytest.approx([e["eval_loss"] for e in one.evals], rel=1e-5)


def test_processes_2_from_the_cli_accumulates_and_resumes(tmp_path, tiny_model):
    """`processes: 2` makes `python -m jobs.train` relaunch itself through torchrun. Gradient
    accumulation across ranks under the fused engine with checkpointing trains like one process
    with the same global batch (4 x 2), and a resume from a checkpoint gives the losses of the
    unbroken run."""
    config = write_config(tmp_path, "two", tiny_model, processes=2, gradient_accumulation_steps=2,
                          save_steps=4, fused_kernels=True, gradient_checkpointing="on")
    two, one = finish(train(config), train(config, "--output_dir", str(tmp_path / "one"), "--processes", "1",
                                            "--batch_size", "4"))
    assert "2 processes through torchrun" in two and "global batch 8" in two and "global batch 8" in one
    run, _ = assert_same_training(tmp_path / "two", tmp_path / "one", 8)
    assert run.start["global_batch"] == 8 and [c["step"] for c in run.checkpoints] == [4, 8]
    assert yaml.safe_load((tmp_path / "two" / "config.yaml").read_text())["processes"] == 2
    losses = [s["loss"] for s in run.steps]
    resumed = tmp_path / "resumed"
    finish(train(config, "--output_dir", str(resumed), "--resume_from", str(tmp_path / "two/checkpoints/step-4")))
    steps = summarize(resumed).steps
    assert [s["step"] for s in steps] == [5, 6, 7, 8]
    assert [s["loss"] for s in steps] == pytest.approx(losses[4:], rel=1e-4)


# ---- through the runner --------------------------------------------------------------------------
def _runner_spec(model, **kw):
    from jobs.spec import JobSpec
    return JobSpec.from_dict({"model": str(model), "max_steps": 100000, "learning_rate": 1e-3, "save_steps": 0,
                              "max_seq_length": 48, "batch_size": 2, "processes": 2, **kw})


def _ranks(launcher_pid):
    """{rank: psutil.Process} of a torchrun launcher's workers."""
    import psutil
    workers = {}
    for child in psutil.Process(launcher_pid).children():
        rank = child.environ().get("RANK")
        if rank is not None:
            workers[int(rank)] = child
    return workers


def test_cancel_stops_every_rank_at_the_same_step_and_rank_0_saves(tmp_path, tiny_model):
    """A QLoRA job (4-bit base weights, the LoRA weights under DDP) on two CPU processes."""
    from jobs.queue.runner import Runner
    runner = Runner(tmp_path)
    record = runner.submit(_runner_spec(tiny_model, load_in_4bit=True))
    assert runner.command(JobLayout(record.job_dir), 2)[1:3] == ["-m", "jobs.launch"]
    wait_for(lambda: len(summarize(record.job_dir).steps) >= 2)
    assert sorted(_ranks(record.pid)) == [0, 1]
    runner.cancel(record.id)
    final = wait_for(lambda: (r := runner.get(record.id)).finished and r, timeout=120)
    assert final.state == "cancelled" and "adapter saved" in final.reason, final.reason
    log = (tmp_path / "jobs" / record.id / "train.log").read_text()
    stops = {line.split(":")[0]: line.split()[-1] for line in log.splitlines() if ": stopped at step" in line}
    assert set(stops) == {"rank 0", "rank 1"} and len(set(stops.values())) == 1, stops
    step = int(stops["rank 0"])
    assert (tmp_path / "jobs" / record.id / "checkpoints" / f"step-{step}" / "optim.pt").is_file()
    assert (tmp_path / "jobs" / record.id / "adapter" / "adapter_model.safetensors").is_file()
    with pytest.raises(ProcessLookupError):
        os.killpg(record.pid, 0)  # torchrun and both ranks are gone


def test_ranks_appending_to_one_log_write_whole_lines(tmp_path):
    """Under the runner's PYTHONUNBUFFERED, print writes a line's text and its newline apart; ranks sharing
    train.log then merged lines (a CI run: "rank 1: stopped at step 19rank 0: ..."). jobs.train's
    whole_lines makes each line one write: three processes of 3,000 lines each leave none merged."""
    script = ("import sys\nfrom jobs.train.cli import whole_lines\nwhole_lines()\n"
              "for i in range(3000):\n    print(f'rank {sys.argv[1]}: line {i}', flush=True)\n")
    log = tmp_path / "train.log"
    with open(log, "ab") as out:
        ranks = [subprocess.Popen([sys.executable, "-c", script, str(rank)], cwd=ROOT, stdout=out,
                                  env={**os.environ, "PYTHONUNBUFFERED": "1"}) for rank in range(3)]
        assert [rank.wait(timeout=60) for rank in ranks] == [0, 0, 0]
    lines = log.read_text().splitlines()
    assert len(lines) == 9000 and all(line.count("rank") == 1 and line.startswith("rank ") for line in lines)


def test_a_rank_that_dies_fails_the_job_naming_it_and_frees_the_slot(tmp_path, tiny_model):
    from jobs.queue.runner import Runner
    runner = Runner(tmp_path)
    record = runner.submit(_runner_spec(tiny_model))
    waiting = runner.submit(_runner_spec(tiny_model, processes=1, max_steps=2))
    assert runner.get(waiting.id).state == "queued"
    wait_for(lambda: summarize(record.job_dir).steps)
    victim = _ranks(record.pid)[1]
    victim.send_signal(signal.SIGKILL)
    failed = wait_for(lambda: (r := runner.get(record.id)).finished and r, timeout=120)
    assert failed.state == "failed"
    assert failed.reason.startswith(f"rank 1 (pid {victim.pid}) was killed by SIGKILL"), failed.reason
    assert summarize(record.job_dir).final["kind"] == "killed"
    done = wait_for(lambda: (r := runner.get(waiting.id)).finished and r)
    assert done.state == "done", done.reason
