"""Sharded training (`sharding: fsdp`, jobs/train/sharding.py) on CPU with gloo: two FSDP2 ranks train
what one process trains with the same global batch (losses and adapter), their checkpoints resume on one
process and one process's on two sharded ranks; the fused engine's gradients under FSDP; DPO and an
image-text model and a 4-bit base (FSDP-QLoRA) sharded; GRPO's sampling through sharded layers in lockstep (a sharded GRPO job:
tests/jobs/train/test_grpo_job.py); the spec refuses what does not shard yet. The fit check of a
sharded run: tests/jobs/models/test_fit_shard.py."""
import json

import pytest
import torch

from jobs.io.events import summarize
from jobs.spec import JobSpec, SpecError
from tests.jobs.train.job_runs import (adapter_weights, assert_same_training, finish, free_port, grads, run_job,
                                       train, write_config)
from tests.jobs.train.method_jobs import PAIRS
from tests.kernels.tiny_peft import lora_model
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
    model = lora_model(folder)
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
    reference = grads(model)
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
    torch.multiprocessing.start_processes(_fsdp_rank, args=(folder, free_port(), tmp_path), nprocs=2,
                                          start_method="spawn")
    for rank in (0, 1):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert got["report"][0].startswith("sharding: fsdp over 2 processes")
        assert any("triton  lora_mlp" in line for line in got["report"]), got["report"]
        for sharded in got["fsdp"]:
            torch.testing.assert_close(sharded, got["reference"], rtol=1e-4, atol=1e-6)
        assert got["reference"].abs().max() > 1e-3


def _decode_rank(rank, folder, port, out):
    """One gloo rank: greedy completions of the unsharded policy (LoRA on), then of the same policy
    sharded over two ranks in lockstep (jobs/train/rollout.py `peers`). Rank 0's rows all end at their
    first token (every id is EOS) while rank 1's run to the end: alone, rank 0 would stop decoding at
    the first check and leave rank 1 waiting in an all-gather. Then `sample_completions` where rank 1's
    wider prompts pass the (pretended) sliding window and need transformers' generate: both ranks
    must take that path, with synced_gpus."""
    import torch.distributed as dist
    from transformers import AutoTokenizer

    from jobs.train import decode, sharding
    from jobs.train.distributed import Distributed
    from jobs.train.rollout import pad_left, sample_completions
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    model, tok = lora_model(folder), AutoTokenizer.from_pretrained(folder)
    with torch.no_grad():   # a LoRA that changes the output
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=torch.Generator().manual_seed(1)) * 0.5)
    model.eval()
    prompts = [[5, 17, 33, 40], [12, 7]] if rank == 0 else [[99, 100, 101, 3, 8, 9, 10, 11], [44]]
    ids, mask = pad_left(prompts, tok.pad_token_id, "cpu")
    eos = set(range(len(tok))) if rank == 0 else set()
    model.config.sliding_window = 19   # rank 0: 4 + 12 tokens fit; rank 1: 8 + 12 do not -> generate

    def run(peers):
        all_done = None if peers is None else (lambda mine: not peers.agree(not mine))
        tokens = decode.decode(model, ids, mask, 12, 0.0, 1.0, eos, tok.pad_token_id, use_graph=False,
                               all_done=all_done).tolist()
        sampled = sample_completions(model, tok, prompts, 2, 12, 1.0, 1e-6, "cpu", use_graph=False, peers=peers)
        return tokens, sampled
    reference = run(None)
    group = Distributed(rank=rank, world_size=2, local_world_size=2, local_rank=rank, backend="gloo")
    sharding.shard_model(model, group, log=lambda _: None)
    torch.save({"reference": reference, "fsdp": run(group)}, out / f"decode{rank}.pt")
    dist.destroy_process_group()


def test_sharded_ranks_sample_in_lockstep_what_the_unsharded_policy_samples(tmp_path):
    """GRPO's sampling through FSDP-sharded layers (every forward gathers: a collective) gives the
    unsharded policy's tokens, also when one rank's rows end long before the other's and when the
    ranks' prompt widths would send them down different paths (decode loop vs generate)."""
    folder = make_tiny_model(tmp_path / "one-layer", layers=1)
    torch.multiprocessing.start_processes(_decode_rank, args=(folder, free_port(), tmp_path), nprocs=2,
                                          start_method="spawn")
    for rank in (0, 1):
        got = torch.load(tmp_path / f"decode{rank}.pt")
        assert got["fsdp"] == got["reference"]
    assert {len(row) for row in torch.load(tmp_path / "decode1.pt")["fsdp"][1]} == {12}   # ran to the end


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
    # a checkpoint folder holds its adapter as a job folder does
    assert adapter_weights(tmp_path / "fsdp/checkpoints/step-4").keys() == \
        adapter_weights(tmp_path / "one/checkpoints/step-4").keys()

    losses = _losses(tmp_path / "fsdp")
    on_one, on_two = tmp_path / "on-one", tmp_path / "on-two"
    finish(train(config, "--output_dir", str(on_one), "--processes", "1", "--batch_size", "4",
                 "--resume_from", str(tmp_path / "fsdp/checkpoints/step-4")),
           train(config, "--output_dir", str(on_two), "--resume_from", str(tmp_path / "one/checkpoints/step-4")))
    for resumed in (on_one, on_two):
        got = _losses(resumed)
        assert sorted(got) == [5, 6, 7, 8]
        assert [got[s] for s in got] == pytest.approx([losses[s] for s in got], rel=1e-5)
    want = adapter_weights(tmp_path / "fsdp")
    for resumed in (on_one, on_two):
        got = adapter_weights(resumed)
        assert max((got[k] - want[k]).abs().max().item() for k in want) < 0.05 * 2e-3


@pytest.mark.parametrize("overrides, named", [({"base_precision": "fp8", "fused_kernels": True}, "base_precision: fp8")])
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
    data = tmp_path / "pairs.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in PAIRS) + "\n")
    common = dict(method="dpo", dataset=str(data), eval_dataset=str(data), max_steps=2, learning_rate=5e-3,
                  save_steps=0, max_seq_length=64)
    (done_one, one), (done_two, two) = (run_job(tmp_path, "one", tiny_model, batch_size=4, **common),
                                        run_job(tmp_path, "two", tiny_model, batch_size=2, processes=2,
                                                sharding="fsdp", **common))
    for done in (done_one, done_two):
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    a, b = summarize(one), summarize(two)
    assert [s["loss"] for s in b.steps] == pytest.approx([s["loss"] for s in a.steps], rel=1e-5)
    assert [s["reward_margin"] for s in b.steps] == pytest.approx([s["reward_margin"] for s in a.steps], abs=1e-5)
    assert b.evals[-1]["eval_loss"] == pytest.approx(a.evals[-1]["eval_loss"], rel=1e-5)
    got, want = adapter_weights(two), adapter_weights(one)
    assert got.keys() == want.keys() and max((got[k] - want[k]).abs().max().item() for k in want) < 1e-4


def test_a_sharded_vision_job_with_a_text_only_rank_trains_as_one_process(tmp_path, tiny_vision_model):
    """Qwen2.5-VL under fsdp with vision_lora: the language layers sharded, the tower with the root.
    One row with an image and three without, two a step: one step has one rank run the tower and the
    other not (its tower LoRA gets no gradient, its first layer's input none of the tower's), the
    other step no rank (the tower's LoRA is left untouched, as one process leaves it). The ranks
    still reduce alike, and train what one process trains."""
    from PIL import Image

    Image.new("RGB", (56, 56), (200, 30, 30)).save(tmp_path / "red.png")
    rows = [{"messages": [{"role": "user", "content": [{"type": "image", "image": "red.png"},
                                                        {"type": "text", "text": "What colour is this?"}]},
                          {"role": "assistant", "content": "Red."}]},
            *[{"messages": [{"role": "user", "content": f"Say {w}."}, {"role": "assistant", "content": w}]}
              for w in ("one", "two", "three")]]
    (tmp_path / "mixed.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    common = dict(dataset=str(tmp_path / "mixed.jsonl"), max_steps=2, max_seq_length=64, learning_rate=3e-3,
                  packing="off", vision_lora=True, warmup_steps=0)
    two, _ = finish(train(write_config(tmp_path, "two", tiny_vision_model, batch_size=1, processes=2,
                                       sharding="fsdp", **common)),
                    train(write_config(tmp_path, "one", tiny_vision_model, batch_size=2, **common)))
    assert "the vision tower with the root" in two
    a, b = summarize(tmp_path / "two"), summarize(tmp_path / "one")
    assert [s["loss"] for s in a.steps] == pytest.approx([s["loss"] for s in b.steps], rel=1e-5)
    got, want = adapter_weights(tmp_path / "two"), adapter_weights(tmp_path / "one")
    assert got.keys() == want.keys() and any("visual" in k for k in got)
    assert max((got[k] - want[k]).abs().max().item() for k in want) < 0.05 * 3e-3   # 5 % of one AdamW step
    assert min(want[k].abs().max().item() for k in want if "lora_B" in k) > 1e-3   # tower and language trained


def test_a_sharded_4bit_base_trains_as_one_process(tmp_path, tiny_model):
    """FSDP-QLoRA on CPU (bitsandbytes' CPU path): the NF4 codes split into each rank's shard
    (bitsandbytes' Params4bit survives FSDP2's torch.chunk) and gathered for each layer, its quant
    state recovered from the module. Two ranks train what one process trains; the fused engine says
    why its NF4 path stands aside. The GPU's: bench/fsdp_qlora_check.py."""
    common = dict(load_in_4bit=True, fused_kernels=True, max_steps=2, warmup_steps=0)
    two, _ = finish(train(write_config(tmp_path, "two", tiny_model, processes=2, sharding="fsdp", **common)),
                    train(write_config(tmp_path, "one", tiny_model, batch_size=4, **common)))
    assert "4-bit weight sharded by FSDP" in two
    a, b = summarize(tmp_path / "two"), summarize(tmp_path / "one")
    assert [s["loss"] for s in a.steps] == pytest.approx([s["loss"] for s in b.steps], rel=1e-5)
    got, want = adapter_weights(tmp_path / "two"), adapter_weights(tmp_path / "one")
    assert got.keys() == want.keys() and max((got[k] - want[k]).abs().max().item() for k in want) < 0.05 * 2e-3
