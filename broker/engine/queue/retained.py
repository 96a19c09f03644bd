"""Consumed messages a ``Retain`` queue keeps readable by sequence number (``reading``).

Owned by :class:`broker.engine.queue.queue.Queue` (``Queue.retained``); the ledger keeps
a message here when it is consumed, a release or the ``RetainLimit`` forgets it.
"""

from __future__ import annotations

from broker.engine.message import Message
from broker.engine.options import DEFAULT_RETAIN_LIMIT


class Retained:
    """Consumed messages of a ``Retain`` queue, by sequence number (oldest first)."""

    __slots__ = ("floor", "messages")

    def __init__(self) -> None:
        #: sequence number -> message, in the order they were consumed
        self.messages: dict[int, Message] = {}
        #: the highest number released: a message at or below it consumed later (it was
        #: in flight during the release) is not kept, so bounds never go back
        self.floor = 0

    def __len__(self) -> int:
        return len(self.messages)

    def keep(self, seq: int, message: Message, limit: int) -> list[int]:
        """Keep a consumed message; the sequence numbers pushed out past ``limit``."""
        if seq <= self.floor:
            return [seq]
        messages = self.messages
        messages[seq] = message
        limit = limit or DEFAULT_RETAIN_LIMIT
        gone: list[int] = []
        while len(messages) > limit:
            old = next(iter(messages))
            del messages[old]
            gone.append(old)
        return gone

    def release(self, through: int, last: int) -> list[int]:
        """Forget every message numbered ``through`` or less (``last``: the newest number
        the queue gave, above which nothing is passed); their numbers."""
        self.floor = max(self.floor, min(through, last))
        gone = [seq for seq in self.messages if seq <= through]
        for seq in gone:
            del self.messages[seq]
        return gone

    def clear(self) -> None:
        self.messages.clear()

    def restore(self, seq: int, message: Message) -> None:
        """A retained message recovered from the store (oldest first)."""
        self.messages[seq] = message
