"""Run one coroutine to its end from a plain test, whatever loop the session already runs.

Playwright's sync API (the browser fixtures in tests/e2e live for the whole session) leaves an
event loop running in the main thread, and asyncio.run() refuses to start under a running loop;
a thread of its own gives the coroutine a fresh loop wherever the test sits in the run order."""
import asyncio
import threading


def run_coroutine(make):
    """Await make() on a fresh loop in a helper thread; return its result or raise its error."""
    outcome = {}

    def work():
        try:
            outcome["value"] = asyncio.run(make())
        except BaseException as error:  # re-raised in the test's own thread below
            outcome["error"] = error

    thread = threading.Thread(target=work, name="asgi-call")
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
