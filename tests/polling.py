"""Bounded waits for tests: poll a condition until a generous deadline (no sleeps as sync)."""

from __future__ import annotations

import time
from collections.abc import Callable

#: Generous default deadline (seconds): a loaded 2-core machine must still make it.
WAIT = 10.0


def wait_until(check: Callable[[], bool], timeout: float = WAIT, step: float = 0.01) -> bool:
    """True as soon as ``check()`` is; False if it is still false at the deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(step)
    return check()
