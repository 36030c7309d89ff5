"""Waits with a bound: a test of a would-be hang must fail, not hang itself."""

from __future__ import annotations

import threading


def run_bounded(fn, timeout: float, release=None):
    """fn() in a daemon thread joined with `timeout`: (returned, raised). `release()` runs after the wait
    either way (e.g. to free a thread blocked opening a FIFO); then AssertionError if fn was still blocked."""
    out = {}

    def target():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    hung = thread.is_alive()
    if release is not None:
        release()
    assert not hung, f"still blocked after {timeout} s: a hang"
    return out.get("value"), out.get("error")
