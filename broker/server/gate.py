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

    def fileno(self) -> int: ...

    def drain(self) -> int: ...

    def flush(self) -> None: ...


class OutputGate:
    """Holds engine output until the store's tickets it depends on complete."""

    def __init__(self, store: DurableLike, send: Callable[[list[Any]], None]) -> None:
        self.store = store
        self._send = send
        self._held: deque[tuple[int, list[Any] | Callable[[], None]]] = deque()
        #: outputs held so far (a counter for statistics)
        self.holds = 0

    @property
    def held(self) -> int:
        """Outputs waiting for the store."""
        return len(self._held)

    def fileno(self) -> int:
        return self.store.fileno()

    def admit(self, outs: list[Any]) -> None:
        """Send ``outs`` now if nothing it depends on is pending, else hold it."""
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
            self._held = deque(
                (
                    ticket,
                    [o for o in outs if o[0] != client_id] if isinstance(outs, list) else outs,
                )
                for ticket, outs in self._held
            )

    def release_all(self) -> None:
        """Make everything durable and send what was held (the server is stopping)."""
        if self._held:
            self.store.flush()
            self.release()
