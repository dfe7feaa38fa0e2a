"""Hub models without the wait: decide at once whether a hub id can be loaded.

Without a network, `from_pretrained("owner/name")` spends about 49 s in the hub client's retries
before failing. Here a model already in the local Hugging Face cache is accepted at once, offline
mode (HF_HUB_OFFLINE=1) refuses the rest at once, and otherwise one short connection attempt to
the hub (a few seconds at most) decides, followed by a metadata request that tells a missing or
gated repository from a reachable one."""
from __future__ import annotations

import concurrent.futures
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

from jobs.models.errors import ModelError
from jobs.spec import hub_id_problem

PROBE_TIMEOUT_S = 3.0
TRUTHY = ("1", "on", "yes", "true")
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json")


def offline() -> bool:
    from huggingface_hub import constants
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in TRUTHY or bool(constants.HF_HUB_OFFLINE)


def cached_snapshot(model_id: str) -> Path | None:
    """The model's folder in the local Hugging Face cache, when its config and weights are there."""
    from huggingface_hub import try_to_load_from_cache
    config = try_to_load_from_cache(model_id, "config.json")
    if not isinstance(config, str):
        return None
    folder = Path(config).parent
    weights = [p for pattern in WEIGHT_PATTERNS for p in folder.glob(pattern)]
    return folder if weights else None


def reachable(timeout: float = PROBE_TIMEOUT_S) -> bool:
    """One TCP connection to the hub endpoint, within `timeout` seconds (DNS included)."""
    from huggingface_hub import constants
    url = urlparse(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)

    def connect() -> None:
        with socket.create_connection((url.hostname, port), timeout=timeout):
            pass

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    try:
        pool.submit(connect).result(timeout=timeout)
        return True
    except (OSError, concurrent.futures.TimeoutError):
        return False
    finally:
        pool.shutdown(wait=False)  # a hung DNS lookup is left to finish on its own


def resolve_hub_model(model_id: str) -> str:
    """What to load for a hub id: the id itself, or its cached folder when the hub cannot be
    reached (so loading does not wait on retries). Raises ModelError at once when it cannot be
    loaded at all."""
    problem = hub_id_problem(model_id)
    if problem:
        raise ModelError(f"{problem}; or give a local model folder or .gguf file")
    snapshot = cached_snapshot(model_id)
    if snapshot is not None:
        return model_id if not offline() and reachable() else str(snapshot)
    fix = (f"download it first (`hf download {model_id}` on a machine with network, then copy the "
           "Hugging Face cache) or give a local model folder or .gguf file")
    if offline():
        raise ModelError(f"{model_id} is not in the local Hugging Face cache and the hub is off "
                         f"(HF_HUB_OFFLINE=1): {fix}")
    if not reachable():
        raise ModelError(f"{model_id} is not in the local Hugging Face cache and the Hugging Face Hub "
                         f"cannot be reached from this machine: {fix}")
    _check_repo(model_id)
    return model_id


def _check_repo(model_id: str) -> None:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    try:
        HfApi().model_info(model_id, timeout=10)
    except GatedRepoError:
        raise ModelError(f"{model_id} is gated: accept its licence on huggingface.co and log in "
                         "(`hf auth login`) first") from None
    except RepositoryNotFoundError:
        raise ModelError(f"there is no model {model_id} on the Hugging Face Hub (or it is private): "
                         "check the spelling") from None
    except (HfHubHTTPError, OSError) as exc:
        raise ModelError(f"the Hugging Face Hub did not answer for {model_id}: {exc}") from None
