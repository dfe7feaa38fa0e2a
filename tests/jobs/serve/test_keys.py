"""The API key store (jobs/serve/keys.py): the key is given once and only its hash is kept, in a file
only its owner reads; verify finds the key until it is revoked, also through a second store object on
the same file (the server's, while the page revokes), and the gate stays shut after the last revoke."""
import json
import stat

from jobs.serve.keys import Gate, KeyStore, hash_key, keys_file


def test_the_key_is_returned_once_and_only_its_hash_is_stored(tmp_path):
    store = KeyStore(keys_file(tmp_path))
    entry, key = store.create("  my   laptop ")
    assert key.startswith("ft-") and len(key) > 40 and entry.name == "my laptop"
    text = store.path.read_text()
    assert key not in text and hash_key(key) in text
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    assert [k.id for k in store.list()] == [entry.id] and json.loads(text)["keys"][0]["last_used"] is None


def test_verify_until_revoked_seen_by_another_store_on_the_file(tmp_path):
    page, server = KeyStore(tmp_path / "keys.json"), KeyStore(tmp_path / "keys.json")
    first, key = page.create("a")
    _, other = page.create("b")
    assert server.verify(key).id == first.id and server.verify(other) is not None
    assert server.verify("ft-not-a-key") is None and server.verify("") is None
    assert page.list()[0].last_used is not None   # the server noted the use in the file
    assert page.revoke(first.id) and not page.revoke(first.id)
    assert server.verify(key) is None and server.verify(other) is not None


def test_the_gate_opens_only_while_no_key_was_ever_there(tmp_path):
    store = KeyStore(tmp_path / "keys.json")
    gate = Gate(None, store)
    assert gate.allows("")
    entry, key = store.create("a")
    assert not gate.allows("") and gate.allows(key)
    store.revoke(entry.id)
    assert not gate.allows("") and not gate.allows(key)   # revoking the last key does not open it
    flag = Gate("sk-flag", store)
    assert flag.allows("sk-flag") and not flag.allows("sk-other")
