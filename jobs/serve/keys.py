"""The API keys of `python -m jobs.serve`, created and revoked on the Chat tab's Serve panel: one JSON
file in the data dir (`keys_file`, mode 0600) holding each key's id, name, created and last-used
times and only a hash of the key.

A key is "ft-" + 32 random bytes (secrets.token_urlsafe), shown once when it is created. Stored is
its SHA-256: for a 256-bit random token a slow password hash (scrypt, PBKDF2) adds nothing, since
nobody can guess such a token, so GitHub's and Stripe's API tokens are stored this way too (GitHub
blog, "Behind GitHub's new authentication token formats", 2021). `verify` compares the hash with
every stored one in constant time (hmac.compare_digest), so timing tells nothing of which key is near.

The server re-reads the file when it changes (its inode, size or mtime), so a key revoked in the
page stops working at the next request, without a restart. Writers (the page, the server noting
"last used") take an flock on a lock file beside it and replace the file whole."""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import secrets
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from jobs.io import paths
from jobs.io.storage import FILE_MODE

KEYS_FILE = "api-keys.json"
KEY_PREFIX = "ft-"
LAST_USED_EVERY_S = 60.0   # "last used" is written at most once a minute per key, not per request
MAX_NAME = 80


def keys_file(data_dir: str | os.PathLike | None = None) -> Path:
    """Where the studio keeps its API keys: <data dir>/api-keys.json."""
    return paths.data_dir(data_dir) / KEYS_FILE


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


@dataclass
class StoredKey:
    id: str
    name: str
    hash: str
    created: float
    last_used: float | None = None


class KeyStore:
    """The keys in one file; every method re-reads it when another process changed it."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._seen: tuple | None = None
        self._keys: list[StoredKey] = []
        self._lock = threading.Lock()

    def create(self, name: str) -> tuple[StoredKey, str]:
        """(the stored entry, the key itself): the key is returned here once and stored nowhere."""
        name = " ".join((name or "").split())[:MAX_NAME] or "key"
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        entry = StoredKey(id="key_" + secrets.token_hex(4), name=name, hash=hash_key(key), created=time.time())
        with self._writing() as keys:
            keys.append(entry)
        return entry, key

    def revoke(self, key_id: str) -> bool:
        """Remove a key; False when no key has that id."""
        with self._writing() as keys:
            kept = [k for k in keys if k.id != key_id]
            found = len(kept) != len(keys)
            keys[:] = kept
        return found

    def list(self) -> list[StoredKey]:
        with self._lock:
            self._reload()
            return list(self._keys)

    def verify(self, bearer: str) -> StoredKey | None:
        """The stored key whose hash matches `bearer`, else None; every hash is compared."""
        given = hash_key(bearer or "")
        with self._lock:
            self._reload()
            found = None
            for entry in self._keys:
                if hmac.compare_digest(given, entry.hash):
                    found = entry
        if found is not None and time.time() - (found.last_used or 0) > LAST_USED_EVERY_S:
            self._note_used(found.id)
        return found

    def _note_used(self, key_id: str) -> None:
        try:
            with self._writing() as keys:
                for entry in keys:
                    if entry.id == key_id:
                        entry.last_used = time.time()
        except OSError:
            pass   # a read-only store still verifies; only "last used" goes stale

    def _signature(self) -> tuple | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns

    def _reload(self) -> None:
        signature = self._signature()
        if signature == self._seen:
            return
        self._keys = _read(self.path) if signature else []
        self._seen = signature

    @contextlib.contextmanager
    def _writing(self):
        """The keys, read under the file lock; what the caller leaves in the list is written back."""
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock_fd = os.open(self.path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, FILE_MODE)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            keys = _read(self.path) if self.path.exists() else []
            yield keys
            _write(self.path, keys)
            with self._lock:
                self._seen = None   # read ours back next time, with its new signature
        finally:
            os.close(lock_fd)


def _read(path: Path) -> list[StoredKey]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return [StoredKey(**entry) for entry in data.get("keys", [])]
    except (OSError, ValueError, TypeError) as exc:
        raise KeyFileError(f"cannot read the API key file {path}: {exc}; fix it or remove it (its keys "
                           "then stop working)") from None


def _write(path: Path, keys: list[StoredKey]) -> None:
    staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump({"keys": [asdict(k) for k in keys]}, fh, indent=1)
    os.chmod(staging, FILE_MODE)   # O_CREAT's mode is cut by the umask, never widened by it
    os.replace(staging, path)


class KeyFileError(OSError):
    """The key file exists but is not one this module wrote; str() says which file and the fix."""


class Gate:
    """Who may call the API: the operator's `--api-key` and every key in the store. Open (as with
    no key at all) only while neither has held a key since the server started: once the store held
    one, revoking the last key closes the server instead of opening it to everyone."""

    def __init__(self, api_key: str | None, store: KeyStore | None):
        self.api_key, self.store = api_key or None, store
        self.required = self.api_key is not None

    def allows(self, token: str) -> bool:
        if self.store is not None and self.store.list():
            self.required = True
        if not self.required:
            return True
        by_flag = self.api_key is not None and hmac.compare_digest(token.encode(), self.api_key.encode())
        by_store = self.store is not None and self.store.verify(token) is not None
        return by_flag or by_store
