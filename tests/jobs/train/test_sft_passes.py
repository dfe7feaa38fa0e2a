"""A packed SFT micro-batch within max_gpu_memory_gb may train in passes of fewer rows
(jobs/models/fit_passes.py, jobs/data/packing.py Passes): the trainer plans them after counting the
LoRA parameters and logs the split; the passes give the whole micro-batch's loss and gradients (the
step's count covers every answer token), and the data order a checkpoint records does not change.
The split is for GPUs only, so here the GPU guard is opened and the plan's arithmetic replaced by a
spy (the arithmetic: tests/jobs/models/test_budget.py)."""
from jobs.data.packing import Batch, BatchPlan, Passes, passes_of
from jobs.spec import JobSpec
from jobs.train import rng_state
from tests.jobs.train.passes_check import assert_passes_give_the_whole, trainer_in_passes


def test_an_sft_micro_batch_in_passes_gives_the_whole_ones_loss_and_gradients(tmp_path, tiny_model, monkeypatch):
    job = tmp_path / "job"
    spec = JobSpec.from_dict({"model": str(tiny_model), "output_dir": str(job), "packing": "on", "batch_size": 4,
                              "max_seq_length": 64, "dtype": "fp32", "max_steps": 1, "save_steps": 0,
                              "max_gpu_memory_gb": 3.0})
    trainer, seen, lines = trainer_in_passes(spec, job, monkeypatch)
    assert seen["trainable"] == trainer.trainable > 0 and trainer.plan.pass_units == 1
    assert any("sft: each micro-batch of 4 packed rows trains in passes of up to 1" in line for line in lines)
    assert trainer.eval_plan is None or trainer.eval_plan.pass_units is None   # evaluation takes them whole

    epoch, batch = trainer.plan.batch_at(0)
    parts = trainer.method.prepare_step([(epoch, batch)])
    assert isinstance(batch, Passes) and len(parts) == len(batch.parts) == 4
    monkeypatch.setattr(Batch, "pinned", lambda self: self)   # no pinned memory without CUDA
    assert isinstance(batch.pinned(), Passes) and len(batch.pinned().parts) == 4   # the Prefetcher's copy
    whole_plan = BatchPlan(trainer.examples, 4, 64, True, spec.seed, pad_id=trainer.tokenizer.pad_token_id)
    whole = whole_plan.batch_at(0)[1]
    assert sum(p.label_tokens for _, p in parts) == whole.label_tokens == batch.label_tokens
    assert sum(p.real_tokens for _, p in parts) == whole.real_tokens
    assert rng_state.data_order_digest(whole_plan) == trainer.data_order   # a resume may change the split
    assert_passes_give_the_whole(trainer, whole, [p for _, p in parts])


def test_fixed_shapes_are_a_passes_rows(tmp_path):
    """A captured step (jobs/train/graph_steps.py) sees every pass with the same tensor shapes: the
    pass's rows, not the micro-batch's."""
    from jobs.data.encode import Example
    examples = [Example(input_ids=list(range(1, n + 1)), labels=list(range(1, n + 1)))
                for n in (9, 7, 5, 12, 3, 8, 6, 4)]
    plan = BatchPlan(examples, 4, 16, True, 0, pad_id=0, pass_units=2)
    plan.fix_shapes()
    batch = plan.batch_at(0)[1]
    assert isinstance(batch, Passes)
    assert {tuple(p.tensors["input_ids"].shape) for p in batch.parts} == {(2, 16)}
    assert {p.tensors["cu_seq_lens_q"].numel() for p in batch.parts} == {plan.fixed[1]}


def test_every_rank_runs_as_many_passes_as_a_full_micro_batch():
    """Two ranks, a row a pass: an epoch's short last micro-batch (3 rows for 2 ranks of 2) leaves one
    rank a row short; it still runs two passes (the second a stand-in without labels), since FSDP
    gathers each layer in every forward and a rank a pass behind would hang the others."""
    from jobs.data.encode import IGNORE_INDEX, Example
    examples = [Example(input_ids=list(range(1, n + 1)), labels=list(range(1, n + 1)))
                for n in (9, 7, 5, 12, 3, 8, 6)]
    ranks = [BatchPlan(examples, 4, 16, False, 0, pad_id=0, rank=rank, world=2, pass_units=1) for rank in (0, 1)]
    counts = [[len(passes_of(rank.build(*mine))) for mine in rank.my_batches(0)] for rank in ranks]
    assert counts == [[2, 2], [2, 2]]
    short = [passes_of(rank.build(*rank.my_batches(0)[-1])) for rank in ranks]
    stand_ins = [p for parts in short for p in parts if p.label_tokens == 0]
    assert len(stand_ins) == 1 and (stand_ins[0].tensors["labels"] == IGNORE_INDEX).all()
