"""Closing one peer's connection under a ROUTER socket (libzmq 4.3 has no call for it).

A ROUTER cannot disconnect one peer: libzmq 4.3.5 offers no per-peer disconnect outside
its draft API (not built into pyzmq's wheels), and a peer that ignores the TERMINATE
frame the server sends would keep its TCP connection, and a file descriptor of the
broker, for as long as it likes.  What libzmq does tell us is the descriptor a message
was read from (``ZMQ_SRCFD``); :class:`Link` remembers it together with the socket's
inode, and :meth:`Link.close` shuts the connection down (``shutdown(SHUT_RDWR)``, never
``close``: the descriptor stays libzmq's) only if the descriptor still names that same
socket.  libzmq then sees the end of the stream, closes the descriptor and forgets the
peer, as when the peer hangs up itself.

Peers that are simply gone (a dead host, a suspended process) stop answering the
server's PINGs: their session expires and their link is shut down like any other.
(libzmq's own ZMTP heartbeats would find them too, but they are off: with them on, the
last messages of a client flooding the broker and then closing stalled, and were lost
when its linger ran out.)

A connection that never says anything is not a peer the server knows: :class:`Connections`
follows the ROUTER's connections through its monitor socket (accepted, disconnected) and
names those that have not greeted within the handshake timeout, or that exceed the
server's connection limit, so that the server shuts them down too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
from collections.abc import Collection
from dataclasses import dataclass

import zmq
from zmq.utils.monitor import parse_monitor_message

log = logging.getLogger("broker.server.server")


@dataclass(frozen=True, slots=True)
class Link:
    """The connection (descriptor + socket inode) one ZeroMQ message came in on."""

    fd: int
    inode: int

    @classmethod
    def of(cls, part: zmq.Frame) -> Link | None:
        """The link of a received message part; None when it came without a socket
        (inproc) or the descriptor is already gone."""
        try:
            fd = int(part.get(zmq.SRCFD))
            if fd < 0:
                return None
            st = os.fstat(fd)
        except (zmq.ZMQError, OSError, ValueError):
            return None
        if not stat.S_ISSOCK(st.st_mode):
            return None
        return cls(fd, st.st_ino)

    def is_current(self) -> bool:
        """The descriptor still names the socket it named when the link was taken."""
        try:
            st = os.fstat(self.fd)
        except OSError:
            return False
        return stat.S_ISSOCK(st.st_mode) and st.st_ino == self.inode

    def close(self) -> bool:
        """Shut the connection down (False if it was gone already)."""
        if not self.is_current():
            return False
        try:
            sock = socket.socket(fileno=self.fd)
        except OSError:
            return False
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            return False
        finally:
            with contextlib.suppress(OSError):
                sock.detach()  # the descriptor stays libzmq's to close
        log.debug("shut down connection fd %d", self.fd)
        return True


def curve_key(part: zmq.Frame) -> str | None:
    """The CURVE public key (Z85) the peer of a received message authenticated with.

    Set by the ZAP handler as the connection's ``User-Id``; None without CURVE.
    """
    try:
        key = part.get("User-Id")
    except (zmq.ZMQError, UnicodeDecodeError):
        return None
    return key if isinstance(key, str) and key else None


_WATCHED = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED
_DRAIN = 256  # monitor events handled per call


@dataclass(slots=True)
class _Accepted:
    link: Link
    since: float
    greeted: bool = False


class Connections:
    """The connections accepted by a ROUTER socket, from its monitor (see the module
    docstring).  ``drain`` when the monitor is readable; ``close`` before the socket."""

    def __init__(self, router: zmq.Socket[bytes], limit: int) -> None:
        self.monitor = router.get_monitor_socket(_WATCHED)
        self._router = router
        self._limit = limit
        self._open: dict[int, _Accepted] = {}  # by descriptor
        self._refused: dict[int, Link] = {}  # shut down as over the limit, until they end
        self.refused = 0  # how many were
        #: The last ``drain`` stopped at its cap: events may wait that the monitor's
        #: descriptor will not announce again (``broker.server.wait``).
        self.unread = False

    def __len__(self) -> int:
        return len(self._open)

    def drain(self, now: float) -> list[int]:
        """Take the monitor's events; shut down connections beyond the limit at once.

        Returns the descriptors of the connections that ended.
        """
        ended: list[int] = []
        self.unread = True
        for _ in range(_DRAIN):
            try:
                event = parse_monitor_message(self.monitor.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                self.unread = False
                break
            fd = int(event["value"])
            if event["event"] == zmq.EVENT_DISCONNECTED:
                self._open.pop(fd, None)
                self._refused.pop(fd, None)
                ended.append(fd)
                continue
            try:
                link = Link(fd, os.fstat(fd).st_ino)
            except OSError:
                continue  # gone already
            if len(self._open) >= self._limit:
                self.refused += 1
                self._refused[fd] = link
                link.close()
                continue
            self._open[fd] = _Accepted(link, now)
        return ended

    def pending(self) -> bool:
        """Events wait on the monitor (drain them before trusting what is known here)."""
        return bool(self.monitor.poll(0))

    def was_refused(self, link: Link) -> bool:
        """The connection was shut down for being over the limit (its messages may still
        arrive: libzmq had read them)."""
        return self._refused.get(link.fd) == link

    def silent(self, now: float, timeout: float, known: Collection[Link]) -> list[Link]:
        """Connections accepted ``timeout`` or more ago whose peer never became one the
        server knows (``known``: its peers' links); they are forgotten here."""
        out: list[Link] = []
        for fd, entry in list(self._open.items()):
            if entry.greeted or now - entry.since < timeout:
                continue
            if entry.link in known:
                entry.greeted = True
            else:
                out.append(entry.link)
                del self._open[fd]
        return out

    def close(self) -> None:
        self._router.disable_monitor()
        self.monitor.close(linger=0)
