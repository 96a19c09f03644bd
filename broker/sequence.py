"""Reading a queue by sequence number: the values both sides share, and the browse payload.

Every queue message has a per-queue sequence number (from 1, one more per message the
queue accepts, never reused; a persistent queue keeps counting across restarts).  A
client may ask a queue for its :class:`SequenceBounds`, *browse* the messages it holds
from a sequence number on without consuming them (:class:`Browsed`), and *release* the
messages up to a sequence number (they count as consumed).

The browse answer (a RESPONSE to server operation ``Operation.QUEUE_BROWSE``) is binary,
as a message payload may be any octets; little-endian, one entry per message::

    sequence u64 | frame length u32 | the message as a TMQP QUEUE frame (frame length octets)

Pure: no I/O.  The engine encodes (:func:`encode_browse`); the clients decode
(:func:`decode_browse`, which raises :class:`BrowseFormatError` and nothing else).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass

from broker import tmqp
from broker.message import Message

_ENTRY = struct.Struct("<QI")
#: One entry's header (sequence, frame length), for a reader that decodes the payload its
#: own way (``broker.spark.rows.page_batch``).
ENTRY = _ENTRY

#: ``from_seq`` meaning "the oldest message the queue still holds".
FROM_FIRST = 0
#: ``from_seq`` meaning "only messages after the newest one now".
FROM_LAST = -1
#: Messages a browse returns unless told otherwise (and at most, whatever it asks).
DEFAULT_BROWSE_LIMIT = 1000
MAX_BROWSE_LIMIT = 10_000


@dataclass(frozen=True, slots=True)
class SequenceBounds:
    """A queue's oldest held sequence number and the newest ever given.

    ``first`` is ``last + 1`` when the queue holds nothing; ``last`` is 0 before the
    first message."""

    first: int
    last: int

    @property
    def empty(self) -> bool:
        return self.first > self.last


@dataclass(frozen=True, slots=True)
class Browsed:
    """One message read by sequence number (it stays in its queue)."""

    sequence: int
    message: Message


class BrowseFormatError(ValueError):
    """A browse answer that is not a list of entries (see the module docstring)."""


def encode_browse(entries: Iterable[tuple[int, bytes]], budget: int | None = None) -> bytes:
    """The payload for ``(sequence, encoded QUEUE frame)`` pairs; ``budget``: stop before
    the entry that would take the payload past that many octets (never below one entry;
    ``entries`` is read no further, so it may encode lazily)."""
    pack, head = _ENTRY.pack, _ENTRY.size
    out: list[bytes] = []
    used = 0
    for seq, frame in entries:
        size = len(frame)
        if budget is not None:
            used += head + size
            if out and used > budget:
                break
        out.append(pack(seq, size))
        out.append(frame)
    return b"".join(out)


def _message(frame: tmqp.Frame) -> Message:
    return Message(
        message_id=frame.message_id,
        source=frame.source,
        target=frame.target,
        content_type=frame.content_type,
        high_priority=frame.high_priority,
        first_acquirer=frame.first_acquirer,
        wants_ack=frame.pending_ack,
        ttl=frame.ttl,
        headers=frame.headers,
        payload=frame.payload,
    )


def decode_browse(payload: bytes) -> list[Browsed]:
    """The messages of a browse answer, in its order."""
    out: list[Browsed] = []
    view = memoryview(payload)
    pos, end = 0, len(payload)
    last = 0
    while pos < end:
        if end - pos < _ENTRY.size:
            raise BrowseFormatError(f"browse answer ends inside an entry header at {pos}")
        seq, size = _ENTRY.unpack_from(view, pos)
        pos += _ENTRY.size
        if size > end - pos:
            raise BrowseFormatError(f"browse entry {seq} claims {size} octets, {end - pos} left")
        if seq <= last:
            raise BrowseFormatError(f"browse entries out of order ({seq} after {last})")
        last = seq
        try:
            frame = tmqp.decode([bytes(view[pos : pos + size])])
        except tmqp.DecodeError as exc:
            raise BrowseFormatError(f"browse entry {seq} is not a TMQP frame: {exc}") from None
        if not isinstance(frame, tmqp.Frame):
            raise BrowseFormatError(f"browse entry {seq} is not a message frame")
        pos += size
        out.append(Browsed(seq, _message(frame)))
    return out
