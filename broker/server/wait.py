"""How the server's loop waits for its sources: one ``poll()`` system call per wake.

``zmq_poll`` over N ZeroMQ sockets makes two ``poll()`` passes and asks every socket for
its ``ZMQ_EVENTS`` in each (each ask is a system call on the socket's mailbox): with the
ROUTER, the stop socket, the monitor and the fan-out XPUB that was ten system calls per
wake, where a round trip wakes the loop once.  :class:`LoopWait` asks each ZeroMQ socket
once, then makes one ``poll()`` over plain descriptors:

* the ROUTER and other ZeroMQ sockets (the fan-out XPUB, readers added as sockets) by their
  ``ZMQ_FD``, which libzmq makes readable when commands reach the socket.  It is edge-wise:
  after a send or a receive only ``ZMQ_EVENTS`` tells whether a message waits, so each is
  asked before a block (the ROUTER's answer "nothing" is also a "read empty" for the
  keep-alive rules, ``PeerSessions.emptied_at``), but a socket whose sends are counted
  (the XPUB) and that was found without input is not asked again until it sent.  A
  readable ``ZMQ_FD`` of another socket is checked with ``ZMQ_EVENTS`` before its reader is
  called; the ROUTER's is not (its drain stops at the first receive that finds nothing);
* the monitor (a ZeroMQ PAIR that only the loop reads, always until it is empty, or until
  its drain's cap: the reader's ``unread`` says so) by its ``ZMQ_FD`` alone, once it was read (a
  ZeroMQ socket's descriptor announces only what comes after a read that found nothing);
* plain descriptors: the stop signal (``zerohub.wakeup.Wakeup``), the store's, readers added
  as descriptors (level-triggered: readable until read).

When a socket already has input the ``poll()`` does not block (timeout 0).  Linux and the
other systems with ``select.poll`` (not Windows).
"""

from __future__ import annotations

import select
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Protocol

import zmq

_EVENTS = zmq.EVENTS
_FD = zmq.FD
_POLLIN = int(zmq.POLLIN)


def _events_of(sock: Any) -> Callable[[int], int]:
    """``sock.get``, typed for the integer options read here (ZMQ_EVENTS, ZMQ_FD)."""
    get: Callable[[int], int] = sock.get
    return get


class CountsSends(Protocol):
    """Who sends on a watched socket and counts it (``FanoutDoor``)."""

    @property
    def sends(self) -> int: ...


class ReadsToEmpty(Protocol):
    """The only reader of a socket, which reads it until it finds nothing, or sets
    ``unread`` (its cap: ``Connections.drain``)."""

    @property
    def unread(self) -> bool: ...


@dataclass(slots=True)
class _Watched:
    """A ZeroMQ socket other than the ROUTER (``LoopWait.add_socket``)."""

    get: Callable[[int], int]
    sender: CountsSends | None
    #: ``sender.sends`` when it was last found without input (``quiet``).
    sends: int = 0
    quiet: bool = False


class LoopWait:
    """The loop's sources and one wait over them (see the module docstring).  Keys are the
    objects registered (a socket, a descriptor number, a reader's pollable); ``wait``
    returns those that have input, and whether the ROUTER was found without input."""

    def __init__(self, router: zmq.Socket[bytes]) -> None:
        self.router = router
        self._router_events = _events_of(router)
        self._poll = select.poll()
        self._by_fd: dict[int, Hashable] = {}
        #: ZeroMQ sockets other than the ROUTER: asked for EVENTS before a block.
        self._sockets: dict[zmq.Socket[bytes], _Watched] = {}
        #: Sockets read until empty, with their reader (the monitor).
        self._drained: list[tuple[Any, ReadsToEmpty]] = []
        #: Drained sockets not read yet: ready at the next wait.
        self._unchecked: list[Any] = []
        self._add(_events_of(router)(_FD), router)

    def _add(self, fd: int, key: Hashable) -> None:
        if fd in self._by_fd:
            raise ValueError(f"descriptor {fd} is watched already")
        self._by_fd[fd] = key
        self._poll.register(fd, select.POLLIN)

    def add_fd(self, fd: int, key: Hashable | None = None) -> None:
        """A plain descriptor (level-triggered): ready while readable."""
        self._add(fd, fd if key is None else key)

    def add_socket(self, sock: zmq.Socket[bytes], sender: CountsSends | None = None) -> None:
        """A ZeroMQ socket someone else may send or receive on: ready when it has input.
        ``sender``: who counts the sends made on it, when its reader always reads until
        it finds nothing: while the count stays, a socket found without input is not
        asked again (its descriptor announces what comes); None: asked before every block."""
        watched = self._sockets[sock] = _Watched(_events_of(sock), sender)
        self._add(watched.get(_FD), sock)

    def add_drained(self, sock: Any, reader: ReadsToEmpty) -> None:
        """A ZeroMQ socket only ``reader`` touches, reading until it finds nothing unless
        it says ``unread``: ready when its descriptor is readable or ``reader.unread``."""
        self._drained.append((sock, reader))
        self._add(_events_of(sock)(_FD), sock)
        # Its descriptor announces only what comes after a read that found nothing (a
        # new pipe is not waited on yet): it is ready once, to be read until empty.
        self._unchecked.append(sock)

    def add(self, pollable: Any, sender: CountsSends | None = None) -> None:
        """A reader's pollable: a ZeroMQ socket (see :meth:`add_socket`) or a descriptor
        (an int or a ``fileno()``)."""
        if isinstance(pollable, zmq.Socket):
            self.add_socket(pollable, sender)
        elif isinstance(pollable, int):
            self.add_fd(pollable)
        else:
            self.add_fd(pollable.fileno(), pollable)

    def wait(self, timeout_ms: int) -> tuple[list[Hashable], bool]:
        """The sources with input after at most ``timeout_ms`` (0: do not block), and
        True when the ROUTER had no message waiting before the wait."""
        ready: list[Hashable] = []
        router_empty = not self._router_events(_EVENTS) & _POLLIN
        if not router_empty:
            ready.append(self.router)
        sockets = self._sockets
        for sock, watched in sockets.items() if sockets else ():
            sender = watched.sender
            if sender is None:
                if watched.get(_EVENTS) & _POLLIN:
                    ready.append(sock)
                continue
            sends = sender.sends
            if watched.quiet and sends == watched.sends:
                continue  # found without input, untouched since
            watched.sends = sends
            watched.quiet = not watched.get(_EVENTS) & _POLLIN
            if not watched.quiet:
                ready.append(sock)
        for sock, reader in self._drained:
            if reader.unread:
                ready.append(sock)
        if self._unchecked:
            ready += self._unchecked
            self._unchecked = []
        hits = self._poll.poll(0 if ready else timeout_ms)
        if hits:
            by_fd = self._by_fd
            for fd, _events in hits:
                key = by_fd[fd]
                if key in ready:
                    continue
                if key is self.router:
                    ready.append(key)
                    continue
                # (its own name: ``watched`` above is never None, this may be)
                found: _Watched | None = sockets.get(key)  # type: ignore[call-overload]
                if found is not None:
                    if not found.get(_EVENTS) & _POLLIN:
                        continue  # commands only (the descriptor is edge-wise)
                    found.quiet = False  # (asked again at the next wait)
                ready.append(key)
        return ready, router_empty
