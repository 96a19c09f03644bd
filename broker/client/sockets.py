"""The clients' DEALER socket: options, CURVE and the handshake watch (both drivers).

Works on a plain ``zmq.Socket`` and on a ``zmq.asyncio.Socket`` alike: the options and
``connect`` are the same calls, and the monitor is read through a plain shadow of it
(``zerohub.zmqkit.HandshakeWatch`` never blocks).  The CURVE keys, the monitor's events and
their meaning come from ``zerohub.zmqkit``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import zmq

from broker.client.errors import AccessRefused, ConnectError
from zerohub import zmqkit


@dataclass(frozen=True, slots=True)
class Curve:
    """A CURVE client: its certificate (secret key file) and the server's public key file."""

    secret: str | os.PathLike[str]
    server_key: str | os.PathLike[str]

    @classmethod
    def of(
        cls, server_key: str | os.PathLike[str] | None, curve_secret: str | os.PathLike[str] | None
    ) -> Curve | None:
        """The client's CURVE settings from its two options (both or neither)."""
        if (server_key is None) != (curve_secret is None):
            raise ValueError("CURVE needs both server_key and curve_secret")
        if server_key is None or curve_secret is None:
            return None
        return cls(curve_secret, server_key)


#: The broker's delivery batches (``ServerOptions.unacked_batch_octets``, 8 KiB) hold
#: at most 8192 // 1025 = 7 times the deliveries of any one size that the 2 KiB
#: batches ``hwm`` was sized for held: the receive pipe holds 7 times fewer messages,
#: so a consumer that stops reading holds no more deliveries in it than before (the
#: broker's send pipe likewise: ``ServerOptions.pipe_hwm``).
_BATCH_SHARE = 7


def receive_hwm(hwm: int) -> int:
    """The DEALER's receive high-water mark for a client's ``hwm`` (0: no limit)."""
    return max(1, hwm // _BATCH_SHARE) if hwm > 0 else hwm


#: What a client's watch of its DEALER reports (``open_dealer``): the handshake's
#: failures, and a connection that ended after its handshake (``read_watch``).
WATCHED_EVENTS = zmqkit.HANDSHAKE_EVENTS | zmq.EVENT_DISCONNECTED


def open_dealer(
    context: Any, endpoint: str, *, hwm: int, curve: Curve | None, watch: bool
) -> tuple[Any, zmqkit.HandshakeWatch | None]:
    """A connected DEALER and, if CURVE or ``watch``, a watch of its handshake and of
    its connection's end (poll its ``socket``; ``read_watch`` reads it; its ``close``
    ends it).  The drivers watch every dial until the broker answers the hello.

    ``context`` is a ``zmq.Context`` or a ``zmq.asyncio.Context`` (the sockets are of its
    kind).  Unreadable key files are a ``ConnectError``.
    """
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    sock.sndhwm = hwm
    sock.rcvhwm = receive_hwm(hwm)
    sock.routing_id = b"\x01" + os.urandom(15)
    if curve is not None:
        try:
            zmqkit.configure_client(sock, curve.secret, curve.server_key)
        except zmqkit.SecurityError as exc:
            sock.close(linger=0)
            raise ConnectError(str(exc)) from None
    monitor = None
    if curve is not None or watch:
        # handshake failures (CURVE key refused; a plain client against a CURVE server)
        # end the connect at once instead of at its timeout
        monitor = zmqkit.HandshakeWatch(
            sock.get_monitor_socket(WATCHED_EVENTS), curve=curve is not None
        )
    sock.connect(endpoint)
    return sock, monitor


@dataclass(frozen=True, slots=True)
class Watched:
    """What a dial's watch has seen (``read_watch``)."""

    #: the handshake was refused, as the client's error (None: not, or not judged)
    refusal: AccessRefused | None
    #: a connection ended after its handshake: the hello it carried is lost
    #: (``Session.dropped``)
    dropped: bool


def read_watch(watch: zmqkit.HandshakeWatch, *, endpoint: str, judge: bool) -> Watched:
    """Take in what the watch holds.  ``judge``: report a refused handshake (the first
    connect, and every dial of a CURVE client, as before); a plain client's reconnect
    does not, since a stopping broker hanging up on its dials would read as "requires
    CURVE" (``zmqkit.HandshakeWatch``) and end a client that only had to wait."""
    report = watch.read()
    refusal = handshake_refusal(report.handshake, endpoint=endpoint) if judge else None
    return Watched(refusal, report.disconnected)


def handshake_refusal(failure: zmqkit.Handshake | None, *, endpoint: str) -> AccessRefused | None:
    """A handshake failure the watch reported, as the client's error (None: no handshake
    refusal; a handshake that timed out is none: the connect's own timeout says "no
    answer")."""
    if failure is None:
        return None
    if failure is zmqkit.Handshake.KEY_REFUSED:
        what = "refused this client's CURVE key"
    elif failure is zmqkit.Handshake.CURVE_REQUIRED:
        what = zmqkit.CURVE_REQUIRED_HINT
    else:
        what = "failed the security handshake (CURVE settings differ?)"
    return AccessRefused(f"the broker at {endpoint} {what}")
