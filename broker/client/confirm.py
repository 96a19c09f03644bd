"""Which of a client's unanswered frames the broker is known to have read.

A push without ``ack`` (and an acknowledge) gets no answer, and libzmq may drop it: a
session lost while it waits in the socket (the socket is closed at once, its queue with
it), or a close whose linger runs out before the broker read it.  The broker reads a
connection's frames in order, so an answer to a later frame proves every earlier one read:
the PONG to the client's keep-alive PING, and the broker's TERMINATE 0 ``goodbye``, sent
once it read the client's own TERMINATE (``broker.client.session``).

:class:`Confirmations` counts the unanswered frames handed to the socket (``sent``, the
callers add to it), notes the count at each PING (``probe``), and moves ``confirmed`` up
when the answer comes.  When frames may have been dropped it notes how many and why
(``doubt``); ``close()`` raises :class:`~broker.client.errors.UnconfirmedSends` with that
(``report``), so a close that returns nothing lost nothing this client sent.  The count
is an upper bound: the broker may have read some of those frames.
"""

from __future__ import annotations

from collections import deque

from broker.client.errors import UnconfirmedSends


class Confirmations:
    """The tallies described in the module docstring (one per client)."""

    __slots__ = ("_probes", "confirmed", "doubted", "reasons", "sent")

    def __init__(self) -> None:
        #: Frames handed over that wait for no answer (written by the callers).
        self.sent = 0
        #: How many of them the broker is known to have read.
        self.confirmed = 0
        #: ``sent`` at each keep-alive PING still waiting for its PONG, oldest first.
        self._probes: deque[int] = deque()
        self.doubted = 0
        self.reasons: list[str] = []

    @property
    def unconfirmed(self) -> int:
        """Frames sent without an answer that the broker is not known to have read."""
        return self.sent - self.confirmed

    def probe(self, queued: int = 0) -> None:
        """A keep-alive PING left, ahead of ``queued`` frames still waiting in the client
        (after every other frame counted so far)."""
        self._probes.append(self.sent - queued)

    def answered(self) -> None:
        """A PONG came: the broker read everything sent before the oldest PING."""
        if self._probes:
            confirmed = self._probes.popleft()
            if confirmed > self.confirmed:
                self.confirmed = confirmed

    def all_read(self) -> None:
        """The broker answered the goodbye: it read everything."""
        self.confirmed = self.sent
        self._probes.clear()

    def doubt(self, why: str, kept: int = 0) -> None:
        """Frames not confirmed may have been dropped (``why``); ``kept`` of them are
        still queued in the client and will be sent again (a reconnect)."""
        self._probes.clear()
        unsure = self.sent - self.confirmed - kept
        if unsure > 0:
            self.doubted += unsure
            self.reasons.append(f"{unsure} when {why}")
        self.confirmed = max(self.confirmed, self.sent - kept)

    def report(self) -> UnconfirmedSends | None:
        """The error ``close()`` raises, if anything was doubted (then forgotten)."""
        if not self.doubted:
            return None
        error = UnconfirmedSends(self.doubted, self.reasons)
        self.doubted = 0
        self.reasons = []
        return error
