"""The rule for code (docs/SECURITY.md): a reward file is imported only when the operator said so.

A GRPO reward file is Python that the job imports. The operator says a file may run by putting it in
their own reward folder, `<data dir>/rewards/` (or a folder they allow with --allow-dir, outside the
data dir), or by starting the studio with --allow-reward-code, which lets the page upload reward
files into `<data dir>/rewards/uploads/`. Any other file that reached the machine through the studio
(a dataset upload, Gradio's upload cache, a job folder, an export, a downloaded hub repo: everything
the studio writes lives in the data dir and its caches) is never imported, whatever --allow-dir folder
contains it. The studio checks this on the resolved path at Start (jobs/checks/access.py) and the
trainer again before the import (jobs/train/rewards/user_file.py), so a config written by hand or
edited after Start is held to the same rule."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from jobs.messages import say
from jobs.spec import SpecError

ALLOW_REWARD_CODE_ENV = "FUSETUNE_ALLOW_REWARD_CODE"   # app.py --allow-reward-code: reward files may be uploaded
REWARDS_FOLDER = "rewards"             # <data dir>/rewards: the operator's own reward files
UPLOADS_FOLDER = "uploads"             # <data dir>/rewards/uploads: the page's reward uploads
# Where the studio and its libraries write besides the data dir: Gradio's upload cache and the
# Hugging Face caches (a hub model repo may hold .py files). jobs/io/paths.py points them into the
# data dir; an operator may point the Hugging Face ones elsewhere on purpose.
STUDIO_WRITTEN_ENV = ("GRADIO_TEMP_DIR", "HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE")


def reward_uploads_allowed() -> bool:
    """Whether the operator started the studio with --allow-reward-code (uploaded code may run)."""
    return os.environ.get(ALLOW_REWARD_CODE_ENV) == "1"


def rewards_dir(data_dir: str | os.PathLike) -> Path:
    return Path(data_dir) / REWARDS_FOLDER


def reward_uploads_dir(data_dir: str | os.PathLike) -> Path:
    return rewards_dir(data_dir) / UPLOADS_FOLDER


def studio_written_places(data_dir: str | os.PathLike) -> list[Path]:
    """The real paths of every folder the studio writes what reaches it: the data dir, Gradio's
    upload cache (GRADIO_TEMP_DIR, else Gradio's default under the temp dir) and the hub caches."""
    places = [Path(data_dir)]
    places += [Path(os.environ[name]) for name in STUDIO_WRITTEN_ENV if os.environ.get(name)]
    if not os.environ.get("GRADIO_TEMP_DIR"):
        places.append(Path(tempfile.gettempdir()) / "gradio")   # gradio/utils.py get_upload_folder
    return [Path(os.path.realpath(os.path.expanduser(p))) for p in places]


def reward_code_problem(path: str | os.PathLike, data_dir: str | os.PathLike) -> str | None:
    """Why the reward file at `path` may not be imported (a sentence saying the fix), or None.
    Decided on the resolved path (symlinks and `..` followed), whether or not the file exists."""
    real = Path(os.path.realpath(os.path.expanduser(path)))
    data = Path(os.path.realpath(data_dir))
    own = rewards_dir(data)
    if real.is_relative_to(reward_uploads_dir(data)):
        return None if reward_uploads_allowed() else say("reward_upload_not_allowed", path=real, folder=own)
    if real.is_relative_to(own):
        return None   # the operator's own reward folder
    if any(real.is_relative_to(place) for place in studio_written_places(data)):
        return say("reward_file_from_studio", path=real, folder=own)
    return None


def check_reward_code(path: str | os.PathLike, data_dir: str | os.PathLike, key: str = "reward_file") -> None:
    """SpecError naming `key` when the rule for code forbids importing `path` (see the module doc)."""
    problem = reward_code_problem(path, data_dir)
    if problem:
        raise SpecError(key, problem)
