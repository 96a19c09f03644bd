"""A queue's trash (SMQP): messages that left the queue without being consumed.

What lands here: a message whose ``MessageTimeout`` passed (reason ``expired``), one put
back more often than ``PutBackLimit`` allows (``put-back-limit``), and a delivery that
ended without success and without a put-back -- a nack or a failed delivery its handler
did not put back (the nack reason: ``none``, ``timeout``, ``send-error``...).  Messages
cleared or removed with their queue do not.

The trash keeps, by the message's sequence number, the message, the reason and when it
came; it is emptied by its retention policy -- the latest ``TrashLimit`` messages
(default 1,000; 0: no trash) for ``TrashRetention`` milliseconds each (default
86,400,000: one day; 0: no time bound) -- or by a purge.  It is listed like a browse
(``broker.sequence``; each message with a ``Trash-Reason`` header) and a resubmit pushes
messages back into their queue as new messages (new sequence numbers).

On disk: a queue's saved (persistent) messages that go to the trash are kept in the
store too (``Store.trash``, written before their live record is removed), and every
entry that leaves the trash -- resubmitted, purged, past the retention policy -- is
reported to ``forget`` (``Store.forget_trashed``), so a restart brings the trash back
(``Engine.recover``) with each entry's age counted in wall-clock time.  What an
in-memory queue trashes lives in memory only.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from broker.engine.message import Message
from broker.protocol import Header

DEFAULT_TRASH_LIMIT = 1_000
DEFAULT_TRASH_RETENTION = 86_400_000
#: The header a listed trash message carries its reason in.
TRASH_REASON = Header.TRASH_REASON


@dataclass(frozen=True, slots=True)
class Trashed:
    message: Message
    reason: str
    at: float


class Trash:
    """One queue's trash, oldest first (see the module docstring)."""

    __slots__ = ("entries", "forget")

    def __init__(self, forget: Callable[[int], None] = lambda seq: None) -> None:
        self.entries: OrderedDict[int, Trashed] = OrderedDict()
        #: Told the sequence number of every entry that leaves (not by ``clear``).
        self.forget = forget

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, seq: int, item: Trashed, limit: int, retention_ms: int) -> None:
        if not limit:
            return
        entries = self.entries
        entries[seq] = item
        self.prune(item.at, retention_ms)
        while len(entries) > limit:
            self.forget(entries.popitem(last=False)[0])

    def prune(self, now: float, retention_ms: int) -> None:
        """Forget what passed its retention time."""
        if not retention_ms:
            return
        cutoff = now - retention_ms / 1000.0
        entries = self.entries
        while entries and next(iter(entries.values())).at <= cutoff:
            self.forget(entries.popitem(last=False)[0])

    def listing(self, from_seq: int, limit: int) -> list[tuple[int, Message]]:
        """Up to ``limit`` messages numbered ``from_seq`` or more, in sequence order, each
        with its ``Trash-Reason`` header."""
        wanted = sorted(seq for seq in self.entries if seq >= from_seq)[:limit]
        out = []
        for seq in wanted:
            item = self.entries[seq]
            m = item.message
            headers = (*((k, v) for k, v in m.headers if k.lower() != "trash-reason"),
                       (TRASH_REASON, item.reason))  # fmt: skip
            out.append((seq, m.replace(headers=headers)))
        return out

    def take(self, sequences: set[int] | None) -> list[tuple[int, Trashed]]:
        """Remove and return the chosen entries (None: all), oldest first."""
        return [(s, self.pop(s)) for s in self.chosen(sequences)]

    def chosen(self, sequences: set[int] | None) -> list[int]:
        """The sequence numbers held of ``sequences`` (None: all), oldest first."""
        return [s for s in self.entries if sequences is None or s in sequences]

    def peek(self, seq: int) -> Trashed:
        return self.entries[seq]

    def pop(self, seq: int) -> Trashed:
        """Remove one entry (it leaves: ``forget`` is told)."""
        item = self.entries.pop(seq)
        self.forget(seq)
        return item

    def clear(self) -> None:
        self.entries.clear()
