"""Peers of the server's ROUTER socket: the handshake, sessions, keep-alive, expiry.

Each peer (a ROUTER routing id) goes through a small handshake state machine before its
frames reach the engine::

    (unknown) --"TMQP/2.0"--> AWAIT_INFO --connection info--> READY
         \\--anything else--> TERMINATE "handshake required"/"unsupported protocol"

A client reconnecting under its id replaces a session that has gone quiet.  Quiet peers
get a PING, silent ones are disconnected, and a handshake that does not finish in time
is forgotten.  Requests the server cannot handle are answered here too: ``error_frame``
(a RESPONSE with a status and a ``Reason`` header) and ``terminate_frame``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from broker import tmqp
from broker.protocol import (
    GREETING,
    ConnectionInfo,
    ConnectionInfoError,
    Header,
    MessageType,
    Operation,
    ResultCode,
)
from broker.server_options import ServerOptions
from broker.server_send import Peer, PeerState, ServerSendPath
from zproto.errors import DecodeError

log = logging.getLogger("broker.server")

_PING = tmqp.encode(tmqp.Ping())[0]
_PONG = tmqp.encode(tmqp.Pong())[0]


class EngineLike(Protocol):
    """What the server needs from ``broker.engine.Engine``."""

    def connect(self, info: ConnectionInfo, now: float) -> tuple[str, list[Any]]: ...
    def receive(self, client_id: str, frame: tmqp.Frame, now: float) -> list[Any]: ...
    def disconnect(self, client_id: str, now: float) -> list[Any]: ...
    def transmitted(self, counts: dict[str, int], now: float) -> list[Any]: ...
    def tick(self, now: float) -> list[Any]: ...
    def next_deadline(self) -> float | None: ...
    def stats(self) -> dict[str, object]: ...


def salvage_message_id(data: bytes) -> str:
    """Best-effort message id of a frame that failed to decode ('' if unreadable)."""
    if len(data) < 8:
        return ""
    marker = data[7]
    start = 8 + {253: 2, 254: 4, 255: 8}.get(marker, 0)
    raw = data[start : start + data[2]]
    if len(raw) != data[2]:
        return ""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return ""


def error_frame(message_id: str, code: ResultCode, reason: str) -> tmqp.Frame:
    """The RESPONSE the server sends for a request it cannot handle."""
    return tmqp.Frame(
        message_type=MessageType.RESPONSE,
        content_type=code,
        message_id=message_id,
        headers=((Header.REASON, reason[:400]),),
    )


def terminate_frame(code: ResultCode, reason: str) -> tmqp.Frame:
    """A TERMINATE frame: the server ends (or refuses) the session."""
    return tmqp.Frame(
        message_type=MessageType.TERMINATE,
        content_type=code,
        headers=((Header.REASON, reason[:400]),),
    )


class PeerSessions(ServerSendPath):
    """Handshakes and sessions of the ROUTER peers (see the module docstring)."""

    def __init__(self, engine: EngineLike, options: ServerOptions) -> None:
        super().__init__(options)
        self.engine = engine
        self._peers: dict[bytes, Peer] = {}
        self._next_scan = 0.0

    def _guard(self, what: str, call: Callable[..., list[Any]], *args: Any) -> list[Any]:
        try:
            return call(*args)
        except Exception:
            log.exception("engine %s failed", what)
            self.counters["engine_errors"] += 1
            return []

    # -- handshake ---------------------------------------------------------------------

    def _handshake(self, rid: bytes, peer: Peer | None, data: bytes, now: float) -> None:
        if peer is None:
            if data == GREETING:
                self._peers[rid] = Peer(rid, now)
                self._send_rid(rid, GREETING)
            elif data == _PING:
                self._refuse(rid, ResultCode.UNAUTHORIZED, "handshake required")
            elif data[:5] == b"TMQP/" and len(data) <= 16:
                proto = data.decode("ascii", "replace")
                self._refuse(rid, ResultCode.UNACCEPTABLE, f"unsupported protocol {proto!r}")
            else:
                self._refuse(rid, ResultCode.UNAUTHORIZED, "handshake required")
            return
        # AWAIT_INFO: the connection-info frame, or a repeated greeting / keep-alive.
        peer.last_seen = now
        if data == GREETING:
            self._send_rid(rid, GREETING)
            return
        if data == _PING:
            self._send_rid(rid, _PONG)
            return
        if len(data) > self.options.max_frame_size:
            self._forget(peer)
            self._refuse(rid, ResultCode.LIMIT_EXCEEDED, "connection info too large")
            return
        try:
            msg = tmqp.decode([data])
        except DecodeError as exc:
            self._forget(peer)
            self._refuse(rid, ResultCode.BAD_REQUEST, f"malformed connection info: {exc.reason}")
            return
        if (
            type(msg) is not tmqp.Frame
            or msg.message_type != MessageType.SERVER
            or msg.content_type != Operation.CONNECT
        ):
            self._forget(peer)
            self._refuse(rid, ResultCode.BAD_REQUEST, "expected the connection-info message")
            return
        try:
            info = ConnectionInfo.from_payload(msg.payload)
        except ConnectionInfoError as exc:
            self._forget(peer)
            self._refuse(rid, ResultCode.BAD_REQUEST, str(exc))
            return
        if info.client_id is not None:
            self._take_over(info.client_id, now)
        try:
            client_id, outs = self.engine.connect(info, now)
        except Exception as exc:
            self._forget(peer)
            code = getattr(exc, "code", None)
            if code is None:
                log.exception("engine failed to connect a client")
                self.counters["engine_errors"] += 1
                self._refuse(rid, ResultCode.FAILED, "server error")
            else:
                self._refuse(rid, ResultCode(int(code)), str(getattr(exc, "reason", exc)))
            return
        peer.state = PeerState.READY
        peer.client_id = client_id
        self._by_client[client_id] = peer
        log.debug("client %s connected", client_id)
        answered = any(o.client_id == client_id and o.frame.message_id == msg.message_id
                       for o in outs)  # fmt: skip
        if not answered:
            # The engine did not answer the connection info: tell the client its id.
            self._send_to(peer, self._connected_frame(msg.message_id, client_id))
        self._send_all(outs)

    @staticmethod
    def _connected_frame(message_id: str, client_id: str) -> tmqp.Frame:
        return tmqp.Frame(
            message_type=MessageType.RESPONSE,
            content_type=ResultCode.OK,
            message_id=message_id,
            target=client_id,
            headers=((Header.CLIENT_ID, client_id),),
        )

    def _take_over(self, client_id: str, now: float) -> None:
        """A client reconnecting under its id replaces a session that has gone quiet."""
        old = self._by_client.get(client_id)
        if old is not None and now - old.last_seen >= self.options.ping_interval:
            log.info("client %s reconnected; dropping its stale session", client_id)
            self._drop(old, now)

    def _refuse(self, rid: bytes, code: ResultCode, reason: str) -> None:
        self.counters["refused"] += 1
        log.debug("refused peer %r: %s", rid, reason)
        self._send_rid(rid, tmqp.encode(terminate_frame(code, reason))[0])

    def _bad(self, peer: Peer, data: bytes, reason: str, code: ResultCode) -> None:
        self.counters["bad_frames"] += 1
        log.debug("bad frame from %s: %s", peer.client_id, reason)
        self._send_to(peer, error_frame(salvage_message_id(data), code, reason))

    # -- peers -------------------------------------------------------------------------

    def _forget(self, peer: Peer) -> None:
        self._peers.pop(peer.rid, None)
        if peer.client_id and self._by_client.get(peer.client_id) is peer:
            del self._by_client[peer.client_id]
        self._blocked.discard(peer)

    def _drop(self, peer: Peer, now: float) -> None:
        """End a READY peer's session in the engine and forget it."""
        self._flush_out()  # what is batched for it goes out (or into its backlog) first
        self._forget(peer)
        if peer.state is PeerState.READY:
            peer.state = PeerState.AWAIT_INFO
            # the engine learns what reached the peer; the rest goes back to the queues
            self._report_transmitted(now)
            self._send_all(self._guard("disconnect", self.engine.disconnect, peer.client_id, now))

    def _report_transmitted(self, now: float) -> None:
        """Tell the engine which tracked deliveries libzmq took; send what that releases."""
        counts = self._take_transmitted()
        if counts:
            self._send_all(self._guard("transmitted", self.engine.transmitted, counts, now))

    def _bury(self, now: float) -> None:
        gone, self._gone = self._gone, []
        for peer in gone:
            if self._peers.get(peer.rid) is peer:
                self._drop(peer, now)

    def _scan(self, now: float) -> None:
        opts = self.options
        self._next_scan = now + min(1.0, opts.ping_interval / 2)
        for peer in list(self._peers.values()):
            idle = now - peer.last_seen
            if peer.state is not PeerState.READY:
                if now - peer.since >= opts.handshake_timeout:
                    self._forget(peer)
            elif idle >= opts.peer_timeout:
                log.info("client %s silent for %.1f s: disconnected", peer.client_id, idle)
                self.counters["expired"] += 1
                self._drop(peer, now)
            elif idle >= opts.ping_interval and not peer.pinged:
                peer.pinged = True
                self._send_raw(peer, _PING)

    def peers(self) -> dict[str, str]:
        """Connected client ids and their state (call from the serving thread or after stop)."""
        return {p.client_id or repr(p.rid): p.state.value for p in list(self._peers.values())}
