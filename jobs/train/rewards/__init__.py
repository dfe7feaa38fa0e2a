"""GRPO's rewards: the built-in ones (builtin.py: answer, format, think_format, length, json) and
a user's reward file (user_file.py), resolved by name from JobSpec's `rewards` and scored together
(score.py). Every reward has TRL's reward-function shape: (prompts, completions, **columns) ->
list[float], where the columns are the prompt rows' other fields (an `answer`, test cases...)."""
