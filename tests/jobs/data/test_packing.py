"""Packing, length grouping, batch plans and the prefetch thread (host side, no model)."""
import random

import pytest
import torch

from jobs.data.encode import Example
from jobs.train.loader import Prefetcher
from jobs.data.packing import BatchPlan, collate_packed, length_grouped, pack, resolve_packing
from jobs.io.events import summarize
from tests.jobs.data.example_lengths import long_tailed, make_examples
from tests.jobs.train.job_runs import run_job


def test_pack_places_every_example_once_within_capacity():
    lengths = long_tailed(500, 1024)
    rows = pack(lengths, 1024, seed=1)
    placed = sorted(i for row in rows for i in row)
    assert placed == list(range(500))
    assert all(sum(lengths[i] for i in row) <= 1024 for row in rows)
    lower_bound = -(-sum(lengths) // 1024)
    assert len(rows) <= lower_bound + 2   # best-fit decreasing is near the bound on such data


def test_pack_is_seeded_and_beats_one_example_a_row():
    lengths = long_tailed(300, 2048, seed=3)
    assert pack(lengths, 2048, seed=7) == pack(lengths, 2048, seed=7)
    assert len(pack(lengths, 2048, seed=7)) < len(lengths) / 4
    with pytest.raises(ValueError, match="more than the row length"):
        pack([10, 600], 512)


def test_pack_finds_the_exact_fit():
    assert sorted(sorted(r) for r in pack([6, 4, 5, 5, 7, 3], 10)) == [[0, 1], [2, 3], [4, 5]]


def test_collate_packed_restarts_positions_and_separates_examples():
    a = Example([11, 12, 13], [-100, 12, 13])
    b = Example([21, 22], [21, 22])          # a text row: its first label would be trained
    c = Example([31, 32, 33, 34], [-100, -100, 33, 34])
    batch = collate_packed([[a, b], [c]], row_length=6, pad_id=0)
    t = batch.tensors
    assert t["input_ids"].tolist() == [[11, 12, 13, 21, 22, 0], [31, 32, 33, 34, 0, 0]]
    assert t["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 1]]
    # b's first label is dropped: a's last token must not learn to predict b's first token
    assert t["labels"].tolist() == [[-100, 12, 13, -100, 22, -100], [-100, -100, 33, 34, -100, -100]]
    assert t["cu_seq_lens_q"].tolist() == [0, 3, 5, 6, 10, 12] and t["cu_seq_lens_q"].dtype == torch.int32
    assert batch.ints == {"max_length_q": 4, "max_length_k": 4}
    assert batch.real_tokens == 9
    assert batch.label_tokens == 5 == int((t["labels"][:, 1:] != -100).sum())


def test_length_grouped_batches_pad_less_than_random_ones():
    lengths = long_tailed(800, 4096, seed=5)
    grouped = length_grouped(lengths, 8, seed=1, epoch=0)
    assert sorted(i for b in grouped for i in b) == list(range(800))
    order = list(range(800))
    random.Random(1).shuffle(order)
    plain = [order[i:i + 8] for i in range(0, 800, 8)]

    def padded(batches):
        return sum(len(b) * max(lengths[i] for i in b) for b in batches)
    assert padded(grouped) < 0.7 * padded(plain)
    assert length_grouped(lengths, 8, 1, 0) == grouped and length_grouped(lengths, 8, 1, 1) != grouped


def test_auto_packs_on_a_gpu_only_when_it_saves_tokens():
    short = long_tailed(200, 2048)
    assert resolve_packing("auto", "cuda", short, 2048)[0] is True
    assert resolve_packing("auto", "cpu", short, 2048)[0] is False
    assert resolve_packing("auto", "cuda", [2048] * 50, 2048)[0] is False
    assert resolve_packing("auto", "cuda", short, 2048, softcap=50.0)[0] is False
    assert resolve_packing("on", "cpu", short, 2048)[0] is True
    assert resolve_packing("off", "cuda", short, 2048)[0] is False


def test_batch_plan_is_resumable_and_reshuffles_each_epoch():
    examples = make_examples(long_tailed(60, 256, seed=2))
    for packed in (True, False):
        plan = BatchPlan(examples, 4, 256, packed, seed=3, pad_id=0)
        again = BatchPlan(examples, 4, 256, packed, seed=3, pad_id=0)
        n = plan.per_epoch
        for index in (0, n - 1, n, 2 * n + 1):
            a, b = plan.batch_at(index)[1], again.batch_at(index)[1]
            assert all(torch.equal(a.tensors[k], b.tensors[k]) for k in a.tensors)
        assert plan.epoch_batches(0) != plan.epoch_batches(1)
        covered = sorted(i for group in plan.epoch_batches(0) for r in group
                         for i in (plan.rows[r] if packed else [r]))
        assert covered == list(range(60))


def test_same_rows_per_step_whatever_the_accumulation_split():
    examples = make_examples(long_tailed(40, 256, seed=4))
    one = BatchPlan(examples, 4, 256, False, seed=1, pad_id=0, accumulation=1)
    two = BatchPlan(examples, 2, 256, False, seed=1, pad_id=0, accumulation=2)
    first = sorted(one.epoch_batches(0)[0])
    assert first == sorted(two.epoch_batches(0)[0] + two.epoch_batches(0)[1])


def test_prefetcher_yields_the_plans_batches_in_order_from_any_start():
    examples = make_examples(long_tailed(30, 128, seed=6))
    plan = BatchPlan(examples, 3, 128, True, seed=2, pad_id=0)
    stream = Prefetcher(plan, start=5, pin=False, depth=2)
    try:
        for index in range(5, 5 + 2 * plan.per_epoch):
            epoch, batch = next(stream)
            expected_epoch, expected = plan.batch_at(index)
            assert epoch == expected_epoch
            assert torch.equal(batch.tensors["input_ids"], expected.tensors["input_ids"])
    finally:
        stream.close()


def test_packed_job_evaluates_and_keeps_the_best_adapter(tmp_path, tiny_model):
    proc, out = run_job(tmp_path, "packed", tiny_model, packing="on", eval_fraction=0.2, eval_steps=4,
                        keep_best=True, max_steps=12, save_steps=0, batch_size=2)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "packing: on" in proc.stdout and "examples packed into" in proc.stdout
    summary = summarize(out)
    assert summary.start["packing"] is True and summary.start["eval_examples"] > 0
    assert [e["step"] for e in summary.evals] == [4, 8, 12]
    losses = [e["eval_loss"] for e in summary.evals]
    assert all(x == x and x > 0 for x in losses) and losses[-1] < losses[0]
    steps = summary.steps
    assert [s["step"] for s in steps] == list(range(1, 13))
    assert all(s["tokens"] > 0 for s in steps)
    best_step = summary.evals[losses.index(min(losses))]["step"]
    assert summary.final["best_step"] == best_step
    adapter = (out / "adapter" / "adapter_model.safetensors").read_bytes()
    assert adapter == (out / "adapter-best" / "adapter_model.safetensors").read_bytes()
    assert f"at step {best_step}" in (out / "adapter" / "README.md").read_text()
    assert (out / "checkpoints" / "step-12" / "optim.pt").is_file()   # the last weights are kept too


def test_fixed_shapes_give_every_batch_the_same_tensors_and_the_same_counts():
    """BatchPlan.fix_shapes (a captured step, jobs/train/graph_steps.py): every batch has batch_size rows
    and room for the most documents; the extra rows and boundaries are empty, the counts unchanged."""
    examples = make_examples(long_tailed(29, 128, seed=8))
    loose = BatchPlan(examples, 3, 128, True, seed=2, pad_id=0)
    fixed = BatchPlan(examples, 3, 128, True, seed=2, pad_id=0)
    fixed.fix_shapes()
    shapes = set()
    for index in range(2 * fixed.per_epoch):
        (_, a), (_, b) = loose.batch_at(index), fixed.batch_at(index)
        shapes.add(tuple((k, tuple(v.shape)) for k, v in sorted(b.tensors.items())) + tuple(sorted(b.ints.items())))
        assert (a.real_tokens, a.label_tokens) == (b.real_tokens, b.label_tokens)
        rows = a.tensors["input_ids"].shape[0]
        assert torch.equal(b.tensors["labels"][:rows], a.tensors["labels"])
        assert bool((b.tensors["labels"][rows:] == -100).all())
        cu_a, cu_b = a.tensors["cu_seq_lens_q"], b.tensors["cu_seq_lens_q"]
        assert torch.equal(cu_b[:len(cu_a)], cu_a) or rows < 3      # a short last batch: its pad rows add documents
        assert int(cu_b[-1]) == 3 * 128 and bool((cu_b[1:] >= cu_b[:-1]).all())
    assert len(shapes) == 1 and fixed.per_epoch > 2
    assert dict(shapes.pop()[-2:]) == {"max_length_k": 128, "max_length_q": 128}


def test_fixed_shapes_need_packing():
    plan = BatchPlan(make_examples(long_tailed(6, 64, seed=1)), 2, 64, False, seed=0, pad_id=0)
    with pytest.raises(ValueError, match="packed rows"):
        plan.fix_shapes()


def test_a_fixed_batch_gives_the_same_loss_and_grads_as_the_packed_one():
    """Empty documents and all-padding rows change nothing: the model's loss and LoRA gradients on
    the fixed-shape batch equal those on the plain packed batch (packed attention, CPU reference)."""
    from kernels.packed_attention import use_packed_attention
    from tests.kernels.tiny_peft import tiny_model, with_lora
    model = with_lora(tiny_model("llama"))
    use_packed_attention(model)
    examples = make_examples(long_tailed(9, 40, seed=5))
    loose = BatchPlan(examples, 4, 48, True, seed=1, pad_id=0)
    fixed = BatchPlan(examples, 4, 48, True, seed=1, pad_id=0)
    fixed.fix_shapes()
    assert len(loose.rows) % 4 != 0                      # so the last batch is short
    results = []
    for plan in (loose, fixed):
        model.zero_grad(set_to_none=True)
        _, batch = plan.batch_at(plan.per_epoch - 1)     # the last batch: the one with missing rows
        loss = model(**batch.to(torch.device("cpu")), num_items_in_batch=torch.tensor(float(batch.label_tokens))).loss
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (loss_a, grads_a), (loss_b, grads_b) = results
    torch.testing.assert_close(loss_b, loss_a, rtol=1e-5, atol=1e-6)
    for name, grad in grads_a.items():
        torch.testing.assert_close(grads_b[name], grad, rtol=1e-4, atol=1e-6)
