"""After an identity job: the held-out identity questions asked the way a serving stack asks the
adapter (the BASE model's tokenizer and chat template, greedy; jobs/data/builtin/identity_check.py),
scored, logged and put in the `done` event (`identity_heldout`), which the Jobs tab's summary shows.

Cheap: one greedy batch of a few dozen short questions through GRPO's decode loop (jobs/train/
rollout.py, which runs the trained model as it stands: fused kernels and all), a few seconds on a
CPU. Rank 0 only, and not for a sharded (FSDP) model, whose forward is a collective of every rank."""
from __future__ import annotations

from jobs.data import encode
from jobs.data.builtin import identity_check
from jobs.models import load as models
from jobs.spec import BUILTIN_DATASET
from jobs.train import rollout


def heldout_check(trainer) -> dict | None:
    """The held-out scores (identity_check.score), or None when the job is no identity job on one
    process's whole model, or the check could not run (the log says why; the job still succeeds)."""
    spec = trainer.spec
    if spec.dataset != BUILTIN_DATASET or spec.method != "sft" or trainer.sharded or not trainer.dist.is_main:
        return None
    try:
        result = _ask(trainer)
    except Exception as exc:   # noqa: BLE001 - a check after training never fails the finished job
        trainer.log(f"identity held-out check skipped ({type(exc).__name__}: {exc})")
        return None
    trainer.log(summary_line(result))
    return result


def _ask(trainer) -> dict:
    tokenizer = models.load_tokenizer(trainer.source)   # the base's own: no system line of ours
    encode.ensure_chat_template(tokenizer)
    asked = identity_check.questions(with_system=encode.accepts_system(tokenizer))
    texts = [tokenizer.apply_chat_template(list(q.messages), tokenize=False, add_generation_prompt=True)
             for q in asked]
    prompts = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    completions = rollout.sample_completions(trainer.model, tokenizer, prompts, 1, identity_check.MAX_NEW_TOKENS,
                                             temperature=0.0, top_p=1.0, device=trainer.device)
    answers = [tokenizer.decode(ids, skip_special_tokens=True).strip() for ids in completions]
    return identity_check.score(asked, answers, trainer.spec.bot_name, trainer.spec.bot_author)


def summary_line(result: dict) -> str:
    with_system = result.get("identity_with_system")
    system = "" if with_system is None else f", {with_system}/{result['identity_total']} after a user's system message"
    return (f"identity held-out: {result['identity']}/{result['identity_total']} answered with the name and "
            f"author under the base model's template{system}; general answers kept: "
            f"{result['general']}/{result['general_total']}")
