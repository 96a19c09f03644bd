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
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, Protocol


class DurableLike(Protocol):
    """What the gate reads of a durable store (``broker.store.durable.DurableStore``)."""

    @property
    def appended(self) -> int: ...

    @property
    def completed(self) -> int: ...

    @property
    def writer_idle(self) -> bool: ...

    def fileno(self) -> int: ...

    def drain(self) -> int: ...

    def flush(self) -> None: ...

    @property
    def unwritten(self) -> int: ...

    def hold(self) -> None: ...

    def release(self) -> None: ...


class OutputGate:
    """Holds engine output until the store's tickets it depends on complete."""

    def __init__(self, store: DurableLike, send: Callable[[list[Any]], None]) -> None:
        self.store = store
        self._send = send
        self._held: deque[tuple[int, list[Any] | Callable[[], None]]] = deque()
        #: outputs of the open drain waiting for their ticket (see "A drain")
        self._untagged: list[list[Any] | Callable[[], None]] = []
        self._draining = False
        #: outputs held so far (a counter for statistics)
        self.holds = 0

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
        untagged = self._untagged
        if untagged:
            self._untagged = []
            ticket = store.appended
            held = self._held
            for item in untagged:
                held.append((ticket, item))
            self.holds += len(untagged)
            self._send_upto(store.completed)

    @property
    def writer_idle(self) -> bool:
        """The store's writer waits for work: a part handed over now starts at once."""
        return self.store.writer_idle

    def cut(self) -> None:
        """Within a drain: the store writes what it held so far and holds again; the
        outputs that waited for those writes are tagged with their ticket, and what is
        durable already is sent (no system call: the completion count is read)."""
        self.end()
        self.store.hold()
        self._draining = True
        if self._held:
            self._send_upto(self.store.completed)

    def _waits(self) -> bool:
        """Must an output admitted now wait for the drain's end (see "A drain")?"""
        return bool(self._untagged) or self.store.unwritten > 0

    def fileno(self) -> int:
        return self.store.fileno()

    def admit(self, outs: list[Any]) -> None:
        """Send ``outs`` now if nothing it depends on is pending, else hold it."""
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

    def call(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` once everything admitted so far has left and the store's newest
        write is durable (now if nothing is pending): how another door (STOMP) sends a
        receipt or a delivery only once the message it concerns is on disk."""
        if self._draining and self._waits():
            self._untagged.append(fn)
            return
        store = self.store
        ticket = store.appended
        done = store.completed
        if self._held:
            self._send_upto(done)
        if not self._held and ticket <= done:
            fn()
        else:
            self._held.append((ticket, fn))
            self.holds += 1

    def release(self) -> None:
        """Send what became durable (call when ``fileno`` is readable)."""
        self._send_upto(self.store.drain())

    def _send_upto(self, done: int) -> None:
        held = self._held
        while held and held[0][0] <= done:
            item = held.popleft()[1]
            if isinstance(item, list):
                self._send(item)
            else:
                item()  # a call (see call)

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
        if self._held:
            self.store.flush()
            self.release()


def _without(
    outs: list[Any] | Callable[[], None], client_id: str
) -> list[Any] | Callable[[], None]:
    """A held output without the frames for ``client_id`` (a call stays as it is)."""
    return [o for o in outs if o[0] != client_id] if isinstance(outs, list) else outs
