"""A user's reward file: a Python file whose top-level functions not starting with `_` are rewards
named after themselves (TRL's reward-function shape). It is code: the studio accepts one only
from its data dir or an --allow-dir folder (jobs/checks/access.py), checked before the job starts."""
from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path

from jobs.messages import say
from jobs.spec import SpecError


def load_reward_file(path: str | Path) -> dict:
    """{name: function} of the file's own public top-level functions; SpecError naming
    reward_file when it cannot be imported or has none."""
    path = Path(path).expanduser()
    name = f"fusetune_rewards_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SpecError("reward_file", say("reward_file_not_python", path=path))
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the user's code: say where, never a bare traceback
        raise SpecError("reward_file", say("reward_file_import_failed", name=path.name,
                                           detail=f"{type(exc).__name__}: {exc}")) from exc
    sys.modules.setdefault(name, module)
    functions = {n: f for n, f in vars(module).items()
                 if inspect.isfunction(f) and not n.startswith("_") and f.__module__ == name}
    if not functions:
        raise SpecError("reward_file", say("reward_file_empty", name=path.name))
    return functions
