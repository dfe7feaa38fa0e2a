"""Waiting in tests for what a subprocess or a thread does: a predicate polled until it holds."""
import time


def wait_for(predicate, timeout=240, interval=0.5):
    """The predicate's first truthy value, polled every `interval` s; an AssertionError after `timeout` s."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError("timed out waiting")
