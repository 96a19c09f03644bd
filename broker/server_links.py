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

Peers that are simply gone (a dead host, a suspended process) are found by libzmq's own
heartbeats (``ZMQ_HEARTBEAT_IVL``/``TIMEOUT``, set by the server), which close them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
from dataclasses import dataclass

import zmq

log = logging.getLogger("broker.server")


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
