"""Peers of the server's ROUTER socket: the handshake, sessions, keep-alive, expiry.

Each peer (a ROUTER routing id) goes through a small handshake state machine before its
frames reach the engine::

    (unknown) --"TMQP/2.0"--> AWAIT_INFO --connection info--> READY
         \\--anything else--> TERMINATE "handshake required"/"unsupported protocol"

Client ids are identities.  The connect response gives every session a secret
(``Session-Secret`` header).  A connection naming a client id that a session holds is
refused (TERMINATE 481 "client id ... is in use") unless it proves it belongs to that
session's owner: it sends the secret back as a ``Session-Secret`` connection-info
property, or under CURVE it authenticated with the same public key.  The proven owner
takes the id over at once (its old session ends; its old connection is told and closed),
which is how a client resumes after losing its connection before the broker noticed.
Nobody else gets the id before the session ends: it ends when the client leaves
(TERMINATE), when its connection is gone, or when it has been silent for
``peer_timeout`` (missed PINGs); then the id is free for anyone.  A client's TERMINATE
is answered with TERMINATE 0 "goodbye" once its session ended in the engine: a client
reading up to it has read everything the session sent it.  Authentication (the
engine's token check) comes before any of this: a refused token changes nothing.
Secrets are compared in constant time and replaced at every connect.
The connect response also announces ``peer_timeout`` (``Peer-Timeout-Ms``): clients pace
their PINGs from it, so one that stops reading for a while is not taken for dead.

A peer is alive while frames come from it, and while it drains what the server sends
(its send backlog shrinks: ``broker.server.send``).  Quiet peers get a PING, silent ones
are ended, told (TERMINATE) and then their connection
is shut down (``broker.server.links``), as are connections whose connection info was
refused or whose session a resumed one replaced, or that do not finish the handshake
within ``handshake_timeout`` (counted from the TCP accept: a connection that never says
anything goes too).  At most ``ServerOptions.max_handshakes`` may be under way at once,
and a session ends when its connection does.  Requests
the server cannot handle are answered here too: ``error_frame`` (a RESPONSE with a status
and a ``Reason`` header) and ``terminate_frame``.
"""

from __future__ import annotations

import dataclasses
import hmac
import logging
import secrets
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import zmq

from broker import batch, tmqp
from broker.protocol import (
    GOODBYE_REASON,
    GREETING,
    ConnectionInfo,
    ConnectionInfoError,
    Header,
    MessageType,
    Operation,
    ResultCode,
)
from broker.server.links import Connections, Link, curve_key
from broker.server.options import ServerOptions
from broker.server.send import Peer, PeerState, SendPath
from zproto.errors import DecodeError

log = logging.getLogger("broker.server.server")

_PING = tmqp.encode(tmqp.Ping())[0]
_PONG = tmqp.encode(tmqp.Pong())[0]
#: Seconds between telling a peer its session is over (TERMINATE) and shutting its
#: connection down: time for the frame to leave, and for a well-behaved client to go first.
_CLOSE_GRACE = 1.0
#: The same for a client that said goodbye (TERMINATE): it reads what the server sent it
#: before the answering TERMINATE (messages that are its own once sent), then hangs up.
_GOODBYE_GRACE = 5.0
#: The answer to a client's TERMINATE, sent once its session ended in the engine: the last
#: frame of the session (everything sent to the client before it went first).
_GOODBYE = tmqp.encode(
    tmqp.Frame(
        message_type=MessageType.TERMINATE,
        content_type=ResultCode.OK,
        headers=((Header.REASON, GOODBYE_REASON),),
    )
)[0]
_SECRET_KEY = Header.SESSION_SECRET.lower()
_FEDERATION_KEY = Header.FEDERATION_SECRET.lower()
#: A session whose connection has ended is ended once nothing more came from it for this
#: long (seconds): the messages it sent before the close are read after libzmq reports it.
_ORPHAN_GRACE = 2.0
#: How long after that an ended connection's descriptor is still checked against the peers.
_ENDED_WINDOW = 5.0
#: The longest an ended connection's descriptor is watched (the ROUTER never read empty).
_ENDED_LIMIT = 120.0


class EngineLike(Protocol):
    """What the server needs from ``broker.engine.Engine``."""

    def connect(
        self, info: ConnectionInfo, now: float, *, replace: bool = False, federation: bool = False
    ) -> tuple[str, list[Any]]: ...
    def receive(
        self, client_id: str, frame: tmqp.Frame, now: float, data: bytes | None = None
    ) -> list[Any]: ...
    def disconnect(self, client_id: str, now: float) -> list[Any]: ...
    def transmitted(self, counts: dict[str, int], now: float) -> list[Any]: ...
    def tick(self, now: float) -> list[Any]: ...
    def next_deadline(self) -> float | None: ...
    def stats(self) -> dict[str, object]: ...
    def stats_page(
        self, after: str | None, budget: int
    ) -> tuple[dict[str, object], str | None]: ...


def delivery_batch(properties: Mapping[str, str]) -> int:
    """Deliveries one message may carry to a client, from its connection info's
    ``Batch-Deliveries`` property (``broker.batch``): 0 (one each) when absent or bad,
    at most ``batch.DEFAULT_MAX_FRAMES``."""
    wanted = batch.BATCH_DELIVERIES.lower()
    for key, value in properties.items():
        if key.lower() == wanted:
            value = value.strip()
            if value.isdigit() and int(value) > 1:
                return min(int(value), batch.DEFAULT_MAX_FRAMES)
    return 0


def salvage_message_id(data: bytes) -> str:
    """Best-effort message id of a frame that failed to decode ('' if unreadable).

    The generated codec's tolerant peek reads it (never raises).
    """
    return tmqp.peek_message_id(data) or ""


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


@dataclasses.dataclass(frozen=True, slots=True)
class SessionProof:
    """What a connection must show to take over the session of its client id."""

    secret: bytes  # issued with the connect response
    curve_key: str | None  # the CURVE public key the session's connection used

    def proven_by(self, secret: str | None, key: str | None) -> bool:
        if (
            key is not None
            and self.curve_key is not None
            and hmac.compare_digest(key.encode(), self.curve_key.encode())
        ):
            return True
        if secret is None:
            return False
        return hmac.compare_digest(secret.encode("utf-8", "replace"), self.secret)


def _split_secret(
    info: ConnectionInfo, name: str = _SECRET_KEY
) -> tuple[ConnectionInfo, str | None]:
    """The connection info without its secret property ``name`` (lower case: the session
    secret, or the federation's), which the engine never sees, and that secret."""
    found = [k for k in info.properties if k.lower() == name]
    if not found:
        return info, None
    props = dict(info.properties)
    secret = props.pop(found[0])
    for key in found[1:]:
        props.pop(key)
    return dataclasses.replace(info, properties=props), secret


def peer_address(part: zmq.Frame | None) -> str | None:
    """The remote address of the connection a message came on (libzmq's
    ``Peer-Address`` property: TCP and IPC peers), or None when libzmq has none."""
    if part is None:
        return None
    try:
        address = part.get("Peer-Address")
    except (zmq.ZMQError, ValueError, TypeError):
        return None
    return address if isinstance(address, str) and address else None


class PeerSessions:
    """Handshakes and sessions of the ROUTER peers (see the module docstring)."""

    def __init__(self, engine: EngineLike, options: ServerOptions, sender: SendPath) -> None:
        self.engine = engine
        self.options = options
        #: The send path the sessions' replies go through (the server's).
        self.sender = sender
        self.counters = sender.counters
        self.by_rid: dict[bytes, Peer] = {}
        self.next_scan = 0.0
        self.handshakes = 0  # peers in AWAIT_INFO
        self.proofs: dict[bytes, SessionProof] = {}  # READY peers, by routing id
        self.links: dict[bytes, Link] = {}  # known peers' connections, by routing id
        self.link_owner: dict[Link, bytes] = {}  # and the other way round
        self.closing: dict[Link, float] = {}  # connections to shut down, and when
        self.connections: Connections | None = None  # set by the server once bound
        self.ended: dict[int, float] = {}  # descriptors of ended connections: check until
        #: Peers libzmq refused a frame for (connection ended), and when: see ``bury``.
        self.unreachable: dict[Peer, float] = {}
        #: When a read of the ROUTER last found nothing more to read (the server sets it):
        #: every message a connection sent before its end was read by then.
        self.emptied_at = float("-inf")
        self.counters.setdefault("closed", 0)

    def guard(self, what: str, call: Callable[..., list[Any]], *args: Any) -> list[Any]:
        try:
            return call(*args)
        except Exception:
            log.exception("engine %s failed", what)
            self.counters["engine_errors"] += 1
            return []

    # -- handshake ---------------------------------------------------------------------

    def handshake(
        self, rid: bytes, peer: Peer | None, data: bytes, now: float, part: zmq.Frame | None
    ) -> None:
        if peer is None:
            self._first_message(rid, data, now, part)
            return
        # AWAIT_INFO: the connection-info frame, or a repeated greeting / keep-alive.
        peer.last_seen = now
        if data == GREETING:
            self.sender.send_rid(rid, GREETING)
            return
        if data == _PING:
            self.sender.send_rid(rid, _PONG)
            return
        if len(data) > self.options.max_frame_size:
            self._turn_away(peer, ResultCode.LIMIT_EXCEEDED, "connection info too large", now)
            return
        try:
            msg = tmqp.decode([data])
        except DecodeError as exc:
            reason = f"malformed connection info: {exc.reason}"
            self._turn_away(peer, ResultCode.BAD_REQUEST, reason, now)
            return
        if (
            type(msg) is not tmqp.Frame
            or msg.message_type != MessageType.SERVER
            or msg.content_type != Operation.CONNECT
        ):
            reason = "expected the connection-info message"
            self._turn_away(peer, ResultCode.BAD_REQUEST, reason, now)
            return
        try:
            info = ConnectionInfo.from_payload(msg.payload)
        except ConnectionInfoError as exc:
            self._turn_away(peer, ResultCode.BAD_REQUEST, str(exc), now)
            return
        self._open_session(peer, msg, info, now, part)

    def _first_message(self, rid: bytes, data: bytes, now: float, part: zmq.Frame | None) -> None:
        """A peer without a session: only the greeting is welcome."""
        # Refused connections are not shut down from here: the message may have been read
        # before its connection closed and its descriptor went to a new one.  One that
        # never greets is shut down after handshake_timeout (see _shut_links).
        if data == GREETING:
            link = Link.of(part) if part is not None else None
            if self._over_connection_limit(link, now):
                self._refuse(rid, ResultCode.BUSY, "too many connections")
                return
            if self.handshakes >= self.options.max_handshakes:
                self._refuse(rid, ResultCode.BUSY, "too many handshakes under way")
                return
            self.by_rid[rid] = Peer(rid, now)
            self.handshakes += 1
            if link is not None:
                self._claim(rid, link)
            self.sender.send_rid(rid, GREETING)
            return
        if data[:5] == b"TMQP/" and len(data) <= 16:
            proto = data.decode("ascii", "replace")
            self._refuse(rid, ResultCode.UNACCEPTABLE, f"unsupported protocol {proto!r}")
        else:
            self._refuse(rid, ResultCode.UNAUTHORIZED, "handshake required")

    def _claim(self, rid: bytes, link: Link) -> None:
        """A greeting names the connection it came on; one connection, one peer.

        A greeting read just before its connection closed may name a descriptor that a
        new connection has taken since: when that connection greets in turn, the link is
        its own, and the earlier claim is withdrawn (its peer will not be shut down by
        link: its connection is gone anyway).
        """
        other = self.link_owner.get(link)
        if other is not None and other != rid:
            self.links.pop(other, None)
        self.link_owner[link] = rid
        self.links[rid] = link

    def _over_connection_limit(self, link: Link | None, now: float) -> bool:
        """The greeting came on a connection shut down for being over the limit.

        The monitor may not have been read yet when a quick peer's greeting arrives:
        read it first, so that no peer slips past ``max_connections``.
        """
        conns = self.connections
        if conns is None or link is None:
            return False
        if conns.pending():
            self.on_connections(now)
        return conns.was_refused(link)

    def _open_session(
        self,
        peer: Peer,
        msg: tmqp.Frame,
        info: ConnectionInfo,
        now: float,
        part: zmq.Frame | None,
    ) -> None:
        """Connection info received: authenticate, settle who owns the id, connect."""
        info, secret = _split_secret(info)
        info, federation_secret = _split_secret(info, _FEDERATION_KEY)
        key = curve_key(part) if part is not None and self.options.curve_secret else None
        old = self.sender.by_client.get(info.client_id) if info.client_id else None
        owner = old is not None and old is not peer and self._owns(old, secret, key)
        federation = self._is_federation(federation_secret, key)
        try:
            client_id, outs = self.engine.connect(info, now, replace=owner, federation=federation)
        except Exception as exc:
            code = getattr(exc, "code", None)
            if code is None:
                log.exception("engine failed to connect a client")
                self.counters["engine_errors"] += 1
                self._turn_away(peer, ResultCode.FAILED, "server error", now)
            else:
                reason = str(getattr(exc, "reason", exc))
                self._turn_away(peer, ResultCode(int(code)), reason, now)
            return
        if owner and old is not None:
            log.info("client %s resumed its session on a new connection", client_id)
            self._end(old, ResultCode.OK, "session resumed on another connection", now)
        self.handshakes -= 1
        peer.state = PeerState.READY
        peer.client_id = client_id
        peer.address = peer_address(part)
        peer.batch = delivery_batch(info.properties)
        if peer.batch:
            self.sender.batching += 1
        self.sender.by_client[client_id] = peer
        issued = secrets.token_urlsafe(24)
        self.proofs[peer.rid] = SessionProof(issued.encode(), key)
        log.debug("client %s connected", client_id)
        extra = self._session_headers(issued)
        answered = False
        for i, o in enumerate(outs):
            if o.client_id == client_id and o.frame.message_id == msg.message_id:
                # the engine answered the connection info itself: add the session headers
                outs[i] = o._replace(frame=o.frame.replace(headers=(*o.frame.headers, *extra)))
                answered = True
                break
        if not answered:
            # The engine did not answer the connection info: tell the client its id.
            self.sender.send_to(peer, self._connected_frame(msg.message_id, client_id, extra))
        self.sender.send_all(outs)

    def _is_federation(self, secret: str | None, key: str | None) -> bool:
        """Did this connection prove it is this broker's own federation client (which
        alone may use the client id ``zerohub-federation``)?  Its secret and, when the
        options name one, its CURVE key (``ServerOptions.federation_secret``/``_key``)."""
        opts = self.options
        if opts.federation_secret is None or secret is None:
            return False
        proven = hmac.compare_digest(
            secret.encode("utf-8", "replace"), opts.federation_secret.encode()
        )
        if opts.federation_key is None:
            return proven
        right_key = hmac.compare_digest((key or "").encode(), opts.federation_key.encode())
        return right_key and proven

    def _owns(self, old: Peer, secret: str | None, key: str | None) -> bool:
        proof = self.proofs.get(old.rid)
        return proof is not None and proof.proven_by(secret, key)

    def _session_headers(self, secret: str) -> tuple[tuple[str, str], ...]:
        """What the connect response tells a client about its session: the secret that
        proves it owns it, and how long a silence ends it (the client paces its PINGs)."""
        timeout_ms = str(int(self.options.peer_timeout * 1000))
        headers: tuple[tuple[str, str], ...] = (
            (Header.SESSION_SECRET, secret),
            (Header.PEER_TIMEOUT_MS, timeout_ms),
        )
        if getattr(self.engine, "receive_batch", None) is not None:  # broker.batch
            octets = max(0, self.options.max_frame_size - batch.BATCH_OVERHEAD)
            headers += (
                (batch.BATCH_MAX, str(self.options.max_batch_frames)),
                (batch.BATCH_OCTETS, str(octets)),
            )
        return headers

    @staticmethod
    def _connected_frame(
        message_id: str, client_id: str, extra: tuple[tuple[str, str], ...]
    ) -> tmqp.Frame:
        return tmqp.Frame(
            message_type=MessageType.RESPONSE,
            content_type=ResultCode.OK,
            message_id=message_id,
            target=client_id,
            headers=((Header.CLIENT_ID, client_id), *extra),
        )

    def _refuse(self, rid: bytes, code: ResultCode, reason: str) -> None:
        self.counters["refused"] += 1
        log.debug("refused peer %r: %s", rid, reason)
        self.sender.send_rid(rid, tmqp.encode(terminate_frame(code, reason))[0])

    def _turn_away(self, peer: Peer, code: ResultCode, reason: str, now: float) -> None:
        """Refuse a peer in the handshake: forget it, tell it, close its connection."""
        link = self.links.get(peer.rid)
        self._forget(peer)
        self._refuse(peer.rid, code, reason)
        if link is not None:
            self.closing.setdefault(link, now + _CLOSE_GRACE)

    def bad_request(self, peer: Peer, message_id: str, reason: str, code: ResultCode) -> None:
        """A request refused whole (a batch over its limits): counted, answered."""
        self.counters["bad_frames"] += 1
        log.debug("bad request from %s: %s", peer.client_id, reason)
        self.sender.send_to(peer, error_frame(message_id, code, reason))

    def bad(self, peer: Peer, data: bytes, reason: str, code: ResultCode) -> None:
        self.counters["bad_frames"] += 1
        log.debug("bad frame from %s: %s", peer.client_id, reason)
        self.sender.send_to(peer, error_frame(salvage_message_id(data), code, reason))

    # -- peers -------------------------------------------------------------------------

    def _forget(self, peer: Peer) -> None:
        if self.by_rid.get(peer.rid) is peer:
            del self.by_rid[peer.rid]
            link = self.links.pop(peer.rid, None)
            if link is not None and self.link_owner.get(link) == peer.rid:
                del self.link_owner[link]
            self.proofs.pop(peer.rid, None)
            if peer.state is not PeerState.READY:
                self.handshakes -= 1
        if peer.client_id and self.sender.by_client.get(peer.client_id) is peer:
            del self.sender.by_client[peer.client_id]
            if peer.batch:
                self.sender.batching -= 1
            if self.sender.gate is not None:
                self.sender.gate.forget(peer.client_id)
        self.sender.blocked.discard(peer)
        self.unreachable.pop(peer, None)

    def goodbye(self, peer: Peer, now: float) -> None:
        """The client ended its session (TERMINATE): end it in the engine (what it did not
        acknowledge and what never reached its socket go back to their queues), then
        answer TERMINATE 0 "goodbye": a client reading up to it has everything it was sent."""
        self.drop(peer, now, _GOODBYE_GRACE)
        self.sender.send_rid(peer.rid, _GOODBYE)

    def drop(self, peer: Peer, now: float, grace: float = _CLOSE_GRACE) -> None:
        """End a READY peer's session in the engine and forget it; close its connection
        ``grace`` seconds later."""
        link = self.links.get(peer.rid)
        self.sender.flush_out()  # what is batched for it goes out (or into its backlog) first
        self._forget(peer)
        if link is not None:
            self.closing.setdefault(link, now + grace)
        if peer.state is PeerState.READY:
            peer.state = PeerState.AWAIT_INFO
            # the engine learns what reached the peer; the rest goes back to the queues
            self.report_transmitted(now)
            self.sender.send_all(
                self.guard("disconnect", self.engine.disconnect, peer.client_id, now)
            )

    def report_transmitted(self, now: float) -> None:
        """Tell the engine which tracked deliveries libzmq took; send what that releases."""
        counts = self.sender.take_transmitted()
        if counts:
            self.sender.send_all(self.guard("transmitted", self.engine.transmitted, counts, now))

    def _end(self, peer: Peer, code: ResultCode, reason: str, now: float) -> None:
        """Tell a peer its session is over, and forget it (the engine has done its part)."""
        self.sender.send_rid(peer.rid, tmqp.encode(terminate_frame(code, reason))[0])
        link = self.links.get(peer.rid)
        self._forget(peer)
        peer.state = PeerState.AWAIT_INFO
        if link is not None:
            self.closing.setdefault(link, now + _CLOSE_GRACE)

    def bury(self, now: float) -> None:
        """End the sessions of the peers libzmq refused a frame for (EHOSTUNREACH).

        libzmq refuses frames for a connection as soon as it has ended, while the
        messages it sent before its end still wait in the ROUTER to be read (a server
        stalled between two reads pings a producer that has just closed).  Ending the
        session at the refusal turned those messages away ("handshake required").  The
        session ends once the ROUTER was read empty after the refusal: by then everything
        the connection sent was read (libzmq's pipe holds it all before it reports the
        end).  A peer whose ROUTER is never read empty is ended by its silence
        (``peer_timeout``) once its messages stop.
        """
        gone, self.sender.gone = self.sender.gone, []
        unreachable = self.unreachable
        for peer in gone:
            if self.by_rid.get(peer.rid) is peer:
                unreachable.setdefault(peer, now)
        emptied = self.emptied_at
        for peer, noticed in list(unreachable.items()):
            if emptied > noticed:
                del unreachable[peer]
                if self.by_rid.get(peer.rid) is peer:
                    self.drop(peer, now)

    def scan(self, now: float) -> None:
        opts = self.options
        self.next_scan = now + min(1.0, opts.ping_interval / 2)
        # A peer is known to be quiet only up to the last time the ROUTER was read empty:
        # a stalled server's unread input may hold its messages.  Pinging a producer taken
        # for quiet that way lost messages: it had closed after its last ones, its side
        # ended the connection with the PING unread (a reset), and what the server had
        # not read yet was gone.
        quiet_until = min(now, self.emptied_at)
        for peer in list(self.by_rid.values()):
            if peer.drained:
                # It took frames that waited for room in its pipe: it reads what we send,
                # though our PING to it waits behind all that (a consumer busy reading a
                # long stream sends nothing else, and was ended as silent).
                peer.drained = False
                peer.pinged = False
                peer.drained_at = now
            seen = peer.last_seen if peer.last_seen > peer.drained_at else peer.drained_at
            idle = now - seen
            if peer.state is not PeerState.READY:
                if now - peer.since >= opts.handshake_timeout:
                    self._turn_away(peer, ResultCode.BAD_REQUEST, "handshake timed out", now)
            elif idle >= opts.peer_timeout:
                log.info("client %s silent for %.1f s: disconnected", peer.client_id, idle)
                self.counters["expired"] += 1
                bye = terminate_frame(ResultCode.FAILED, f"silent for {idle:.0f} s: session ended")
                self.sender.send_rid(peer.rid, tmqp.encode(bye)[0])
                self.drop(peer, now)
            elif not peer.pinged and quiet_until - seen >= opts.ping_interval:
                peer.pinged = True
                peer.reassured_at = now
                self.sender.send_raw(peer, _PING)
            elif (
                now - peer.reassured_at >= opts.ping_interval
                and peer.last_seen > peer.reassured_at
            ):
                # A busy sender hears from us this often too: its own PING waits behind
                # everything it sent before, unread while we read slowly, and a client that
                # heard nothing for its peer_timeout dropped the session and what its
                # socket still held (a poll-on-call producer, loaded CI).
                peer.reassured_at = now
                self.sender.send_raw(peer, _PING)
        if self.ended:
            self._end_orphans(now)
        self._shut_links(now)

    def _shut_links(self, now: float) -> None:
        due = [link for link, when in self.closing.items() if when <= now]
        for link in due:
            del self.closing[link]
            if link.close():
                self.counters["closed"] += 1
        conns = self.connections
        if conns is not None:
            known = set(self.links.values())
            for link in conns.silent(now, self.options.handshake_timeout, known):
                log.debug("connection fd %d said nothing: shut down", link.fd)
                if link.close():
                    self.counters["closed"] += 1

    # -- connections -------------------------------------------------------------------

    def on_connections(self, now: float) -> None:
        """The ROUTER's monitor has news: note the connections that ended."""
        assert self.connections is not None
        for fd in self.connections.drain(now):
            self.ended[fd] = now + _ORPHAN_GRACE + _ENDED_WINDOW

    def _end_orphans(self, now: float) -> None:
        """End the sessions whose connection is gone (at each scan).

        A session belongs to its connection: were it kept, the routing id could come back
        on another connection (libzmq reconnects a DEALER under the same id) and carry
        the session on without a handshake.  A disconnect names a descriptor; the peer
        whose link has that descriptor lost its connection once the descriptor no longer
        names the socket it had (libzmq closes it a moment after the event, and may give
        the number to a new connection).  What the peer sent before the close is still
        being read: its session ends once the ROUTER was read empty after the end was
        noticed (libzmq reports it once the connection's last octets are in its pipe) and
        nothing came from it for ``_ORPHAN_GRACE``.  A loaded machine can stall between
        two reads for longer than the grace; the read-empty rule keeps the session until
        its last messages are in.  A descriptor is watched for ``_ENDED_WINDOW`` after
        that (``_ENDED_LIMIT`` at most while the ROUTER is never read empty).
        """
        ended = self.ended
        emptied = self.emptied_at
        for rid, link in list(self.links.items()):
            until = ended.get(link.fd)
            if until is None or link.is_current():
                continue
            if emptied < until - _ORPHAN_GRACE - _ENDED_WINDOW:
                continue  # what it sent before the end may not all be read yet
            peer = self.by_rid.get(rid)
            if peer is not None and now - peer.last_seen >= _ORPHAN_GRACE:
                log.info("client %s: connection gone, session ended", peer.client_id)
                self.drop(peer, now)
        for fd, until in list(ended.items()):
            noticed = until - _ORPHAN_GRACE - _ENDED_WINDOW
            if (until <= now and emptied >= noticed) or now - noticed >= _ENDED_LIMIT:
                del ended[fd]

    def peers(self) -> dict[str, str]:
        """Connected client ids and their state (call from the serving thread or after stop)."""
        return {p.client_id or repr(p.rid): p.state.value for p in list(self.by_rid.values())}
