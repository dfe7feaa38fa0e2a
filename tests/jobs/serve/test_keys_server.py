"""The shared `python -m jobs.serve` (tests/jobs/serve/conftest.py) with a key from its store, through
the `openai` client: 401 with a wrong key, 200 with the store's, 401 once it is revoked in the store,
without a restart; the operator's --api-key keeps working beside the store's keys."""
import openai
import pytest

from jobs.serve.keys import KeyStore


def test_a_store_key_works_until_revoked_without_a_restart(server, keys_file, client):
    store = KeyStore(keys_file)
    entry, key = store.create("test client")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server, api_key="ft-wrong", max_retries=0).models.list()
    by_store = openai.OpenAI(base_url=server, api_key=key, max_retries=0, timeout=60)
    assert "llama-job" in [m.id for m in by_store.models.list()]
    assert [k.last_used is not None for k in store.list()] == [True]
    store.revoke(entry.id)
    with pytest.raises(openai.AuthenticationError):
        by_store.models.list()
    assert "llama-job" in [m.id for m in client.models.list()]   # --api-key's
