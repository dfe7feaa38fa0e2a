"""What the training loop (jobs/train/loop.py) saves, and when: resumable checkpoints, the adapter
(the best one under keep_best), what a cancelled job keeps, and the job's end (its `done` event).

Functions of the running `Trainer` (its model, optimizer, scheduler, step, best eval and process
group); the files themselves are written by jobs/train/checkpoints.py. With several processes only
rank 0 writes, but every rank calls in: a checkpoint gathers each rank's random state (a collective)."""
from __future__ import annotations

import time
from pathlib import Path

from jobs.export import model_card
from jobs.export.card import smoothed_loss, training_outcome
from jobs.train import checkpoints, identity_eval, rng_state, sharding


def train_state(trainer) -> dict:
    """The loop's own state a checkpoint keeps beside the weights (where the data stream stands,
    the best eval so far, the process count and data order it was made with)."""
    best_loss, best_step = trainer.best_eval if trainer.best_eval else (None, None)
    return {"micro_index": trainer.micro_index, "best_eval_loss": best_loss, "best_step": best_step,
            "processes": trainer.dist.world_size, "data_order": trainer.data_order,
            "micro_batch": trainer.spec.batch_size * trainer.dist.world_size}   # a resume on other ranks (distributed.py)


def save_checkpoint(trainer, every_rank: bool = True) -> Path | None:
    """`every_rank`: called on all ranks at once, so each rank's random state is gathered (a
    collective); False where only rank 0 saves (the final checkpoint of keep_best)."""
    mine = rng_state.capture(trainer.device)
    rng = trainer.dist.gather_objects(mine) if every_rank else None
    # sharded (FSDP): the whole LoRA weights and AdamW state gathered to rank 0, a collective of every rank
    weights, optimizer = sharding.gathered_weights(trainer.model), sharding.gathered_optimizer(trainer.model, trainer.optimizer)
    if not trainer.dist.is_main:  # the LoRA weights and optimizer state are the same on every rank
        return None
    folder = checkpoints.save_checkpoint(trainer.job_dir, trainer.step, trainer.model, trainer.optimizer,
                                         trainer.scheduler, train_state(trainer),
                                         rng if rng is not None or trainer.dist.enabled else [mine],
                                         weights=weights, optimizer_state=optimizer)
    trainer.events.emit("checkpoint", step=trainer.step, path=str(folder))
    return folder


def save_adapter(trainer, status: str, best: bool = False) -> Path:
    """The adapter with its model card (`status` says how training ended); adapter-best/ for `best`.
    Called on every rank: a sharded model's LoRA weights are gathered first (a collective)."""
    weights = sharding.gathered_weights(trainer.model)
    if not trainer.dist.is_main:
        return trainer.job_dir / ("adapter-best" if best else "adapter")
    loss, averaged = smoothed_loss(trainer.recent_losses)
    card = model_card(trainer.spec, trainer.source, loss, trainer.step, status, trainer.last_fields,
                      averaged=averaged, eval_loss=trainer.last_eval_loss)
    return checkpoints.save_adapter(trainer.job_dir, trainer.model, trainer.tokenizer, card, best=best,
                                    base_model=trainer.spec.model, weights=weights)


def save_on_stop(trainer) -> str:
    """A cancelled job keeps a checkpoint (to resume) and its adapter; returns the message it stops with."""
    save_checkpoint(trainer)
    adapter = save_adapter(trainer, f"cancelled at step {trainer.step}")
    trainer.dist.barrier()  # no rank exits (and makes torchrun stop the others) before rank 0 saved
    return f"cancelled by the user at step {trainer.step}/{trainer.max_steps}; adapter saved to {adapter}"


def finish(trainer) -> Path:
    """The end of a job that ran all its steps: the last checkpoint and adapter, the `done` event."""
    spec, best_eval = trainer.spec, trainer.best_eval
    if not (spec.keep_best and best_eval is not None):
        # every finished job keeps its final state, whatever save_steps is (the loop's periodic saves
        # stop before the last step): the studio's "train more steps" continues from exactly here.
        # On every rank at once, since each rank's random state is gathered into it
        save_checkpoint(trainer)
    if spec.keep_best and best_eval is not None:
        # the last step's weights stay available (and resumable); every rank calls in (a sharded model gathers)
        save_checkpoint(trainer, every_rank=False)
        adapter = checkpoints.promote_best_adapter(trainer.job_dir) if trainer.dist.is_main else trainer.job_dir / "adapter"
        trainer.log(f"keep_best: adapter/ holds the best eval loss {best_eval[0]:.4f} from step "
                    f"{best_eval[1]}; the last step's weights are in checkpoints/step-{trainer.step}")
    else:
        adapter = save_adapter(trainer, "finished")
    loss, averaged = smoothed_loss(trainer.recent_losses)
    heldout = identity_eval.heldout_check(trainer)   # identity jobs: the name as a serving stack asks for it
    extra = {"identity_heldout": heldout} if heldout else {}
    trainer.events.emit("done", step=trainer.step, final_loss=loss, final_loss_steps=averaged,
                        last_loss=trainer.last_loss, eval_loss=trainer.last_eval_loss, adapter_dir=str(adapter),
                        best_eval_loss=best_eval[0] if best_eval else None,
                        best_step=best_eval[1] if best_eval else None,
                        mean_gpu_util=trainer.sampler.mean_gpu_util(),
                        elapsed_s=round(time.time() - trainer.began, 2), **extra)
    outcome = training_outcome(trainer.spec, loss, trainer.last_fields, averaged,   # GRPO: its reward
                               trainer.last_eval_loss)
    trainer.log(f"done: {trainer.step} steps, {outcome}, adapter in {adapter}")
    return adapter
