"""Engine output held until the store writes it depends on are durable.

A producer's acknowledge must not leave before its message is on disk.  The engine is
sans-IO: it saves through its ``Store`` and emits the acknowledge in the same output.
The gate sits between the engine and the send path: after each engine call it compares
the store's ``appended`` ticket (the newest write a reply may depend on) with its
``completed`` ticket; if that write is not complete yet, the call's whole output is held,
tagged with the ticket, and so is every later output (one FIFO: nothing overtakes what is
held, so each client keeps its order).  The server polls the store's ``fileno`` and,
when it is readable, calls :meth:`OutputGate.release` with what completed: held outputs
leave in ticket order.  Deliveries to consumers are held too: a message reaches
consumers only once it is durable (what SMQP asks), and its producer's acknowledge
never precedes its save.  With the log's group commit, everything pushed while one
fsync runs shares the next one.

A drain.  Between :meth:`OutputGate.begin` and :meth:`OutputGate.end` (the server's drain
of its socket) the store holds its appends (``Store.hold``): the saves of the drain's
pushes -- single pushes of several producers as much as a batch's -- go to the log as
one group per queue at :meth:`end`, one write and one durability wait.  An output
admitted while the store holds appends it has not given to the log (``unwritten``) cannot
know its ticket yet: it waits, with every output admitted after it, and :meth:`end`
tags them all with the ticket of the writes the release made.  An output admitted
while nothing is held back goes as before (a drain of plain pushes is not delayed).

A failed store (a full disk: the log's writer stopped, ``failed``).  The tickets held
outputs wait for will never complete.  They leave at once, in order, each positive
acknowledge in them turned negative (``failed``, "not saved: the store failed"): a
producer hears a refusal, never a positive acknowledge for a message the disk may not
hold, and never silence.  Everything else in them (deliveries of the messages, which
stay queued in memory, replies) leaves as it was; a held call (a STOMP receipt or
delivery waiting for its save) is never run: it would confirm a save that did not happen.
Its failure path runs instead (``call(fn, failed)``: the STOMP door's answers become
ERRORs "not saved: the store failed" naming their receipts, its deliveries go as TMQP
ones do); a call without one is dropped (until session 16 every held call was: the STOMP
client heard nothing for its receipt).  From then on the gate holds
nothing: the store refuses every new save at once (the engine answers it ``failed``),
so no output depends on a write any more, and the broker serves on.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from broker.engine.frames import ack
from broker.protocol import Header, MessageType, NackReason, Outgoing
from broker.store.base import NOT_SAVED
from broker.tmqp import Frame

log = logging.getLogger(__name__)

_ACK = int(MessageType.ACK)
_NACK = Header.NACK_REASON.lower()
#: A held call: what runs once durable, what runs instead if the store fails (see call).
_Call = tuple[Callable[[], None], Callable[[], None] | None]


class DurableLike(Protocol):
    """What the gate reads of a durable store (``broker.store.durable.DurableStore``)."""

    @property
    def appended(self) -> int: ...

    @property
    def completed(self) -> int: ...

    def fileno(self) -> int: ...

    def drain(self) -> int: ...

    def flush(self) -> None: ...

    @property
    def unwritten(self) -> int: ...

    def hold(self) -> None: ...

    def release(self) -> None: ...

    @property
    def failed(self) -> bool:
        """The store's writer stopped: no ticket beyond ``completed`` ever completes."""
        ...


class OutputGate:
    """Holds engine output until the store's tickets it depends on complete."""

    def __init__(self, store: DurableLike, send: Callable[[list[Any]], None]) -> None:
        self.store = store
        self._send = send
        self._held: deque[tuple[int, list[Any] | _Call]] = deque()
        #: outputs of the open drain waiting for their ticket (see "A drain")
        self._untagged: list[list[Any] | _Call] = []
        self._draining = False
        #: outputs held so far (a counter for statistics)
        self.holds = 0
        #: the store failed: nothing is held any more (see "A failed store")
        self.failed = False

    @property
    def held(self) -> int:
        """Outputs waiting for the store."""
        return len(self._held) + len(self._untagged)

    def begin(self) -> None:
        """A drain starts: the store holds its appends until :meth:`end`."""
        self.store.hold()
        self._draining = True

    def end(self) -> None:
        """The drain ended: the store writes what it held, and the outputs that waited
        for it are held until that write is durable (sent now if it already is)."""
        self._draining = False
        store = self.store
        store.release()
        if self.failed:
            return  # (nothing waits: ``admit`` sent it)
        if store.failed:
            self._fail()
            return
        untagged = self._untagged
        if untagged:
            self._untagged = []
            ticket = store.appended
            held = self._held
            for item in untagged:
                held.append((ticket, item))
            self.holds += len(untagged)
            self._send_upto(store.completed)

    def _waits(self) -> bool:
        """Must an output admitted now wait for the drain's end (see "A drain")?"""
        return bool(self._untagged) or self.store.unwritten > 0

    def fileno(self) -> int:
        return self.store.fileno()

    def admit(self, outs: list[Any]) -> None:
        """Send ``outs`` now if nothing it depends on is pending, else hold it."""
        if self.failed:
            self._send(outs)
            return
        if self._draining and self._waits():
            if outs:
                self._untagged.append(outs)
            return
        store = self.store
        ticket = store.appended
        done = store.completed
        if self._held:
            self._send_upto(done)
        if not self._held and ticket <= done:
            self._send(outs)
        elif outs:
            self._held.append((ticket, outs))
            self.holds += 1

    def call(self, fn: Callable[[], None], failed: Callable[[], None] | None = None) -> None:
        """Run ``fn`` once everything admitted so far has left and the store's newest
        write is durable (now if nothing is pending): how another door (STOMP) sends a
        receipt or a delivery only once the message it concerns is on disk.  If the store
        fails first, ``failed`` runs instead, in ``fn``'s turn (none: nothing runs; see
        "A failed store")."""
        if self.failed:
            fn()
            return
        if self._draining and self._waits():
            self._untagged.append((fn, failed))
            return
        store = self.store
        ticket = store.appended
        done = store.completed
        if self._held:
            self._send_upto(done)
        if not self._held and ticket <= done:
            fn()
        else:
            self._held.append((ticket, (fn, failed)))
            self.holds += 1

    def release(self) -> None:
        """Send what became durable (call when ``fileno`` is readable); everything held,
        refused, once the store failed (see "A failed store")."""
        self._send_upto(self.store.drain())
        if (self._held or self._untagged) and self.store.failed:
            self._fail()

    def _fail(self) -> None:
        """The store failed: send what is held with its positive acknowledges refused,
        run held calls' failure paths (drop those without one), hold nothing from now on."""
        self.failed = True
        waiting = [item for _ticket, item in self._held]
        waiting += self._untagged
        self._held = deque()
        self._untagged = []
        calls = dropped = 0
        for item in waiting:
            if isinstance(item, list):
                self._send(_refused(item))
            elif item[1] is not None:
                calls += 1
                item[1]()
            else:
                dropped += 1
        log.error(
            "store failed: %d held outputs sent with their acknowledges refused, %d held "
            "calls failed, %d dropped",
            len(waiting) - calls - dropped,
            calls,
            dropped,
        )

    def _send_upto(self, done: int) -> None:
        held = self._held
        while held and held[0][0] <= done:
            item = held.popleft()[1]
            if isinstance(item, list):
                self._send(item)
            else:
                item[0]()  # a call (see call)

    def forget(self, client_id: str) -> None:
        """Drop what is held for a client whose session ended: the engine already counts
        its held deliveries as never sent (they went back to their queues), and a new
        session under the same id must not get the old one's frames."""
        if self._held:
            self._held = deque((ticket, _without(outs, client_id)) for ticket, outs in self._held)
        if self._untagged:
            self._untagged = [_without(outs, client_id) for outs in self._untagged]

    def release_all(self) -> None:
        """Make everything durable and send what was held (the server is stopping)."""
        if self._draining:
            self.end()
        if self._held and self.store.failed:
            self._fail()
        if self._held:
            self.store.flush()
            self.release()


def _without(outs: list[Any] | _Call, client_id: str) -> list[Any] | _Call:
    """A held output without the frames for ``client_id`` (a call stays as it is)."""
    return [o for o in outs if o[0] != client_id] if isinstance(outs, list) else outs


def _refused(outs: list[Any]) -> list[Any]:
    """``outs`` with each positive acknowledge made negative (``failed``)."""
    return [_refuse(out) for out in outs]


def _refuse(out: Any) -> Any:
    frame = out[1]
    if frame.__class__ is not Frame or frame.message_type != _ACK:
        return out
    if any(key.lower() == _NACK for key, _value in frame.headers):
        return out  # already negative
    nack = ack(
        frame.content_type,
        frame.message_id,
        frame.source,
        frame.target,
        NackReason.FAILED,
        NOT_SAVED,  # (why a positive acknowledge held when the store failed leaves negative)
        frame.high_priority,
    )
    return Outgoing(out[0], nack)
