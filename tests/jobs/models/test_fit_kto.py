"""KTO within max_gpu_memory_gb (issue 38, jobs/models/fit_kto.py): the pass with grad holds the
completions alone, so where the job knows how many completion tokens its passes hold the plan keeps
more layers; where a pass may hold a whole row of them (tiny KL answers), or the data is not known
(Start, --dry-run), it plans whole rows as before. Shapes only (the 1B KTO bench job: one packed row
of 2 x 2,800 tokens a step within 4.84 GiB), no weights: each test takes milliseconds."""
import pytest

from jobs.models import fit, fit_kto
from tests.jobs.models.model_shapes import config, pref

H200 = 140 * 2 ** 30
ROW = 2 * 2800

pytestmark = pytest.mark.usefixtures("roomy_host")


def bench_job(budget=4.84, rows=1):
    return pref(budget, "kto", rows=rows, seq=2800)


def kept(plan) -> int:
    return sum(not flag for flag in plan[0])


def estimate(job, **sizes):
    return fit.estimate_peak(job, config("llama-3.2-1b"), packed=True, free_bytes=H200, total_bytes=H200, **sizes)


def test_short_completions_keep_more_layers_within_the_same_budget():
    """The bench job's whole-row plan keeps 6 of 16 layers (10 recomputed, offloaded: 4.69 GiB predicted,
    as its row of bench/results/job.jsonl says). A pass whose completions are 3,000 of its 5,600 tokens
    keeps 11 (0.32 GiB a layer at 5,600 tokens); the estimate sizes that pass and stays within the budget."""
    model, job = config("llama-3.2-1b"), bench_job()
    whole, short = fit.plan_within_budget(job, model), fit.plan_within_budget(job, model, kto_completions=(3000,))
    assert kept(whole) == 6 and kept(short) == 11 and "5 of 16 layers recomputed" in short[2]
    assert estimate(job).tokens == ROW and abs(estimate(job).allocated_gb - 4.69) < 0.01
    short_estimate = estimate(job, kto_completions=(3000,))
    assert short_estimate.tokens == 3000 and short_estimate.allocated_gb <= 4.84 and not short_estimate.over_budget
    assert short_estimate.checkpointing == short[2]
    assert any("at most 3,000 of a pass's 5,600 tokens" in note for note in short_estimate.notes)


@pytest.mark.parametrize("completions", [ROW, ROW + 1000])
def test_a_pass_that_may_hold_a_whole_row_of_completions_is_planned_as_whole_rows(completions):
    """Tiny KL answers leave a packed row's room to completions: the bound is then the whole row (and
    never more), and the plan is the whole-row one."""
    model, job = config("llama-3.2-1b"), bench_job()
    assert fit.plan_within_budget(job, model, kto_completions=(completions,)) == fit.plan_within_budget(job, model)
    assert estimate(job, kto_completions=(completions,)).tokens == ROW


def test_the_forwards_without_grad_set_the_floor_when_the_completions_are_few():
    """A pass whose completions are a handful of tokens keeps every layer, and the step then peaks in
    the reference pass over the whole row (no grad: one layer's forward, 3 I + 4 h values a token)."""
    job = bench_job()
    few = estimate(job, kto_completions=(64,))
    free = fit_kto.no_grad_bytes(fit._Shape.of(config("llama-3.2-1b")), ROW, 2)
    assert few.parts[fit_kto.NO_GRAD_PART] == free and few.checkpointing.endswith("no recompute")
    assert abs(few.allocated_gb - (2.302 + 0.168 + free / 2 ** 30)) < 0.005
    # a budget the floor does not fit is not met by keeping fewer layers: one unit a pass, every layer
    tight = bench_job(budget=(few.parts["base weights"] + few.parts["LoRA + AdamW (fp32)"]) / 2 ** 30 + 0.2)
    assert "does not fit" in fit.plan_within_budget(tight, config("llama-3.2-1b"), kto_completions=(64,))[2]


def test_passes_are_sized_by_the_completions_they_hold():
    """8 rows of 5,120 tokens a micro-batch within 4.0 GiB: whole rows train in 3 passes of up to 3 rows;
    rows whose passes hold 3,100 completion tokens a row, in 2 passes of 4 (15 of 16 layers recomputed
    either way)."""
    model, job = config("llama-3.2-1b"), pref(4.0, "kto", rows=8, seq=2560)
    completions = (3100,) * 8
    assert fit.pass_units(job, model) == 3
    assert fit.pass_units(job, model, kto_completions=completions) == 4
    planned = estimate(job, kto_completions=completions)
    assert planned.allocated_gb <= 4.0 and planned.tokens == 4 * 3100
    assert "passes of up to 4 of its 8 units" in planned.notes[0] and "15 of 16" in planned.checkpointing
