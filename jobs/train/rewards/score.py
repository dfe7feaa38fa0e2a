"""The rewards of a GRPO job, by name and weight, scored over a step's completions.

The total reward of a completion is sum_k weight_k * reward_k (TRL's `reward_weights`). Each
reward gets the prompts, the completions and the prompt rows' other columns by name (one value per
completion: a row's values repeat for its num_generations completions), plus `completion_lengths`
(tokens) and `max_completion_length`; a reward that raises, returns the wrong count or a
non-number fails the job, with its traceback in train.log and its name in the message."""
from __future__ import annotations

import math
import traceback

from jobs.messages import say
from jobs.spec import SpecError, reward_entries
from jobs.train.rewards.builtin import BUILTIN
from jobs.train.rewards.user_file import load_reward_file

PRESETS = {"builtin:arithmetic": ["answer:1", "format:0.5"]}
DEFAULT = ["answer:1", "format:0.5"]


class RewardError(SpecError):
    """A reward function failed during the job (its name leads the message)."""


class RewardSet:
    def __init__(self, names: list[str], reward_file: str = "", log=print, data_dir=None):
        self.log = log
        known = dict(BUILTIN)
        if reward_file:
            known.update(load_reward_file(reward_file, data_dir))
        self.functions, self.weights = {}, {}
        for entry in names:
            name, _, weight = entry.partition(":")
            if name not in known:
                raise SpecError("rewards", say("reward_unknown", name=name, known=", ".join(sorted(known))))
            self.functions[name], self.weights[name] = known[name], float(weight or 1)

    @classmethod
    def for_spec(cls, spec, log=print, data_dir=None) -> "RewardSet":
        """spec.rewards; when empty the dataset's preset, else every function of reward_file,
        else answer + format. `data_dir`: the job's, for the rule for code (load_reward_file)."""
        names = reward_entries(spec.rewards) or PRESETS.get(spec.dataset)
        if not names and spec.reward_file:
            names = [f"{n}:1" for n in load_reward_file(spec.reward_file, data_dir)]
        return cls(names or DEFAULT, spec.reward_file, log=log, data_dir=data_dir)

    @property
    def names(self) -> list[str]:
        return list(self.functions)

    def score(self, prompts: list, completions: list, columns: dict, lengths: list[int],
              max_completion_length: int) -> tuple[list[float], dict[str, list[float]]]:
        """(total reward per completion, {name: its rewards})."""
        each = {}
        for name, function in self.functions.items():
            each[name] = self._call(name, function, prompts, completions, columns, lengths, max_completion_length)
        totals = [sum(self.weights[n] * each[n][i] for n in each) for i in range(len(completions))]
        return totals, each

    def _call(self, name, function, prompts, completions, columns, lengths, max_length) -> list[float]:
        try:
            values = function(prompts, completions, completion_lengths=lengths, max_completion_length=max_length,
                              **columns)
            values = [float(v) for v in values]
        except Exception as exc:
            self.log(f"reward {name} raised:\n{traceback.format_exc()}")
            detail = f"{type(exc).__name__}: {exc}"
            raise RewardError("rewards", say("reward_raised", name=name, detail=detail)) from exc
        if len(values) != len(completions) or not all(math.isfinite(v) for v in values):
            raise RewardError("rewards", say("reward_bad_values", name=name, count=len(completions), got=len(values)))
        return values
