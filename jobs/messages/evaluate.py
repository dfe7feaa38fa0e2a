"""(jobs/messages) What an evaluation says (`python -m jobs.evaluate`, jobs/evaluate/): a refused eval
config, eval data it cannot score, a benchmark task it cannot find."""

MESSAGES: dict[str, str] = {
    "eval_job_missing": "{path} is not a job folder (no config.yaml): pick a finished job's folder",
    "eval_no_adapter": "{path} has no trained adapter yet: let the job finish (a cancelled job saves one) first",
    "eval_no_heldout": "the job holds out no data (eval_fraction 0, no eval_dataset): set eval_file to a data file",
    "eval_name_bad": "{value!r} may hold only letters, digits, '-', '_' and '.' (at most 64)",
    "eval_name_taken": "an evaluation named {value!r} already exists in this job: pick another name or leave it empty",
    "eval_text_rows": "{name} holds plain text rows: they have no prompt and answer to compare; use chat, alpaca, "
                      "prompt/answer or preference rows",
    "eval_nothing_to_score": "{name} has no reference answers (an assistant turn or an answer column) and no rewards "
                             "are named: add answers, or set rewards",
    "eval_no_rows": "{name} has no rows to evaluate",
    "eval_one_gpu": "{value!r}: an evaluation runs on one GPU; use auto or one GPU number such as 0",
    # an evaluation run by the studio's queue (jobs/queue/evaluations.py)
    "eval_cancelled_kept": "cancelled: the {rows} rows scored before it are kept, with their table",
    "eval_of_job": "evaluation of {job}",
    "eval_job_busy": "job {job!r} has an evaluation running: cancel it first (the Evaluate tab), then delete the job",
    "eval_ended_without_reason": "the evaluation ended with {exit} without reporting why; see evaluate.log",
    "eval_job_gone": "there is no job {job!r} (deleted?): refresh the list and pick another",
    "eval_task_unknown": "unknown lm-eval task {task!r}: the bundled ones are {bundled}, or any lm-eval task whose "
                         "data is on this machine",
}
