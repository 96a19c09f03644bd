"""Browsing subscriptions (``browser:true``) on the engine: a browse reads its queue a page
at a time (``broker.engine.queue.reading``: nothing is consumed); the listener asks for the
next page once the connection took the last one.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def read_page(engine: Engine, conn: int, sub_id: str, channel: str, from_seq: int) -> BrowsePage:
    """The next :data:`BROWSE_PAGE` messages ``channel``'s queue holds from sequence
    ``from_seq`` on, for subscription ``sub_id`` of ``conn``; fewer than a page: the end."""
    found = engine.channels.get(channel)
    queue = found.queues.get(QUEUE_ID) if found is not None else None
    entries = reading.browse(queue, from_seq, BROWSE_PAGE) if queue is not None else []
    return BrowsePage(conn, sub_id, entries, len(entries) < BROWSE_PAGE)
