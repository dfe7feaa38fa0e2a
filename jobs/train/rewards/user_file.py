"""A user's reward file: a Python file whose top-level functions not starting with `_` are rewards
named after themselves (TRL's reward-function shape). It is code: the studio accepts one only
from its data dir's rewards/ or an --allow-dir folder (jobs/checks/access.py), checked before the
job starts, and the rule for code (jobs/checks/reward_code.py) is checked again here, right before
the import, on the resolved path."""
from __future__ import annotations

import importlib.util
import inspect
import os
import sys
from pathlib import Path

from jobs.checks.reward_code import check_reward_code
from jobs.messages import say
from jobs.spec import SpecError


def load_reward_file(path: str | Path, data_dir: str | Path | None = None) -> dict:
    """{name: function} of the file's own public top-level functions; SpecError naming
    reward_file when the rule for code forbids it (`data_dir`: the job's data dir, default
    $FUSETUNE_HOME or ~/.fusetune as jobs/io/paths.py picks it), or it cannot be imported or has none."""
    path = Path(path).expanduser()
    check_reward_code(path, data_dir or os.environ.get("FUSETUNE_HOME") or Path.home() / ".fusetune")
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
