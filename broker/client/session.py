"""The sans-IO session core both clients drive: frames and ``now`` in, frames and events out.

No sockets, no threads, no asyncio: the blocking :class:`broker.client.blocking.Client`
and the asyncio :class:`broker.client.aio.AsyncClient` own the I/O and the waiting; this
module owns the protocol.  A driver

* calls :meth:`Session.begin` once, then opens a socket and sends :meth:`Session.hello`
  (again on every :class:`Dial` event, after a backoff);
* hands every octet string the broker sends to :meth:`Session.feed` and calls
  :meth:`Session.tick` when :meth:`Session.next_wake` says a timer is due;
* sends a request with :meth:`Session.start` (a :class:`Call`: a frame and how to read
  its answer) together with a *waiter* of its own (a future of any kind: the core only
  hands it back in :class:`Settled` / :class:`SettledAll` / :class:`Failed`);
* does what the returned events say (:data:`Event`).

The core matches answers to requests by message id, judges them (a failure status is a
:class:`RemoteError`, an answer of the wrong shape a :class:`ProtocolError`), gathers
pull answers and paged lists, times requests out (:class:`RequestTimeout`), answers
PINGs, keeps the session alive, and after a reconnect joins the channels and subscribes
the events again.  Session states::

    HANDSHAKE --connect response--> READY --TERMINATE / silence--> BACKOFF --> HANDSHAKE
        \\--refused (401/406/400) or CURVE denied--> CLOSED (error raised to the caller)
        \\--the connection ended (dropped)--> BACKOFF
    READY --goodbye()--> CLOSING --the broker's TERMINATE (Ended) / linger--> CLOSED

Keep-alive runs both ways.  Anything from the broker proves it alive, and so does the
socket taking frames again after it had been full (:meth:`Session.drained`: the broker
reads what the client sends); silence in both ways for ``peer_timeout`` loses the session.
The client proves itself alive with a PING at least every ``keepalive`` seconds, also
while it is busy receiving: a consumer reading a long stream sends nothing else, and the
broker's PING to it waits behind everything the broker sent before (megaoctets under
load), so answering that PING is no timely proof (the broker ended such sessions as
silent, and what was in flight on a queue without acknowledges was lost).

Closing (:meth:`Session.goodbye`) loses nothing the broker sent: the driver sends the
goodbye, then keeps feeding what arrives until :class:`Ended` (the broker answers a
goodbye with TERMINATE once it ended the session: everything it sent before is read by
then) or its linger runs out.  Meanwhile a delivery that needs an acknowledge is let go
(no ack can follow: the broker puts it back into its queue when the session ends), one
that needs none is delivered as usual (the broker counted it done when it left), and a
direct request is let go (no response can follow).
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from enum import Enum, IntEnum
from typing import Any, cast

from broker import batch, tmqp
from broker.client.admin import next_page
from broker.client.errors import (
    AccessRefused,
    ClientClosed,
    ClientError,
    ConnectError,
    ConnectionLost,
    ProtocolError,
    RemoteError,
    RequestTimeout,
    failure,
)
from broker.client.frames import (
    Joining,
    PushEncoder,
    batch_senders,
    event_frame,
    join_frame,
    pattern_join_frame,
    queue_senders,
)
from broker.client.handover import Handover, Kind
from broker.client.message import Message
from broker.fanout import (
    FANOUT_ENDPOINT,
    FANOUT_SEQ,
    FANOUT_TICKET,
    FANOUT_TOKEN,
    ROTATED,
    SOURCE,
    TOKEN_SIZE,
)
from broker.paging import merge
from broker.protocol import (
    CODE_FOR_NACK_REASON,
    EVENT_NAMES,
    GOODBYE_REASON,
    GREETING,
    ConnectionInfo,
    Header,
    MessageType,
    NoContent,
    Operation,
    ResultCode,
    header,
)
from zproto.errors import DecodeError

log = logging.getLogger("broker.client")

PING = tmqp.encode(tmqp.Ping())[0]
PONG = tmqp.encode(tmqp.Pong())[0]
TERMINATE = tmqp.encode(tmqp.Frame(message_type=MessageType.TERMINATE))[0]
#: The most pages one paged answer may have: a broker naming ever new cursors would
#: otherwise grow the gathered list (and the wait) without end.
MAX_PAGES = 10_000
#: The shortest keep-alive interval (seconds) a broker's announced peer timeout can
#: give a client: a broker announcing a tiny timeout must not make it PING in a loop.
MIN_KEEPALIVE = 0.05
#: Deliveries one message from the broker may carry (``broker.batch``; the connection
#: info's ``Batch-Deliveries`` property, which the caller may set itself, 0: none).
DELIVERY_BATCH = 64
#: Frames one batch of this client holds at most by default (and the broker's ``Batch-Max``).
SEND_BATCH = 256
#: Octets of frames one batch of this client gathers at most.
SEND_BATCH_OCTETS = 1024 * 1024
#: Octets of the largest frame that may share a batch (:meth:`Session.batchable`).
BATCHABLE_OCTETS = 16384
#: Refusals of the connection info that no retry can change.
PERMANENT = frozenset({ResultCode.UNAUTHORIZED, ResultCode.UNACCEPTABLE, ResultCode.BAD_REQUEST})

_QUEUE = MessageType.QUEUE
_ACK = MessageType.ACK
_RESPONSE = MessageType.RESPONSE
_DIRECT = MessageType.DIRECT
_SERVER = MessageType.SERVER
_QUEUE_BITS = int(MessageType.QUEUE)
_ACK_BITS = int(MessageType.ACK)
_DELIVERIES = batch.DELIVERIES
_WAIT = Kind.WAIT  # (a module constant: an Enum member read is a Python call in 3.11)


def _frame_by_id(**given: Any) -> Callable[[str], tmqp.Frame]:
    """A maker of ``tmqp.Frame(**given, message_id=ID)`` called with the id alone: the
    fields before ``message_id`` given by position (their defaults unless in ``given``),
    which costs a third less than the keyword call (~0.35 us a frame)."""
    names = [f.name for f in fields(tmqp.Frame)]
    leading = fields(tmqp.Frame)[: names.index("message_id")]
    if given.keys() - {f.name for f in leading}:
        raise TypeError(f"only fields before message_id: {sorted(given)}")
    return functools.partial(tmqp.Frame, *(given.get(f.name, f.default) for f in leading))


#: The acknowledge of an accepted push in a batch, as its own ACK would read.
ack_frame = _frame_by_id(message_type=_ACK)
_decode = tmqp.decode
_decode_entries = tmqp.decode_entries


def keepalive_interval(ping_interval: float, announced: str | None) -> float:
    """Seconds between a client's PINGs in a session whose connect response said
    ``Peer-Timeout-Ms: announced``: a third of the broker's peer timeout when that is
    shorter than the client's own ``ping_interval`` (so that two PINGs may be lost and
    the session still lives), never below :data:`MIN_KEEPALIVE`.  Without the header (an
    older broker) or with a value that is not a positive whole number, ``ping_interval``.
    """
    if announced is None:
        return ping_interval
    text = announced.strip()
    if not text.isascii() or not text.isdigit() or len(text) > 12 or int(text) == 0:
        log.debug("ignored Peer-Timeout-Ms %r from the broker", announced)
        return ping_interval
    return min(ping_interval, max(MIN_KEEPALIVE, int(text) / 3000))


def session_properties(properties: Mapping[str, str], secret: str | None) -> dict[str, str]:
    """Connection-info properties for a (re)connect: with the session secret, if any.

    The broker gives every session a secret (``Session-Secret`` in its connect answer);
    sent back when reconnecting under the same client id, it proves the connection is
    the same client, which then takes its session over at once.
    """
    props = {k: v for k, v in properties.items() if k.lower() != Header.SESSION_SECRET.lower()}
    if secret:
        props[Header.SESSION_SECRET] = secret
    wanted = batch.BATCH_DELIVERIES.lower()
    if not any(k.lower() == wanted for k in props):  # the caller may set it (0: none)
        props[batch.BATCH_DELIVERIES] = str(DELIVERY_BATCH)
    return props


class SessionState(Enum):
    """The session's state, driven by the core."""

    IDLE = "idle"
    HANDSHAKE = "handshake"
    READY = "ready"
    BACKOFF = "backoff"
    CLOSING = "closing"
    CLOSED = "closed"


class Reply(IntEnum):
    """What a request's answer becomes for its caller."""

    FRAME = 0  # the ACK/RESPONSE frame itself
    MESSAGE = 1  # the answer as a Message (direct requests)
    JSON = 2  # a RESPONSE's JSON payload, every page of it (server operations)
    PULL = 3  # the messages answering a pull request (a list of Message)
    NONE = 4  # nothing (acknowledged pushes, joins, creations)
    DECODED = 5  # a RESPONSE read by the call's ``decode`` (reading by sequence)


@dataclass(frozen=True, slots=True)
class Call:
    """A request: its frame, how its answer is read, and what the core keeps on success."""

    frame: tmqp.Frame
    reply: Reply = Reply.FRAME
    #: where the paged list is in a JSON answer (``broker.paging.merge``)
    path: tuple[str, ...] = ()
    #: run by the core when the request succeeded (remember a join, a subscription)
    on_success: Callable[[Session], None] | None = None
    #: ``Reply.DECODED``: the RESPONSE frame to the caller's value (ValueError: not one)
    decode: Callable[[tmqp.Frame], Any] | None = None


def _asked(pull: tmqp.Frame) -> int:
    """How many messages a pull request asked for (its ``Count`` header)."""
    count = header(pull, Header.COUNT)
    return int(count) if count is not None and count.isdigit() else 1


def _fanout_grant(waiter: Any, channel: str, answer: tmqp.Frame) -> Fanout | None:
    """The fan-out a JOIN's answer (or a token change: ``waiter`` None) granted (None:
    none, or headers that cannot be read)."""
    endpoint = header(answer, FANOUT_ENDPOINT)
    token = header(answer, FANOUT_TOKEN)
    ticket = header(answer, FANOUT_TICKET)
    seq = header(answer, FANOUT_SEQ)
    if endpoint is None or token is None or ticket is None or seq is None:
        return None
    try:
        raw = bytes.fromhex(token)
        claim = bytes.fromhex(ticket)
        number = int(seq)
    except ValueError:
        log.warning("the broker's fan-out grant for %r cannot be read", channel)
        return None
    if len(raw) != TOKEN_SIZE or len(claim) != TOKEN_SIZE or number < 0:
        return None
    return Fanout(waiter, channel, endpoint, raw, number, claim)


def _paged(value: Any, path: tuple[str, ...]) -> bool:
    """Whether ``value`` holds a list at ``path`` (a page of a paged answer must)."""
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return False
        value = value[key]
    return isinstance(value, list)


#: What waits in a driver's outbox: a frame's octets, or an acknowledged push's octets
#: with its message id (:meth:`Session.coalesce` then batches it without reading the id
#: back from the octets).
Queued = bytes | tuple[bytes, str]


def octets(item: Queued) -> bytes:
    """The octets to send of what waits in an outbox."""
    return item if isinstance(item, bytes) else item[0]


# -- events (what the driver must do) -------------------------------------------------


@dataclass(frozen=True, slots=True)
class Send:
    """Send these octets now (PONG, PING, a page request, a re-join after a reconnect)."""

    data: bytes


@dataclass(frozen=True, slots=True)
class Dial:
    """Open a new socket to the broker and send :meth:`Session.hello` on it."""


@dataclass(frozen=True, slots=True)
class Ready:
    """The broker accepted the session (``first``: the first one of this client)."""

    client_id: str
    first: bool


@dataclass(frozen=True, slots=True)
class Deliver:
    """A queue or direct message (or an event nobody subscribed a callback to)."""

    message: Message


@dataclass(frozen=True, slots=True)
class Notify:
    """An event message for the callbacks subscribed to it."""

    message: Message
    callbacks: tuple[Callable[[Message], Any], ...]


@dataclass(frozen=True, slots=True)
class Settled:
    """A request succeeded: complete its waiter with ``value``."""

    waiter: Any
    value: Any


@dataclass(frozen=True, slots=True)
class SettledAll:
    """Several requests succeeded at once (the accepted pushes of a batch's acknowledge):
    complete each waiter with its value, in order.  One event for them all: a
    :class:`Settled` each cost a frozen object and a dispatch per push."""

    settled: list[tuple[Any, Any]]  # (waiter, value)


@dataclass(frozen=True, slots=True)
class Failed:
    """A request failed: fail its waiter with ``error``."""

    waiter: Any
    error: ClientError


@dataclass(frozen=True, slots=True)
class Fanout:
    """A JOIN granted broadcast fan-out (``broker.engine.fanout``): subscribe ``token`` and
    ``ticket`` on a SUB connected to ``endpoint``, then complete ``waiter`` once its
    marker arrives.  ``waiter`` None: the broker replaced the token of a stream this
    client reads (a member left); ``seq`` is the last number of the old token."""

    waiter: Any
    channel: str
    endpoint: str
    token: bytes
    seq: int
    ticket: bytes = b""


@dataclass(frozen=True, slots=True)
class Unfanout:
    """The client left ``channel``: stop reading its fan-out stream."""

    channel: str


@dataclass(frozen=True, slots=True)
class Lost:
    """The session is gone: close the socket (a :class:`Dial` follows after a backoff)."""

    reason: str


@dataclass(frozen=True, slots=True)
class Closed:
    """The session is over for good: close everything and report ``error``."""

    error: ClientError


@dataclass(frozen=True, slots=True)
class Ended:
    """After a goodbye: the broker ended the session; nothing more of it is on its way.

    ``reason`` is empty when it answered the goodbye (TERMINATE status 0 "goodbye"): it
    had read everything the client sent before.  Any other TERMINATE (the broker stopping,
    the session taken over or ended for another cause) says nothing of what it read."""

    reason: str = ""


def resolve(event: Settled | SettledAll | Failed) -> None:
    """Complete the waiter of a request (a ``concurrent.futures`` or ``asyncio`` future),
    or each waiter of a :class:`SettledAll`; one already done (cancelled) is left as it is."""
    if isinstance(event, SettledAll):
        for waiter, value in event.settled:
            if not waiter.done():
                waiter.set_result(value)
        return
    waiter = event.waiter
    if not waiter.done():
        if isinstance(event, Settled):
            waiter.set_result(event.value)
        else:
            waiter.set_exception(event.error)


def notify(event: Notify) -> None:
    """Run the callbacks subscribed to an event (a failing one is logged, not raised)."""
    for callback in event.callbacks:
        try:
            callback(event.message)
        except Exception:
            log.exception("event callback failed")


Event = (
    Send
    | Dial
    | Ready
    | Deliver
    | Notify
    | Settled
    | SettledAll
    | Failed
    | Fanout
    | Unfanout
    | Lost
    | Closed
    | Ended
)
_NONE: tuple[Event, ...] = ()
_ENDED: tuple[Event, ...] = (Ended(),)


@dataclass(slots=True)
class _Pending:
    """A request waiting for its answer."""

    waiter: Any
    deadline: float
    call: Call | None
    timeout: float
    messages: list[Message] = field(default_factory=list)  # pull answers so far
    value: Any = None  # a paged JSON list so far
    seen: set[str] | None = None  # page cursors asked for


class Session:
    """One client's protocol state (see the module docstring)."""

    def __init__(
        self,
        endpoint: str,
        info: ConnectionInfo,
        *,
        timeout: float = 10.0,
        ping_interval: float = 5.0,
        peer_timeout: float = 15.0,
        reconnect: bool = True,
        backoff: tuple[float, float] = (0.05, 5.0),
        batch: int = SEND_BATCH,
    ) -> None:
        self.endpoint = endpoint
        #: Frames one batch of this client may hold at most (0: no batches).
        self.batch_limit = max(0, batch)
        self.info = info
        self.timeout = timeout
        self.ping_interval = ping_interval
        #: Seconds between PINGs in this session (:func:`keepalive_interval`): the
        #: ``ping_interval``, or less if the broker announced a short peer timeout.
        self.keepalive = ping_interval
        self.peer_timeout = peer_timeout
        self.reconnect = reconnect
        self.backoff = backoff
        self.state = SessionState.IDLE
        self.client_id: str | None = info.client_id
        #: The push encoders of this client id (``frames.queue_senders``: by
        #: ``high_priority + 2 * ack``), made at the first push after the id is set
        #: (``push_encoders``).
        self.senders: tuple[PushEncoder, PushEncoder, PushEncoder, PushEncoder] | None = None
        #: The batch frame encoders of this client id (``frames.batch_senders``: by
        #: ``ack``), made with the first batch after the id is set.
        self.batchers: tuple[PushEncoder, PushEncoder] | None = None
        #: The driving thread's buffer for the payload of the batches it coalesces
        #: (``batch.pack_into``): as long as the largest so far, ``SEND_BATCH_OCTETS``
        #: at most.
        self._packed = bytearray()
        #: The broker's secret for this client's session (sent back when reconnecting).
        self.session_secret: str | None = None
        #: Why the session was last lost (while it waits to reconnect).
        self.lost_reason = ""
        #: Set by the driver while it does not read (a full inbox): the core keeps the
        #: session alive with PINGs, since the broker's silence is then the client's own.
        self.paused = False
        self.error: ClientError | None = None
        #: Requests waiting for their answer, by message id, and (``batched``) batches
        #: waiting for their acknowledge: the driving thread's alone.  Callers' threads
        #: register into ``_handed`` (``broker.client.handover``); the driving thread takes
        #: the registrations at each entry (``feed``, ``tick``, ``next_wake``, ``close``).
        self._waiting: dict[str, _Pending] = {}
        self._handed: Handover[_Pending] = Handover()
        self._handed_queue = self._handed.queue
        self.channels: dict[str, Joining] = {}  # joined channel -> what its JOIN asked
        self.patterns: dict[str, int | None] = {}  # joined pattern -> its prefetch
        self.subscriptions: dict[tuple[str, str | None, int | None], None] = {}
        self.handlers: list[tuple[str, str | None, int | None, Callable[[Message], Any]]] = []
        self.first = True
        #: Message ids are ``<prefix><next(counter)>`` (``new_id``; the drivers' fast paths
        #: build them in place: plain attributes, read per push, never set outside).
        self.prefix = f"{random.getrandbits(32):08x}-"
        self.counter = itertools.count(1)
        self._connect_deadline = 0.0
        self._hs_id = ""
        self._hs_deadline = 0.0
        self._attempt = 0
        self._retry_at = 0.0
        self._last_rx = 0.0
        self._pinged = False
        self._keepalive_at = 0.0
        self._next_sweep = 0.0
        #: Frames one batch may hold in this session (the broker's ``Batch-Max``, at most
        #: :data:`SEND_BATCH`; 0: the broker takes no batches).
        self.batch_max = 0
        #: Octets of frames one batch may hold in this session (the broker's
        #: ``Batch-Octets``, at most :data:`SEND_BATCH_OCTETS`).
        self.batch_octets = 0
        #: Batches sent, by id: (index, message id) of each push in it that waits for
        #: an acknowledge, which the batch's one acknowledge settles (driving thread).
        self.batched: dict[str, list[tuple[int, str]]] = {}

    @property
    def pending(self) -> dict[str, _Pending]:
        """(The driving thread) the requests waiting for their answer, by message id,
        registrations taken."""
        self._take()
        return self._waiting

    def _take(self) -> None:
        """Take what callers' threads registered (``broker.client.handover``)."""
        if self._handed_queue:
            self._handed.take(self._waiting, self.batched)

    # -- ids and lifecycle -------------------------------------------------------------

    def new_id(self) -> str:
        return f"{self.prefix}{next(self.counter)}"

    def push_encoders(self) -> tuple[PushEncoder, PushEncoder, PushEncoder, PushEncoder]:
        """The encoders of pushes without headers from this client (``senders``: by
        ``high_priority + 2 * ack``)."""
        if self.senders is None:
            self.senders = queue_senders(self.client_id or "")
        return self.senders

    def begin(self, now: float, connect_timeout: float) -> None:
        """The first connection starts: it must be accepted within ``connect_timeout``."""
        self._connect_deadline = now + connect_timeout

    def hello(self, now: float) -> list[bytes]:
        """The greeting and the connection info, for a freshly opened socket."""
        self._hs_id = self.new_id()
        info = ConnectionInfo(
            client_id=self.client_id,
            name=self.info.name,
            type=self.info.type,
            token=self.info.token,
            properties=session_properties(self.info.properties, self.session_secret),
        )
        frame = info.to_frame(self._hs_id).replace(pending_response=True)
        self.state = SessionState.HANDSHAKE
        self._hs_deadline = now + self.peer_timeout
        return [GREETING, tmqp.encode(frame)[0]]

    def goodbye(self) -> bytes:
        """The frame that ends the session: send it, then feed what arrives until
        :class:`Ended` or the linger runs out (see the module docstring), then close."""
        self.state = SessionState.CLOSING
        return TERMINATE

    @staticmethod
    def unanswerable(message: Message, state: SessionState) -> bool:
        """Whether ``message`` waits for an acknowledge or response that can no longer be
        sent (the session is closing or closed), so the client must not hand it out: a
        queue message goes back to its queue when the session ends (handed out, it would
        be handled twice); a direct request's sender gets no answer, as if the client had
        closed a moment earlier."""
        if state is not SessionState.CLOSING and state is not SessionState.CLOSED:
            return False  # (first: a fan-out frame's flags are decoded when first read)
        frame = message.frame
        return frame.pending_ack or frame.pending_response

    def close(self, error: ClientError) -> list[Failed]:
        """The driver is closing: fail every waiter with ``error`` (or the earlier one)."""
        self.state = SessionState.CLOSED
        if self.error is None:
            self.error = error
        return self._fail_all(self.error)

    def fatal(self, error: ClientError) -> list[Event]:
        """End for good: a refusal, a denied CURVE handshake, no answer in time."""
        self.state = SessionState.CLOSED
        self.error = error
        events: list[Event] = [*self._fail_all(error), Closed(error)]
        return events

    def closed_error(self) -> ClientError:
        """What a call made now fails with."""
        if self.state is SessionState.HANDSHAKE or self.state is SessionState.BACKOFF:
            return ConnectionLost(f"not connected now ({self.lost_reason}); reconnecting")
        return self.error or ClientClosed("client is closed")

    # -- requests ----------------------------------------------------------------------

    def start(self, call: Call, waiter: Any, now: float, timeout: float | None = None) -> bytes:
        """Register ``call`` (its answer goes to ``waiter``); the octets to send."""
        mid = call.frame.message_id
        if not mid:
            raise ValueError("a request needs a message id")
        wait = self.timeout if timeout is None else timeout
        self._handed.wait(mid, _Pending(waiter, now + wait, call, wait))
        return tmqp.encode(call.frame)[0]

    def expect(self, message_id: str, waiter: Any, now: float, timeout: float | None) -> None:
        """Register an answer to a frame the driver encoded itself (a plain ACK/RESPONSE)."""
        wait = self.timeout if timeout is None else timeout
        # (``Handover.wait`` inline, on its public queue: one per acknowledged push)
        self._handed_queue.append((_WAIT, message_id, _Pending(waiter, now + wait, None, wait)))

    def cancel(self, message_id: str) -> None:
        """Forget a request (its send failed, or its caller gave up)."""
        self._handed.forget(message_id)

    # -- inbound -----------------------------------------------------------------------

    def dropped(self, now: float) -> list[Event]:
        """The driver saw the connection end (its socket monitor) before the broker
        answered the connection info: that connection carried the greeting and the
        connection info, and with it they (or the answer) are gone; libzmq dials again
        on its own but sends nothing again.  A broker that read them as it stopped (its
        ROUTER closing) never answers, and waiting for the handshake's deadline (the
        peer timeout) would keep the client away that long: the session is lost, and a
        new socket says hello again after the backoff.  In any other state: nothing."""
        if self.state is not SessionState.HANDSHAKE:
            return []
        return self.lost("the connection ended before the broker answered", now)

    def heard(self, now: float) -> None:
        """Something arrived (the driver's fast path took it): the broker is alive."""
        self._last_rx = now
        self._pinged = False

    def drained(self, now: float) -> None:
        """The socket takes frames again after it had been full: the broker is reading
        what this client sends, so it is alive even if nothing came back (a producer's
        PING waits behind every push before it, megaoctets on a loaded machine)."""
        self._last_rx = now
        self._pinged = False

    def feed(self, data: bytes, now: float) -> Sequence[Event]:
        """One message from the broker; what to do about it."""
        if self._handed_queue:  # (registered before their frames left: taken first)
            self._handed.take(self._waiting, self.batched)
        self._last_rx = now
        self._pinged = False
        try:
            msg = _decode((data,))
        except DecodeError as exc:
            if data != GREETING:
                log.warning("undecodable frame from the broker: %s", exc.reason)
            return _NONE
        return self._received(msg, now)

    def _received(self, msg: tmqp.Message, now: float) -> Sequence[Event]:
        """What to do about one decoded message from the broker."""
        if type(msg) is not tmqp.Frame:
            if self.state is SessionState.CLOSING:
                return _NONE
            return (Send(PONG),) if type(msg) is tmqp.Ping else _NONE
        if msg.message_type == _SERVER and msg.content_type == _DELIVERIES:
            return self._deliveries(msg, now)
        if self.state is SessionState.CLOSING:
            return self._closing(msg, now)
        mt = msg.message_type
        if mt == _QUEUE:
            if msg.headers:
                pulled = self._pulled(msg, now)
                if pulled is not None:
                    return pulled
            return (Deliver(Message(msg)),)
        if mt in (_ACK, _RESPONSE):
            return self._settle(msg, now)
        if mt == _DIRECT:
            if msg.content_type == ROTATED and msg.source == SOURCE:
                return self._rotated(msg)
            return (Deliver(Message(msg)),)
        if mt == MessageType.EVENT:
            return self._event(msg)
        if mt == MessageType.TERMINATE:
            return self._terminated(msg, now)
        if mt == MessageType.PING:
            return (Send(PONG),)
        if mt != MessageType.PONG:
            log.debug("ignored frame type %#x from the broker", mt)
        return _NONE

    def _rotated(self, msg: tmqp.Frame) -> Sequence[Event]:
        """A fan-out stream's new token (``broker.engine.fanout``: a member left)."""
        channel = header(msg, Header.CHANNEL_NAME) or ""
        grant = _fanout_grant(None, channel, msg)
        if grant is None:
            log.warning("an unreadable fan-out token change for %r", channel)
            return _NONE
        return (grant,)

    def _deliveries(self, msg: tmqp.Frame, now: float) -> Sequence[Event]:
        """Several deliveries in one message (``broker.batch``): each as if alone (decoded
        where it lies, ``tmqp.decode_entries``; one that does not decode is logged and
        the others are read)."""
        events: list[Event] = []
        try:
            frames = _decode_entries(msg.payload, batch.DEFAULT_MAX_FRAMES)
        except DecodeError:
            try:
                entries = batch.unpack(msg.payload, batch.DEFAULT_MAX_FRAMES)
            except batch.BatchError as exc:
                log.warning("unreadable batch of deliveries from the broker: %s", exc)
                return _NONE
            for data in entries:
                events += self.feed(data, now)
            return events
        for one in frames:
            events += self._received(one, now)
        return events

    # -- batches (broker.batch) ----------------------------------------------------------

    @staticmethod
    def batchable(data: bytes) -> bool:
        """Whether a frame waiting in the outbox may share a batch with its neighbours:
        a push waiting for an acknowledge (not a response), or an acknowledge, of at most
        16 KiB.  Those are bounded by what their sender waits for (its acknowledges, its
        prefetch); a fire-and-forget push travels alone unless the caller asked for a
        batch (``push_many``): the pipes' high-water marks count ZeroMQ messages, and
        batched they would let a producer run that much further ahead of the broker."""
        if len(data) < 8 or len(data) > BATCHABLE_OCTETS:
            return False
        kind = data[0] & 63
        if kind == _QUEUE_BITS:
            return data[1] & 192 == 64
        return kind == _ACK_BITS and not data[1] & 192

    def batches(self, entries: Sequence[bytes]) -> list[bytes]:
        """``entries`` (pushes, acknowledges) as batch frames within this session's
        limits; as they are when the broker takes no batches."""
        limit, octets = self.batch_max, self.batch_octets
        if limit < 2 or len(entries) < 2:
            return list(entries)
        out: list[bytes] = []
        chunk: list[bytes] = []
        size = 0
        for data in entries:
            if chunk and (len(chunk) >= limit or size + len(data) + 4 > octets):
                out.append(self.batch_of(chunk) if len(chunk) > 1 else chunk[0])
                chunk, size = [], 0
            chunk.append(data)
            size += len(data) + 4
        if chunk:
            out.append(self.batch_of(chunk) if len(chunk) > 1 else chunk[0])
        return out

    def batch_of(self, entries: Sequence[bytes]) -> bytes:
        """One batch frame carrying ``entries`` (frames :meth:`batchable` allowed); the
        acknowledged pushes in it are settled by its one acknowledge."""
        acked = [
            (i, tmqp.peek_message_id(d) or "")
            for i, d in enumerate(entries)
            if d[0] & 63 == _QUEUE_BITS and d[1] & 64
        ]
        return self._batch_frame(batch.pack(entries), acked)

    def coalesce(self, frames: Sequence[Queued]) -> tuple[bytes, int]:
        """The frames at the head of ``frames`` (an outbox) that may share a batch
        (:meth:`batchable`; at most ``batch_max`` of them, their entries at most
        ``batch_octets``) as one batch frame, and how many it took; the first frame as
        it is and 1 when fewer than two may.  One pass (what :meth:`batchable` and
        :meth:`batch_of` do, for each frame at once: a sender's hot path).  An
        acknowledged push queued with its message id (:data:`Queued`) is taken with that
        id; one queued alone has it read from its octets."""
        entries: list[bytes] = []
        add = entries.append
        acked: list[tuple[int, str]] = []
        peek = tmqp.peek_message_id
        room = self.batch_octets
        taken = 0
        for item in itertools.islice(frames, self.batch_max):
            if isinstance(item, tuple):
                data, mid = item
            else:
                data, mid = item, None
            size = len(data)
            room -= size + 4
            if size < 8 or size > BATCHABLE_OCTETS or room < 0:
                break
            kind = data[0] & 63
            if kind == _QUEUE_BITS:
                if data[1] & 192 != 64:
                    break  # (a fire-and-forget push, or one awaiting a response)
                acked.append((taken, (peek(data) or "") if mid is None else mid))
            elif kind != _ACK_BITS or data[1] & 192:
                break
            add(data)
            taken += 1
        if taken < 2:
            return (entries[0] if taken else octets(frames[0])), 1
        with batch.pack_into(self._packed, entries) as payload:
            return self._batch_frame(payload, acked), taken

    def _batch_frame(self, payload: bytes | memoryview, acked: list[tuple[int, str]]) -> bytes:
        """The batch frame of the packed entries ``payload`` (``batch.pack``, or a view
        of ``batch.pack_into``'s buffer: the encoder takes its length and joins it),
        whose ``acked`` (index, message id) await its acknowledge (registered here)."""
        bid = self.new_id()
        if acked:
            self._handed.batch(bid, acked)
        encoders = self.batchers
        if encoders is None:
            encoders = self.batchers = batch_senders(self.client_id or "")
        return encoders[bool(acked)](batch.BATCH, bid, "", cast(bytes, payload))[0]

    def _batch_settled(self, frame: tmqp.Frame, now: float) -> Sequence[Event]:
        """The acknowledge of a batch: each acknowledged push in it settled as its own
        acknowledge would have (a refused one fails; a 'later' one keeps waiting)."""
        inner = self.batched.pop(frame.message_id)
        err: ClientError | None = failure(frame)
        if err is None and frame.message_type == _RESPONSE:
            err = ProtocolError(f"a response answered the batch {frame.message_id}")
        refused: dict[int, tuple[str, str]] = {}
        later: set[int] = set()
        if err is None:
            try:
                rows, waits = batch.result_of(frame)
            except ValueError as exc:
                err = ProtocolError(f"the acknowledge of batch {frame.message_id}: {exc}")
            else:
                refused = {i: (nack, reason) for i, nack, reason in rows}
                later = set(waits)
        events: list[Event] = []
        append = events.append
        pending = self._waiting
        # the accepted ones in a row, settled by one event (in order with the others)
        settled: list[tuple[Any, Any]] = []
        add = settled.append
        make_ack = ack_frame
        for index, mid in inner:
            if err is not None:
                entry = pending.pop(mid, None)
                if entry is not None:
                    append(Failed(entry.waiter, err))
                continue
            if index in later or mid not in pending:
                continue
            why = refused.get(index) if refused else None
            if why is None:
                # accepted: what ``_settle`` makes of a plain ACK, without the detour
                entry = pending.pop(mid)
                call = entry.call
                if call is None or call.reply is Reply.FRAME:
                    add((entry.waiter, make_ack(mid)))
                    continue
                if (
                    call.reply is Reply.NONE
                    and call.on_success is None
                    and call.frame.message_type == _QUEUE
                ):
                    add((entry.waiter, None))
                    continue
                pending[mid] = entry  # (anything else: as its own acknowledge would be)
                headers: tuple[tuple[str, str], ...] = ()
            else:
                headers = ((Header.NACK_REASON, why[0]), (Header.REASON, why[1] or why[0]))
            if settled:
                append(SettledAll(settled))
                settled = []
                add = settled.append
            one = tmqp.Frame(message_type=_ACK, message_id=mid, headers=headers)
            events += self._settle(one, now)
        if settled:
            append(SettledAll(settled))
        return events

    def _closing(self, msg: tmqp.Frame, now: float) -> Sequence[Event]:
        """A frame after the goodbye (see the module docstring)."""
        mt = msg.message_type
        if mt == MessageType.TERMINATE:
            reason = header(msg, Header.REASON) or "no reason given"
            if msg.content_type == ResultCode.OK and reason == GOODBYE_REASON:
                return _ENDED
            return (Ended(f"{reason} (status {msg.content_type})"),)
        if mt in (_QUEUE, _DIRECT):
            if msg.pending_ack or msg.pending_response:
                return _NONE  # let go: the broker puts a queue message back
            if msg.content_type == ROTATED and msg.source == SOURCE:
                return _NONE  # (a fan-out token change: no stream is read any more)
            if mt == _QUEUE and msg.headers:
                pulled = self._pulled(msg, now)
                if pulled is not None:
                    return pulled
            return (Deliver(Message(msg)),)
        if mt in (_ACK, _RESPONSE):
            return self._settle(msg, now)
        if mt == MessageType.EVENT:
            return self._event(msg)
        return _NONE  # PING, PONG: the session is ending

    def _settle(self, frame: tmqp.Frame, now: float) -> Sequence[Event]:
        mid = frame.message_id
        if self.state is SessionState.HANDSHAKE and mid == self._hs_id:
            err = failure(frame)
            if err is None:
                return self._ready(frame, now)
            return self._refused(err.code, err.reason, now)
        if self.batched and mid in self.batched:
            return self._batch_settled(frame, now)
        entry = self._waiting.pop(mid, None)
        if entry is None:
            err = failure(frame)
            if err is not None:
                log.warning("broker reported for %r: %s", mid, err)
            else:
                log.debug("an answer to no request of this client: %r", mid)
            return _NONE
        err = failure(frame)
        if err is not None:
            return (Failed(entry.waiter, err),)
        call = entry.call
        if call is None or call.reply is Reply.FRAME:
            return (Settled(entry.waiter, frame),)
        kind = call.reply
        if kind is Reply.NONE:
            value: Any = None
        elif kind is Reply.MESSAGE:
            value = Message(frame)
        elif frame.message_type != _RESPONSE:
            what = "pull" if kind is Reply.PULL else "server operation"
            return (Failed(entry.waiter, ProtocolError(f"an ACK answered the {what} {mid}")),)
        elif kind is Reply.PULL:
            value = [Message(frame)]  # a cache queue answers with a response
        elif kind is Reply.DECODED:
            assert call.decode is not None
            try:
                value = call.decode(frame)
            except ValueError as exc:
                bad = ProtocolError(f"the broker's answer to {mid} cannot be read: {exc}")
                return (Failed(entry.waiter, bad),)
        else:
            return self._page(entry, frame, now)
        if call.on_success is not None:
            call.on_success(self)
        if kind is Reply.NONE and call.frame.message_type == MessageType.SERVER:
            op = call.frame.content_type
            if op == Operation.JOIN and frame.headers:
                grant = _fanout_grant(entry.waiter, call.frame.target, frame)
                if grant is not None:
                    return (grant,)
            elif op == Operation.LEAVE and not call.frame.headers:
                return (Unfanout(call.frame.target), Settled(entry.waiter, value))
        return (Settled(entry.waiter, value),)

    def _page(self, entry: _Pending, reply: tmqp.Frame, now: float) -> Sequence[Event]:
        """One page of a JSON answer: the next page's request, or the whole value."""
        call = entry.call
        assert call is not None
        try:
            value = json.loads(reply.payload) if reply.payload else None
            more = header(reply, Header.PAGE_NEXT) is not None
            if (more or entry.seen is not None) and not _paged(value, call.path):
                raise ProtocolError(f"a page of the answer to {reply.message_id} holds no list")
            if entry.seen is None:
                entry.value, entry.seen = value, set()
            else:
                merge(entry.value, value, call.path)
            if more and len(entry.seen) >= MAX_PAGES:
                raise ProtocolError(f"the answer to {reply.message_id} has over {MAX_PAGES} pages")
            request = next_page(call.frame, reply, self.new_id(), entry.seen)
        except ClientError as exc:
            return (Failed(entry.waiter, exc),)
        except ValueError as exc:  # not JSON, not UTF-8
            err = ProtocolError(f"the broker's answer to {reply.message_id} is not JSON: {exc}")
            return (Failed(entry.waiter, err),)
        if request is None:
            if call.on_success is not None:
                call.on_success(self)
            return (Settled(entry.waiter, entry.value),)
        entry.call = Call(request, call.reply, call.path, call.on_success)
        entry.deadline = now + entry.timeout
        self._waiting[request.message_id] = entry
        return (Send(tmqp.encode(request)[0]),)

    def _pulled(self, frame: tmqp.Frame, now: float) -> Sequence[Event] | None:
        """Route a message answering a pull request; None if it is an ordinary delivery."""
        request = header(frame, Header.REQUEST_ID)
        if request is None:
            return None
        entry = self._waiting.get(request)
        no_content = header(frame, Header.NO_CONTENT)
        if entry is None or entry.call is None or entry.call.reply is not Reply.PULL:
            # a late End marker is dropped; real messages are delivered
            return _NONE if no_content is not None else None
        if no_content is None:
            if len(entry.messages) >= _asked(entry.call.frame):
                del self._waiting[request]
                err = ProtocolError(f"the broker sent more messages than pull {request} asked")
                return (Failed(entry.waiter, err),)
            entry.messages.append(Message(frame))
            entry.deadline = now + entry.timeout  # the answer is coming
            index, count = header(frame, Header.INDEX), header(frame, Header.COUNT)
            if index is None or index != count:
                return _NONE
        elif no_content not in (NoContent.END, NoContent.EMPTY):
            del self._waiting[request]
            code = CODE_FOR_NACK_REASON.get(no_content.lower(), ResultCode.NOT_FOUND)
            if no_content == NoContent.UNAUTHORIZED:
                code = ResultCode.UNAUTHORIZED
            reason = header(frame, Header.REASON) or no_content
            return (Failed(entry.waiter, RemoteError(int(code), reason)),)
        del self._waiting[request]
        return (Settled(entry.waiter, entry.messages),)

    def _event(self, frame: tmqp.Frame) -> Sequence[Event]:
        name: str = frame.target if frame.target in EVENT_NAMES else frame.source
        channel = header(frame, Header.CHANNEL_NAME)
        queue = header(frame, Header.QUEUE_ID)
        callbacks = tuple(
            callback
            for event, want_channel, want_queue, callback in self.handlers
            if event == name
            and (want_channel is None or channel is None or want_channel == channel)
            and (want_queue is None or queue is None or str(want_queue) == queue)
        )
        message = Message(frame)
        return (Notify(message, callbacks),) if callbacks else (Deliver(message),)

    def _terminated(self, frame: tmqp.Frame, now: float) -> Sequence[Event]:
        code = frame.content_type
        reason = header(frame, Header.REASON) or "no reason given"
        if self.state is SessionState.HANDSHAKE:
            return self._refused(code, reason, now)
        return self.lost(f"the broker ended the session: {reason} (status {code})", now)

    def _refused(self, code: int, reason: str, now: float) -> list[Event]:
        """The broker turned down the connection info.

        A client id in use by another session (481) is final for the first connect; a
        reconnect keeps trying (the session holding the id may still end).
        """
        if code in PERMANENT or (code == ResultCode.ALREADY_CREATED and self.first):
            kind = AccessRefused if code == ResultCode.UNAUTHORIZED else ConnectError
            return self.fatal(kind(f"the broker refused the connection: {reason} (status {code})"))
        return self.lost(f"connection refused for now: {reason} (status {code})", now)

    def _ready(self, frame: tmqp.Frame, now: float) -> list[Event]:
        client_id = header(frame, Header.CLIENT_ID) or frame.target or self.client_id or ""
        if client_id != self.client_id:
            self.senders = None
            self.batchers = None
        self.client_id = client_id
        self.session_secret = header(frame, Header.SESSION_SECRET)
        self.keepalive = keepalive_interval(
            self.ping_interval, header(frame, Header.PEER_TIMEOUT_MS)
        )
        self.state = SessionState.READY
        announced = header(frame, batch.BATCH_MAX)
        self.batch_max = (
            min(int(announced), self.batch_limit) if announced and announced.isdigit() else 0
        )
        octets = header(frame, batch.BATCH_OCTETS)
        self.batch_octets = (
            min(int(octets), SEND_BATCH_OCTETS) if octets and octets.isdigit() else 0
        )
        self._attempt = 0
        self._last_rx = now
        self._pinged = False
        self._keepalive_at = now + self.keepalive
        events: list[Event] = []
        if not self.first:
            # a new session: join the channels and subscribe the events again (unawaited)
            for name, j in self.channels.copy().items():
                frame = join_frame(
                    self.new_id(), name, j.prefetch, selector=j.selector, credit=j.credit
                )
                events.append(Send(tmqp.encode(frame)[0]))
            for pattern, prefetch in self.patterns.copy().items():
                frame = pattern_join_frame(self.new_id(), pattern, prefetch)
                events.append(Send(tmqp.encode(frame)[0]))
            for event, channel, queue_id in list(self.subscriptions):
                frame = event_frame(self.new_id(), event, True, channel, queue_id)
                events.append(Send(tmqp.encode(frame)[0]))
        events.append(Ready(client_id, self.first))
        self.first = False
        return events

    # -- time --------------------------------------------------------------------------

    def next_wake(self, now: float) -> float:
        """Seconds until :meth:`tick` has something to do (at most one)."""
        self._take()
        wake = now + 1.0
        state = self.state
        if state is SessionState.HANDSHAKE:
            wake = min(wake, self._hs_deadline)
        elif state is SessionState.BACKOFF:
            wake = min(wake, self._retry_at)
        elif state is SessionState.READY:
            if self.paused:
                wake = min(wake, self._keepalive_at)
            elif self._pinged:  # a probe is out: next, giving up on the silence
                wake = min(wake, self._last_rx + self.peer_timeout)
            else:
                wake = min(wake, self._last_rx + self.keepalive, self._keepalive_at)
        if self.first:
            wake = min(wake, self._connect_deadline)
        if self._waiting:
            wake = min(wake, self._next_sweep)
        return max(0.0, wake - now)

    def tick(self, now: float) -> list[Event]:
        """The timers: connect deadline, keep-alive, silence, backoff, request deadlines."""
        self._take()
        state = self.state
        events: list[Event] = []
        if state is SessionState.CLOSED:
            return events
        if self.first and state is not SessionState.READY and now >= self._connect_deadline:
            return self.fatal(ConnectError(f"no answer from {self.endpoint} within the timeout"))
        if state is SessionState.READY:
            if self.paused:
                # Not reading (full inbox): the broker's silence is ours.  Tell it we are
                # alive, or it would end the session it cannot reach.
                self._last_rx = now
                if now >= self._keepalive_at:
                    self._keepalive_at = now + self.keepalive
                    events.append(Send(PING))
            idle = now - self._last_rx
            if idle >= self.peer_timeout:
                events.extend(self.lost(f"no traffic from the broker for {idle:.1f} s", now))
            elif idle >= self.keepalive:
                if not self._pinged:  # one probe per silence
                    self._pinged = True
                    self._keepalive_at = now + self.keepalive
                    events.append(Send(PING))
            elif now >= self._keepalive_at:
                # Hearing from the broker, but it may not hear from us: a busy reader
                # sends nothing else, and the broker's PING waits behind its deliveries.
                self._keepalive_at = now + self.keepalive
                events.append(Send(PING))
        elif state is SessionState.HANDSHAKE and now >= self._hs_deadline:
            events.extend(self.lost("handshake timed out", now))
        elif state is SessionState.BACKOFF and now >= self._retry_at:
            events.append(Dial())
        if now >= self._next_sweep:
            self._next_sweep = now + 0.25
            events.extend(self._sweep(now))
        return events

    def _sweep(self, now: float) -> list[Event]:
        events: list[Event] = []
        # (iterated in place: the driving thread's own dicts, which callers' threads never
        # write -- they register through ``_handed``, taken by ``tick`` before this)
        waiting = self._waiting
        for mid in [mid for mid, entry in waiting.items() if entry.deadline <= now]:
            entry = waiting.pop(mid)
            what = f"no answer from the broker to {mid} within {entry.timeout} s"
            events.append(Failed(entry.waiter, RequestTimeout(what)))
        batched = self.batched
        if batched:  # batches none of whose pushes waits any more
            done = [bid for bid, inner in batched.items()
                    if not any(mid in waiting for _i, mid in inner)]  # fmt: skip
            for bid in done:
                del batched[bid]
        return events

    def lost(self, reason: str, now: float) -> list[Event]:
        """The session is gone: fail what waits, then reconnect after a backoff (or stop)."""
        log.info("session lost: %s", reason)
        err = ConnectionLost(reason)
        if not self.reconnect and not self.first:
            return self.fatal(err)
        events: list[Event] = [*self._fail_all(err)]
        low, high = self.backoff
        delay = min(high, low * (2**self._attempt)) * (0.5 + random.random() / 2)
        self._attempt += 1
        self._retry_at = now + delay
        self.lost_reason = reason
        self.state = SessionState.BACKOFF
        events.append(Lost(reason))
        return events

    def _fail_all(self, err: ClientError) -> list[Failed]:
        self._take()
        self.batched.clear()
        events: list[Failed] = []
        for mid in list(self._waiting):
            entry = self._waiting.pop(mid, None)
            if entry is not None:
                events.append(Failed(entry.waiter, err))
        return events
