"""Sharded training (`sharding: fsdp`, jobs/train/sharding.py) on CPU with gloo: two FSDP2 ranks train
what one process trains with the same global batch (losses and adapter), their checkpoints resume on one
process and one process's on two sharded ranks; the fused engine's gradients under FSDP; the spec refuses what does
not shard yet. The fit check of a sharded run: tests/jobs/models/test_fit_shard.py."""
import json

import pytest
import torch
from safetensors.torch import load_file

from jobs.io.events import summarize
from jobs.spec import JobSpec, SpecError
from tests.jobs.train.test_distributed import (_free_port, _grads, _lora_model, assert_same_training, finish, train,
                                              write_config)
from tests.tiny import make_tiny_model


def _fsdp_rank(rank, folder, port, out):
    """One gloo rank: the gradients of two accumulated micro-batches of one process (fused engine,
    offloaded recompute), then of this rank's half of each under FSDP2, patched after sharding as
    jobs/train/loop.py does, gathered whole."""
    import torch.distributed as dist

    from jobs.train import sharding
    from jobs.train.distributed import Distributed
    from kernels import patch_model
    from kernels.checkpoint import _set_policy, decoder_layers
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    model = _lora_model(folder)
    ids = torch.randint(3, 300, (2, 4, 9), generator=torch.Generator().manual_seed(5))
    count = 2 * 4 * 8

    def accelerate():
        report = patch_model(model, backend="triton")
        layers = decoder_layers(model)
        _set_policy(layers, [True] * len(layers), True, torch.device("cpu"))  # offloaded recompute
        return report.lines()
    accelerate()
    for micro in ids:
        model(input_ids=micro, labels=micro, num_items_in_batch=count).loss.backward()
    reference = _grads(model)
    model.zero_grad(set_to_none=True)
    group = Distributed(rank=rank, world_size=2, local_world_size=2, local_rank=rank, backend="gloo")
    line = sharding.shard_model(model, group, log=lambda _: None)
    report = accelerate()
    results = []
    for _ in range(2):
        for i, micro in enumerate(ids):
            mine = torch.stack(group.shard(list(micro)))
            with group.accumulating(model, last=i == len(ids) - 1):
                model(input_ids=mine, labels=mine, num_items_in_batch=count).loss.backward()
        results.append(torch.cat([sharding.full_tensor(p.grad).flatten() for p in model.parameters() if p.requires_grad]))
        model.zero_grad(set_to_none=True)
    torch.save({"reference": reference, "fsdp": results, "report": [line, *report]}, out / f"rank{rank}.pt")
    dist.destroy_process_group()


def test_fsdp_over_fused_lora_and_offloaded_checkpointing_sums_gradients_like_one_process(tmp_path):
    """The Triton LoRA/loss ops (interpreted on CPU) read each layer's gathered weights, and the
    offloaded checkpoint's recompute in backward gathers them again: two sharded ranks' gradients
    equal one process's of the same global batch."""
    folder = make_tiny_model(tmp_path / "one-layer", layers=1)
    torch.multiprocessing.start_processes(_fsdp_rank, args=(folder, _free_port(), tmp_path), nprocs=2,
                                          start_method="spawn")
    for rank in (0, 1):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert got["report"][0].startswith("sharding: fsdp over 2 processes")
        assert any("triton  lora_mlp" in line for line in got["report"]), got["report"]
        for grads in got["fsdp"]:
            torch.testing.assert_close(grads, got["reference"], rtol=1e-4, atol=1e-6)
        assert got["reference"].abs().max() > 1e-3


def _losses(job_dir):
    return {s["step"]: s["loss"] for s in summarize(job_dir).steps}


def test_two_sharded_ranks_train_like_one_process_and_their_checkpoints_resume_across_rank_counts(tmp_path, tiny_model):
    """fsdp over two gloo processes (accumulation, packing, the fused engine and recompute on) against one
    process with batch 4: the same losses within 1e-5 and the same adapter, in the same PEFT files.
    The sharded run's step-4 checkpoint (gathered whole) resumes on one process, and the one process's
    checkpoint resumes sharded on two: both give the unbroken run's losses."""
    config = write_config(tmp_path, "fsdp", tiny_model, processes=2, sharding="fsdp", gradient_accumulation_steps=2,
                          save_steps=4, fused_kernels=True, gradient_checkpointing="on", packing="on",
                          max_seq_length=128)
    two, _ = finish(train(config), train(config, "--output_dir", str(tmp_path / "one"), "--processes", "1",
                                         "--batch_size", "4"))
    assert "sharding: fsdp over 2 processes" in two and "FSDP2" in two
    run, _ = assert_same_training(tmp_path / "fsdp", tmp_path / "one", 8)
    assert any(line.startswith("sharding: fsdp") for line in run.start["patch_report"])
    assert sorted(p.name for p in (tmp_path / "fsdp/adapter").iterdir()) == \
        sorted(p.name for p in (tmp_path / "one/adapter").iterdir())
    sharded_ckpt = load_file(str(tmp_path / "fsdp/checkpoints/step-4/adapter/adapter_model.safetensors"))
    assert sharded_ckpt.keys() == load_file(str(tmp_path / "one/checkpoints/step-4/adapter/adapter_model.safetensors")).keys()

    losses = _losses(tmp_path / "fsdp")
    on_one, on_two = tmp_path / "on-one", tmp_path / "on-two"
    finish(train(config, "--output_dir", str(on_one), "--processes", "1", "--batch_size", "4",
                 "--resume_from", str(tmp_path / "fsdp/checkpoints/step-4")),
           train(config, "--output_dir", str(on_two), "--resume_from", str(tmp_path / "one/checkpoints/step-4")))
    for resumed in (on_one, on_two):
        got = _losses(resumed)
        assert sorted(got) == [5, 6, 7, 8]
        assert [got[s] for s in got] == pytest.approx([losses[s] for s in got], rel=1e-5)
    want = load_file(str(tmp_path / "fsdp/adapter/adapter_model.safetensors"))
    for resumed in (on_one, on_two):
        got = load_file(str(resumed / "adapter/adapter_model.safetensors"))
        assert max((got[k] - want[k]).abs().max().item() for k in want) < 0.05 * 2e-3


@pytest.mark.parametrize("overrides, named", [({"method": "grpo", "dataset": "builtin:arithmetic"}, "method: grpo"),
                                               ({"load_in_4bit": True}, "load_in_4bit"),
                                               ({"base_precision": "fp8", "fused_kernels": True}, "base_precision: fp8")])
def test_fsdp_refuses_what_does_not_shard_yet_naming_the_key(overrides, named):
    with pytest.raises(SpecError) as caught:
        JobSpec.from_dict({"sharding": "fsdp", **overrides}, to_run=False)
    assert caught.value.key == "sharding" and named in str(caught.value)
    assert JobSpec.from_dict({"sharding": "auto", **overrides}, to_run=False).sharding == "auto"   # auto: unsharded
    with pytest.raises(SpecError, match="sharding"):
        JobSpec.from_dict({"sharding": "zero3"}, to_run=False)


def test_a_sharded_dpo_job_gives_the_update_of_one_process(tmp_path, tiny_model):
    """DPO under fsdp: the reference pass (adapter off, no grad) and the policy's log-probs through the
    gathered head, over two sharded ranks x 2 pairs, train and evaluate as one process x 4 pairs."""
    from tests.jobs.train.test_preference_job import PAIRS
    from tests.jobs.train.test_train import run_job
    data = tmp_path / "pairs.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in PAIRS) + "\n")
    common = dict(method="dpo", dataset=str(data), eval_dataset=str(data), max_steps=2, learning_rate=5e-3,
                  save_steps=0, max_seq_length=64)
    (done_one, one), (done_two, two) = (run_job(tmp_path, "one", tiny_model, batch_size=4, **common),
                                        run_job(tmp_path, "two", tiny_model, batch_size=2, processes=2,
                                                sharding="fsdp", **common))
    assert done_two.returncode == 0, done_two.stdout[-2000:] + done_two.stderr[-2000:]
    a, b = summarize(one), summarize(two)
    assert [s["loss"] for s in b.steps] == pytest.approx([s["loss"] for s in a.steps], rel=1e-5)
    assert [s["reward_margin"] for s in b.steps] == pytest.approx([s["reward_margin"] for s in a.steps], abs=1e-5)
    assert b.evals[-1]["eval_loss"] == pytest.approx(a.evals[-1]["eval_loss"], rel=1e-5)
    got, want = (load_file(str(d / "adapter/adapter_model.safetensors")) for d in (two, one))
    assert got.keys() == want.keys() and max((got[k] - want[k]).abs().max().item() for k in want) < 1e-4
