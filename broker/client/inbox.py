"""The blocking client's inbox: received messages waiting for ``receive``/``consume``.

Queue messages, direct messages and events without a callback are appended by the I/O
loop and taken by callers (any thread).  A full inbox (``limit`` messages) makes the I/O
loop stop reading (ZeroMQ pushes back on the broker) until it drains to half.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sized

from broker.client.errors import ClientError
from broker.client.message import Message


class Inbox:
    """A bounded queue of received messages with a condition for waiting readers."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.items: deque[Message] = deque()
        self.cv = threading.Condition()
        self.waiting = 0  # readers inside wait()

    def put(self, message: Message) -> None:
        self.items.append(message)
        if self.waiting:
            with self.cv:
                self.cv.notify()

    def wake_all(self) -> None:
        with self.cv:
            self.cv.notify_all()

    @property
    def full(self) -> bool:
        return len(self.items) >= self.limit

    @property
    def drained(self) -> bool:
        """Down to half: reading may resume."""
        return len(self.items) <= self.limit // 2

    def wait(
        self,
        deadline: float | None,
        closed: Callable[[], ClientError | None],
        items: Sized | None = None,
    ) -> bool:
        """Wait until a message is in (True) or the deadline passed (False).

        ``closed()`` gives the error to raise once the client is closed (else None);
        ``items``: another collection the I/O loop fills (the fan-out's raw batches).
        """
        if items is None:
            items = self.items
        with self.cv:
            self.waiting += 1
            try:
                while not items:
                    err = closed()
                    if err is not None:
                        raise err
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    self.cv.wait(left if left is not None else 1.0)
            finally:
                self.waiting -= 1
        return True
