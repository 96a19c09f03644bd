"""The messages waiting in a queue, in the order they are consumed.

Messages wait in two deques (high priority first).  Removal from the middle (message
timeout, a message finished while it waited) is lazy: the message's state is no longer
QUEUED and it is skipped when reached, while the counts stay exact.  Messages put back
"at the start" wait in a short list until the next pass takes them, so that several put
back one after another keep their order.

:class:`MessageOrder` knows nothing of consumers, acknowledges or the store: it is the
queue's ordering part, owned by :class:`broker.engine.queue.queue.Queue`.
"""

from __future__ import annotations

from collections import deque

from broker.engine.delivery import PutBack
from broker.engine.message import QUEUED, QueueMessage


class MessageOrder:
    """The waiting messages of one queue (see the module docstring)."""

    __slots__ = ("front", "n_priority", "n_regular", "priority", "regular")

    def __init__(self) -> None:
        self.priority: deque[QueueMessage] = deque()
        self.regular: deque[QueueMessage] = deque()
        #: Messages waiting, per priority (the deques may also hold finished ones).
        self.n_priority = 0
        self.n_regular = 0
        #: Put back at the start, not yet in a deque (oldest first).
        self.front: list[QueueMessage] = []

    @property
    def count(self) -> int:
        return self.n_priority + self.n_regular

    def waiting(self) -> bool:
        """Messages wait (a new one would queue behind them)."""
        return bool(self.n_priority or self.n_regular or self.front)

    def enqueue(self, m: QueueMessage) -> None:
        """Append a new message to the end of its deque."""
        if m.high_priority:
            self.priority.append(m)
            self.n_priority += 1
        else:
            self.regular.append(m)
            self.n_regular += 1

    def uncount(self, m: QueueMessage) -> None:
        """``m`` left the queue from the middle (it stays in its deque, not QUEUED)."""
        if m.high_priority:
            self.n_priority -= 1
        else:
            self.n_regular -= 1

    def next_first(self) -> QueueMessage | None:
        """Take the oldest waiting message (high priority first)."""
        dq = self.priority
        while dq:
            m = dq.popleft()
            if m.state == QUEUED:
                self.n_priority -= 1
                return m
        dq = self.regular
        while dq:
            m = dq.popleft()
            if m.state == QUEUED:
                self.n_regular -= 1
                return m
        return None

    def next_last(self) -> QueueMessage | None:
        """Take the newest waiting message (high priority first)."""
        for dq, high in ((self.priority, True), (self.regular, False)):
            while dq:
                m = dq.pop()
                if m.state == QUEUED:
                    if high:
                        self.n_priority -= 1
                    else:
                        self.n_regular -= 1
                    return m
        return None

    def latest(self) -> QueueMessage | None:
        """The newest waiting message, left where it is (high priority first)."""
        self.flush_front()
        for dq in (self.priority, self.regular):
            for m in reversed(dq):
                if m.state == QUEUED:
                    return m
        return None

    def unpop(self, m: QueueMessage, last: bool = False) -> None:
        """Undo :meth:`next_first` (or, with ``last``, :meth:`next_last`)."""
        m.state = QUEUED
        dq = self.priority if m.high_priority else self.regular
        if last:
            dq.append(m)
        else:
            dq.appendleft(m)
        if m.high_priority:
            self.n_priority += 1
        else:
            self.n_regular += 1

    def flush_front(self) -> None:
        """Move the messages put back at the start into their deques."""
        front = self.front
        if not front:
            return
        self.front = []
        for m in reversed(front):
            (self.priority if m.high_priority else self.regular).appendleft(m)

    def requeue(self, m: QueueMessage, where: PutBack) -> None:
        """A message returns: at the start (before every waiting one) or the end."""
        m.state = QUEUED
        m.out = None  # the next send may carry a Delivery-Count
        if m.high_priority:
            self.n_priority += 1
        else:
            self.n_regular += 1
        if where is PutBack.START:
            self.front.append(m)
        else:
            (self.priority if m.high_priority else self.regular).append(m)

    def take(self, *, priority: bool, regular: bool) -> list[QueueMessage]:
        """Empty the chosen deques; returns their waiting messages (still QUEUED)."""
        self.flush_front()
        taken: list[QueueMessage] = []
        if priority:
            taken.extend(m for m in self.priority if m.state == QUEUED)
            self.priority.clear()
            self.n_priority = 0
        if regular:
            taken.extend(m for m in self.regular if m.state == QUEUED)
            self.regular.clear()
            self.n_regular = 0
        return taken
