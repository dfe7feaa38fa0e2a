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
    "eval_task_unknown": "unknown lm-eval task {task!r}: the bundled ones are {bundled}, or any lm-eval task whose "
                         "data is on this machine",
}
