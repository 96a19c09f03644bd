"""Receipts (SMQP ``RECEIPT``): the producer hears whether its message reached consumers.

A push carrying header ``Receipt: ONE`` or ``Receipt: ALL`` (case-insensitive; ``NONE``,
the default, asks for nothing; the draft's older ``yes``/``no`` mean ONE/NONE) makes
the broker send that producer one receipt, within the receipt's timeout:

* ``ONE`` -- as soon as one consumer received the message: it acknowledged it (a queue
  that requests acknowledges) or its transport took it (a queue without);
* ``ALL`` -- once every consumer the message was sent to received it and the message
  left the queue (a broadcast copy to each consumer online, or one consumer in
  round-robin: "all subscribers" are the ones the broker tried to deliver to);
* otherwise, at the timeout -- or earlier, when the message left its queue without
  reaching them (dropped, expired, trashed, its queue removed) -- a receipt that says how
  far it got, ``X/Y``: X consumers received it of the Y it was sent to (``0/0``: no
  consumer got a copy).

The timeout is the push's ``Receipt-Timeout`` header (milliseconds, 1..86,400,000), else
its queue's ``MessageTimeout``, else :data:`DEFAULT_TIMEOUT_MS` (60 s).

The receipt is a direct message (type 0x12) to the producer's client id, content type
:data:`broker.protocol.RECEIPT_CONTENT_TYPE` (233), source ``@receipts``, with headers
``Receipt-For`` (the message id), ``Receipt`` (ONE or ALL), ``Delivered`` (``X/Y``),
``Receipt-Status`` (``complete`` or ``incomplete``), ``Channel`` and ``Queue-Id``.  A
producer that disconnected gets none (its pending receipts are forgotten); pending
receipts live in memory (a restart forgets them, as it ends every session).

Limits: at most ``limits.max_pending_receipts`` (100,000) per broker; a push asking for
one more is refused (482) before the queue takes it; a bad ``Receipt`` or
``Receipt-Timeout`` header is refused (400).

Sans-IO: the queues report sends, successes and finished messages (``sent``,
``succeeded``, ``finished``; some of them where no output list is at hand, so receipts
wait in :attr:`Receipts.outbox`), the engine calls :meth:`Receipts.tick` with ``now``
and moves the outbox into the output of every call it serves.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

from broker.engine.errors import OperationError
from broker.engine.frames import control
from broker.protocol import RECEIPT_CONTENT_TYPE, Header, MessageType, Outgoing, ResultCode

#: Receipt timeout when neither the push nor its queue gives one (milliseconds).
DEFAULT_TIMEOUT_MS = 60_000
#: Longest ``Receipt-Timeout`` accepted (milliseconds: one day).
MAX_TIMEOUT_MS = 86_400_000
#: The source of a receipt message.
SOURCE = "@receipts"
RECEIPT = "Receipt"
RECEIPT_TIMEOUT = "Receipt-Timeout"
RECEIPT_FOR = "Receipt-For"
DELIVERED = "Delivered"
STATUS = "Receipt-Status"
_MODES = {"none": "", "no": "", "one": "ONE", "yes": "ONE", "all": "ALL"}
_LOW_RECEIPT = RECEIPT.lower()
_LOW_TIMEOUT = RECEIPT_TIMEOUT.lower()

#: (channel, queue id), sequence number
Key = tuple[tuple[str, int], int]


def requested(headers: tuple[tuple[str, str], ...]) -> tuple[str, int | None]:
    """The receipt a push asks for: ``""`` (none), ``"ONE"`` or ``"ALL"``, and its
    ``Receipt-Timeout`` in ms (None: not given); OperationError (400) if malformed."""
    mode, timeout = "", None
    for name, value in headers:
        low = name.lower()
        if low == _LOW_RECEIPT:
            found = _MODES.get(value.strip().lower())
            if found is None:
                raise OperationError(ResultCode.BAD_REQUEST, f"bad Receipt {value[:40]!r}")
            mode = found
        elif low == _LOW_TIMEOUT:
            raw = value.strip()
            if not raw.isdigit() or len(raw) > 9 or not 1 <= int(raw) <= MAX_TIMEOUT_MS:
                raise OperationError(ResultCode.BAD_REQUEST, f"bad Receipt-Timeout {value[:40]!r}")
            timeout = int(raw)
    return mode, timeout


@dataclass(slots=True)
class Pending:
    producer: str
    message_id: str
    channel: str
    queue_id: int
    mode: str
    deadline: float
    #: consumers a copy was sent to, and those that received it
    targets: set[str] = field(default_factory=set)
    done: set[str] = field(default_factory=set)


class Receipts:
    """Receipts waiting for their message's fate (see the module docstring)."""

    def __init__(self, new_id: Callable[[], str], limit: int) -> None:
        self.new_id = new_id
        self.limit = limit
        #: Receipts made and not yet handed to the engine's output.
        self.outbox: list[Outgoing] = []
        self.pending: dict[Key, Pending] = {}
        self._by_producer: dict[str, set[Key]] = {}
        self._deadlines: list[tuple[float, Key]] = []

    def __len__(self) -> int:
        return len(self.pending)

    def check_room(self) -> None:
        if len(self.pending) >= self.limit:
            raise OperationError(ResultCode.LIMIT_EXCEEDED, "too many pending receipts")

    def watch(
        self,
        queue: tuple[str, int],
        seq: int,
        message_id: str,
        producer: str,
        mode: str,
        now: float,
        timeout_ms: int,
    ) -> None:
        key = (queue, seq)
        deadline = now + timeout_ms / 1000.0
        self.pending[key] = Pending(producer, message_id, queue[0], queue[1], mode, deadline)
        self._by_producer.setdefault(producer, set()).add(key)
        heapq.heappush(self._deadlines, (deadline, key))

    # -- what the queues report ---------------------------------------------------------

    def sent(self, queue: tuple[str, int], seq: int, client_id: str) -> None:
        """A copy went out to ``client_id`` (its transport took it)."""
        p = self.pending.get((queue, seq))
        if p is not None:
            p.targets.add(client_id)

    def succeeded(self, queue: tuple[str, int], seq: int, client_id: str) -> None:
        """``client_id`` received it (acknowledged, or taken on a queue without acks)."""
        key = (queue, seq)
        p = self.pending.get(key)
        if p is None:
            return
        p.targets.add(client_id)
        p.done.add(client_id)
        if p.mode == "ONE":
            self._send(key, p, True)

    def finished(self, queue: tuple[str, int], seq: int) -> None:
        """The message left its queue (consumed, dropped, expired...): nothing more can
        reach anyone, so its receipt goes now."""
        key = (queue, seq)
        p = self.pending.get(key)
        if p is not None:
            complete = bool(p.done) and p.done >= p.targets
            self._send(key, p, complete and p.mode == "ALL")

    def forget_producer(self, producer: str) -> None:
        """The producer is gone: nobody to tell."""
        for key in self._by_producer.pop(producer, ()):
            self.pending.pop(key, None)

    # -- time -------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Receipts whose timeout passed go out as ``X/Y``."""
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            deadline, key = heapq.heappop(deadlines)
            p = self.pending.get(key)
            if p is not None and p.deadline == deadline:
                self._send(key, p, False)

    def next_deadline(self) -> float | None:
        deadlines = self._deadlines
        while deadlines and deadlines[0][1] not in self.pending:
            heapq.heappop(deadlines)  # answered already
        return deadlines[0][0] if deadlines else None

    def take(self, out: list[Outgoing]) -> None:
        """Move the receipts made so far into ``out``."""
        if self.outbox:
            out.extend(self.outbox)
            self.outbox.clear()

    def _send(self, key: Key, p: Pending, complete: bool) -> None:
        del self.pending[key]
        keys = self._by_producer.get(p.producer)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_producer[p.producer]
        headers = (
            (RECEIPT_FOR, p.message_id),
            (RECEIPT, p.mode),
            (DELIVERED, f"{len(p.done)}/{len(p.targets)}"),
            (STATUS, "complete" if complete else "incomplete"),
            (Header.CHANNEL_NAME, p.channel),
            (Header.QUEUE_ID, str(p.queue_id)),
        )
        frame = control(
            MessageType.DIRECT,
            RECEIPT_CONTENT_TYPE,
            self.new_id(),
            SOURCE,
            p.producer,
            headers,
        )
        self.outbox.append(Outgoing(p.producer, frame))
