"""Dial until libzmq has dropped a refused connection's pipe (tests of "refused before the hello").

A plain DEALER dialling a CURVE server fails its handshake at once.  libzmq then drops the
DEALER's only pipe (nothing can be queued: POLLOUT off) within ~2-40 ms on about 70% of
connections; on the others, after the same monitor events, it keeps the pipe for good (6 of 20
kept it 20 s, at load 40).  So: new connections until one drops it, each watched longer than
the last, within one generous deadline.  Fixed windows made two flaky tests: a 2 s window
missed twice in a row ate a 4 s connect wait (CI, stop 23).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import zmq

from tests.polling import WAIT, wait_until

T = TypeVar("T")

#: The whole search's deadline; a client dialling through it needs a longer connect timeout.
DEADLINE = 3 * WAIT


def no_pipe(sock: zmq.Socket[Any]) -> bool:
    """A DEALER with no pipe left: nothing can be queued (POLLOUT is off)."""
    return not sock.poll(0, zmq.POLLOUT)


def dial_until_dropped(
    dial: Callable[[], T], plain: Callable[[T], zmq.Socket[Any]], close: Callable[[T], None]
) -> T:
    """``dial()`` again until ``plain(dialled)`` has no pipe left; ``close`` the others."""
    deadline = time.monotonic() + DEADLINE
    watch = 0.25
    while time.monotonic() < deadline:
        dialled = dial()
        if wait_until(lambda: no_pipe(plain(dialled)), watch, step=0.002):  # noqa: B023
            return dialled
        close(dialled)
        watch = min(2 * watch, 4.0)
    raise AssertionError("the failed handshake never dropped the pipe")
