"""Browsing subscriptions (``browser:true``) on the engine: a browse reads its queue a page
at a time (``broker.engine.queue.reading``: nothing is consumed); the listener asks for the
next page once the connection took the last one.  A browser with ``browser-end:false``
that reached the end follows its queue: the engine thread keeps it as a
:class:`Follower` and reads the next page once the queue numbered a message past it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.engine.engine import Engine
from broker.engine.queue import reading
from broker.message import Message
from broker.stomp.engine_mapping import QUEUE_ID

#: Messages one browse step reads from a queue (the next step starts once they are taken).
BROWSE_PAGE = 500


@dataclass(frozen=True, slots=True)
class BrowsePage:
    """Messages a browse read, for one subscription (``done``: nothing after them)."""

    conn: int
    sub_id: str
    entries: list[tuple[int, Message]]
    done: bool
    #: The queue's last sequence when the page was read (a page that is ``done`` saw
    #: every message numbered up to it that the queue still held).
    high: int = 0


def read_page(engine: Engine, conn: int, sub_id: str, channel: str, from_seq: int) -> BrowsePage:
    """The next :data:`BROWSE_PAGE` messages ``channel``'s queue holds from sequence
    ``from_seq`` on, for subscription ``sub_id`` of ``conn``; fewer than a page: the end."""
    found = engine.channels.get(channel)
    queue = found.queues.get(QUEUE_ID) if found is not None else None
    entries = reading.browse(queue, from_seq, BROWSE_PAGE) if queue is not None else []
    high = queue.sequence if queue is not None else 0
    return BrowsePage(conn, sub_id, entries, len(entries) < BROWSE_PAGE, high)


def queue_sequence(engine: Engine, channel: str) -> int:
    """The last sequence ``channel``'s queue gave a message (0: no such queue)."""
    found = engine.channels.get(channel)
    queue = found.queues.get(QUEUE_ID) if found is not None else None
    return queue.sequence if queue is not None else 0


@dataclass(slots=True)
class Followers:
    """Browsers at the end of their queue, waiting for the next message (engine thread):
    channel -> {(connection, subscription id): the first sequence not browsed yet}.  One
    entry per browsing subscription at most (a connection holds at most its
    ``max_subscriptions``); gone with its subscription or connection."""

    waiting: dict[str, dict[tuple[int, str], int]] = field(default_factory=dict)

    def add(self, channel: str, conn: int, sub_id: str, start: int) -> None:
        self.waiting.setdefault(channel, {})[(conn, sub_id)] = start

    def drop(self, conn: int, sub_id: str | None = None) -> None:
        """Forget subscription ``sub_id`` of ``conn`` (None: all of the connection's)."""
        for channel in list(self.waiting):
            keys = self.waiting[channel]
            for key in [k for k in keys if k[0] == conn and sub_id in (None, k[1])]:
                del keys[key]
            if not keys:
                del self.waiting[channel]

    def due(self, engine: Engine) -> list[tuple[str, int, str, int]]:
        """(channel, connection, subscription id, start) of the browsers whose queue has
        numbered a message at or past their start, taken off the waiting list."""
        ready: list[tuple[str, int, str, int]] = []
        for channel in list(self.waiting):
            last = queue_sequence(engine, channel)
            keys = self.waiting[channel]
            for key in [k for k, start in keys.items() if start <= last]:
                ready.append((channel, key[0], key[1], keys.pop(key)))
            if not keys:
                del self.waiting[channel]
        return ready
