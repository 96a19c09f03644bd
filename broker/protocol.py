"""TMQP vocabulary shared by the broker engine, server and client (no I/O).

Message types, server operation codes (content types), response status codes,
queue statuses, well-known header names, and the connection-info message that
opens every session.  Values follow ../shared/specs/twino-mq-3.0.md; where the
document leaves a gap (channel update) zerohub picks the next free code.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from itertools import repeat
from typing import NamedTuple, overload

from broker import tmqp
from broker.message import Headers, Message

#: The 8-octet greeting; one ZeroMQ message each way before anything else.
GREETING = b"TMQP/2.0"
DEFAULT_ENDPOINT = "tcp://127.0.0.1:5680"
#: The ``Reason`` of the broker's answer to a client's TERMINATE (status 0): the session
#: ended after the broker read everything the client sent before it.
GOODBYE_REASON = "goodbye"
DEFAULT_TTL = tmqp.DEFAULT_TTL
MAX_TTL = tmqp.MAX_TTL


class MessageType(IntEnum):
    """Low 6 bits of the first frame octet."""

    CUSTOM = 0x00
    TERMINATE = 0x08
    PING = 0x09
    PONG = 0x0A
    SERVER = 0x10  # server operation (RPC style)
    QUEUE = 0x11  # queue message (push into / deliver from a queue)
    DIRECT = 0x12  # direct message between clients
    ACK = 0x13  # acknowledge / negative acknowledge
    RESPONSE = 0x14  # response to any message
    PULL = 0x15  # queue pull request
    EVENT = 0x16  # event subscribe/unsubscribe, or event notification
    ROUTER = 0x17  # publish through a router


class Operation(IntEnum):
    """Content types of server operation messages."""

    CHANNEL_CREATE = 101
    CONNECT = 101  # alias: the connection-info message (first frame after the greeting)
    CHANNEL_UPDATE = 102  # not numbered in the document; zerohub's choice
    CHANNEL_DELETE = 103
    CHANNEL_LIST = 104
    CHANNEL_INFO = 105
    JOIN = 110
    LEAVE = 111
    QUEUE_CREATE = 201
    QUEUE_UPDATE = 202
    QUEUE_DELETE = 203
    QUEUE_LIST = 204
    QUEUE_INFO = 205
    QUEUE_PURGE = 220  # zerohub: remove a queue's waiting messages (needs QUEUE_UPDATE)
    NODE_LIST = 301
    CLIENT_LIST = 302
    #: zerohub: reading a queue by sequence number (``broker.sequence``): the bounds
    #: (JSON ``{"First": n, "Last": n}``), a browse (binary, see ``broker.sequence``) and
    #: a release (JSON ``{"Released": n}``); headers ``Queue-Id`` and ``From-Seq``/
    #: ``Limit`` (browse) or ``Through-Seq`` (release).
    QUEUE_BOUNDS = 206
    QUEUE_BROWSE = 207
    QUEUE_RELEASE = 208
    #: zerohub: a queue's trash (``broker.engine.queue.trash``): list (binary, as a
    #: browse; each message with a ``Trash-Reason`` header), resubmit to the queue and
    #: purge (JSON ``{"Resubmitted": n}`` / ``{"Purged": n}``); header ``Sequences``
    #: (comma-separated sequence numbers; absent: every message in the trash).
    TRASH_LIST = 210
    TRASH_RESUBMIT = 211
    TRASH_PURGE = 212
    #: zerohub: durable subscriptions (``broker.engine.dsubs``): create or update (target
    #: = id, JSON ``{"Topics": [channel, ...]}``), destroy (target = id), list (JSON).
    DSUB_CREATE = 230
    DSUB_DESTROY = 231
    DSUB_LIST = 232
    STATS = 901  # zerohub: broker-wide counters as JSON (needs the ADMIN permission)


#: zerohub: content type of a receipt (``broker.engine.receipts``), a direct message the
#: broker sends a producer that asked for one with header ``Receipt: ONE|ALL``.
RECEIPT_CONTENT_TYPE = 233


class ResultCode(IntEnum):
    """Content type of responses and acknowledges: 0 success, else a status code."""

    OK = 0
    FAILED = 1
    BAD_REQUEST = 400
    UNAUTHORIZED = 401
    NOT_FOUND = 404
    UNACCEPTABLE = 406
    ALREADY_CREATED = 481
    LIMIT_EXCEEDED = 482
    BUSY = 503
    SEND_ERROR = 581


class QueueStatus(IntEnum):
    """ChannelQueueOptions.Status values."""

    BROADCAST = 0
    PUSH = 1
    ROUND_ROBIN = 2
    PULL = 3
    CACHE = 4
    PAUSED = 5
    STOPPED = 6


class Header:
    """Well-known header names."""

    CLIENT_ID = "Client-Id"
    CLIENT_NAME = "Client-Name"
    CLIENT_TYPE = "Client-Type"
    CLIENT_TOKEN = "Client-Token"
    QUEUE_ID = "Queue-Id"
    CHANNEL_NAME = "Channel-Name"
    CC = "CC"
    NACK_REASON = "Nack-Reason"
    #: zerohub: ``Put-Back: no`` on a negative acknowledge of a queue delivery: do not put
    #: the message back whatever the queue's delivery handler says; it goes to the queue's
    #: trash with the nack reason (a dead letter, ``broker.engine.queue.acks``).
    PUT_BACK = "Put-Back"
    REQUEST_ID = "Request-Id"
    INDEX = "Index"
    COUNT = "Count"
    CLEAR = "Clear"
    ORDER = "Order"
    INFO = "Info"
    NO_CONTENT = "No-Content"
    PRIORITY_MESSAGES = "Priority-Messages"
    MESSAGES = "Messages"
    REASON = "Reason"
    #: zerohub: on a JOIN, the most deliveries of each of the channel's queues this client
    #: takes in flight (unacknowledged, or not yet on its socket); see ``broker.flow``.
    PREFETCH = "Prefetch"
    #: zerohub: ``Pattern: yes`` on a JOIN or LEAVE: the target is a channel-name pattern
    #: (``broker.engine.patterns``: ``.`` segments, ``*``, ``**``, ``{regex}``), joining
    #: every channel it matches, now and as they are created; anywhere else: refused.
    PATTERN = "Pattern"
    #: zerohub: on a JOIN, an SQL-92 selector over the headers of the channel's messages
    #: (``broker.selector``): this consumer is offered only the messages it selects
    #: (``broker.engine.join_rules``; the queues must use the per-message handler).
    SELECTOR = "Selector"
    #: zerohub: on a JOIN, ``COUNT,SIZE``: credit windows -- at most COUNT unacknowledged
    #: deliveries and SIZE payload octets, given back by their acknowledges (a delivery
    #: goes while either window is above zero; ``broker.engine.per_message``).
    CREDIT = "Credit"
    #: zerohub: on a push to a Broadcast queue, ``set`` (or ``true``) keeps the message as
    #: its channel's retained one, ``remove`` forgets it; a client joining the channel
    #: later gets it first (``broker.engine.retain``).  Elsewhere the push is refused.
    RETAIN = "Retain"
    #: zerohub: on a queue message sent again (after a consumer went away, a nack or an
    #: acknowledge timeout), the number of this delivery (2 for the first redelivery).
    DELIVERY_COUNT = "Delivery-Count"
    #: zerohub: beside ``Delivery-Count`` on a message sent again: ``true`` (the message
    #: may have been seen before; also after a broker restart, on persistent queues).
    REDELIVERED = "Redelivered"
    #: Issued in the connect response; a client reconnecting under its id sends it back
    #: as a connection-info property to prove it owns the session (see broker.server.peers).
    SESSION_SECRET = "Session-Secret"
    #: zerohub: a connection-info property, the secret that lets this broker's own
    #: federation client use its reserved client id (see broker.engine.federated).
    FEDERATION_SECRET = "Federation-Secret"
    #: zerohub: issued in the connect response, the broker's peer timeout in whole
    #: milliseconds (a session silent this long is ended).  Clients PING at a third of it
    #: at most, while they do not read too; absent (older brokers): their own interval.
    PEER_TIMEOUT_MS = "Peer-Timeout-Ms"
    #: Paged list replies (see broker.paging): the request's "after this key", and the
    #: reply's key to ask the next page with.
    PAGE_AFTER = "Page-After"
    PAGE_NEXT = "Page-Next"
    #: zerohub: reading by sequence (``broker.sequence``): where a browse starts (a
    #: sequence number, 0 the first held, -1 after the last), how many it returns at
    #: most, and up to which sequence number a release removes.
    FROM_SEQ = "From-Seq"
    LIMIT = "Limit"
    THROUGH_SEQ = "Through-Seq"
    SEQUENCES = "Sequences"
    #: zerohub: on a message listed from a queue's trash, why it is there (``expired``,
    #: ``put-back-limit``, or the nack reason of a delivery not put back).
    TRASH_REASON = "Trash-Reason"


def header(frame: tmqp.Frame, name: str, default: str | None = None) -> str | None:
    """First value of a header, matched case-insensitively."""
    wanted = name.lower()
    for key, value in frame.headers:
        if key.lower() == wanted:
            return value
    return default


def headers_all(frame: tmqp.Frame, name: str) -> list[str]:
    """Every value of a repeatable header (e.g. CC)."""
    wanted = name.lower()
    return [value for key, value in frame.headers if key.lower() == wanted]


class ConnectionInfoError(ValueError):
    """The connection-info message is malformed."""


@dataclass(frozen=True)
class ConnectionInfo:
    """What a client says about itself right after the greeting.

    Payload text: a first line of two words (remote path, method), then
    ``Key: Value`` lines.  ``Client-Id``/``Client-Name``/``Client-Type``/
    ``Client-Token`` are known; other properties are kept in ``properties``.
    """

    client_id: str | None = None
    name: str | None = None
    type: str | None = None
    token: str | None = None
    path: str = "/"
    method: str = "CONNECT"
    properties: dict[str, str] = field(default_factory=dict)

    def to_payload(self) -> bytes:
        lines = [f"{self.path} {self.method}"]
        for key, value in (
            (Header.CLIENT_ID, self.client_id),
            (Header.CLIENT_NAME, self.name),
            (Header.CLIENT_TYPE, self.type),
            (Header.CLIENT_TOKEN, self.token),
        ):
            if value is not None:
                lines.append(f"{key}: {value}")
        for key, value in self.properties.items():
            lines.append(f"{key}: {value}")
        return ("\r\n".join(lines) + "\r\n").encode("utf-8")

    def to_frame(self, message_id: str = "") -> tmqp.Frame:
        return tmqp.Frame(
            message_type=MessageType.SERVER,
            content_type=Operation.CONNECT,
            message_id=message_id,
            payload=self.to_payload(),
        )

    @classmethod
    def from_payload(cls, payload: bytes) -> ConnectionInfo:
        try:
            text = payload.decode("utf-8")
        except UnicodeDecodeError:
            raise ConnectionInfoError("connection info is not UTF-8") from None
        lines = [line.strip() for line in text.replace("\r\n", "\n").split("\n")]
        lines = [line for line in lines if line]
        if not lines:
            return cls()
        first = lines[0].split()
        path, method = "/", "NONE"
        rest = lines[1:]
        if ":" in lines[0] and len(first) < 2 and not lines[0].startswith(("tmq://", "/")):
            rest = lines  # no request line, only properties
        elif len(first) == 2:
            path, method = first
        elif len(first) == 1:
            path = first[0]
        else:
            raise ConnectionInfoError(f"bad first line {lines[0][:80]!r}")
        known: dict[str, str | None] = {}
        props: dict[str, str] = {}
        names = {
            Header.CLIENT_ID.lower(): "client_id",
            Header.CLIENT_NAME.lower(): "name",
            Header.CLIENT_TYPE.lower(): "type",
            Header.CLIENT_TOKEN.lower(): "token",
        }
        for line in rest:
            key, sep, value = line.partition(":")
            key, value = key.strip(), value.strip()
            if not sep or not key:
                raise ConnectionInfoError(f"bad property line {line[:80]!r}")
            attr = names.get(key.lower())
            if attr is None:
                props[key] = value
            else:
                known[attr] = value or None
        return cls(
            client_id=known.get("client_id"),
            name=known.get("name"),
            type=known.get("type"),
            token=known.get("token"),
            path=path,
            method=method,
            properties=props,
        )


# ---------------------------------------------------------------------------
# Additions by the engine (vocabulary the engine and its clients share).
# ---------------------------------------------------------------------------


class RouterOperation(IntEnum):
    """Server operation content types for routers (zerohub's choice; the document has none).

    Payloads are JSON (see ``broker.router``); replies follow the channel operations:
    create/remove/add/remove-binding answer with an acknowledge, lists with a response.
    """

    ROUTER_CREATE = 601
    ROUTER_REMOVE = 602
    ROUTER_LIST = 603
    BINDING_ADD = 605
    BINDING_REMOVE = 606
    BINDING_LIST = 607


class NackReason:
    """Values of the ``Nack-Reason`` header on negative acknowledges."""

    NONE = "none"
    TIMEOUT = "timeout"
    NO_CONSUMERS = "no-consumers"
    UNAUTHORIZED = "unauthorized"
    NO_CHANNEL = "no-channel"
    NO_QUEUE = "no-queue"
    NO_ROUTE = "no-route"
    LIMIT_EXCEEDED = "limit-exceeded"
    UNACCEPTABLE = "unacceptable"
    BAD_REQUEST = "bad-request"
    FAILED = "failed"
    ALREADY_CREATED = "already-created"
    BUSY = "busy"
    SEND_ERROR = "send-error"
    CLEARED = "cleared"  # removed by a clear, a stop or a queue removal


#: Nack-Reason token the server uses for each result code it reports.
NACK_REASON_FOR_CODE: dict[int, str] = {
    ResultCode.FAILED: NackReason.FAILED,
    ResultCode.BAD_REQUEST: NackReason.BAD_REQUEST,
    ResultCode.UNAUTHORIZED: NackReason.UNAUTHORIZED,
    ResultCode.NOT_FOUND: NackReason.NO_QUEUE,
    ResultCode.UNACCEPTABLE: NackReason.UNACCEPTABLE,
    ResultCode.ALREADY_CREATED: NackReason.ALREADY_CREATED,
    ResultCode.LIMIT_EXCEEDED: NackReason.LIMIT_EXCEEDED,
    ResultCode.BUSY: NackReason.BUSY,
    ResultCode.SEND_ERROR: NackReason.SEND_ERROR,
}

#: Result code a client should raise for a ``Nack-Reason`` token sent by the server.
CODE_FOR_NACK_REASON: dict[str, ResultCode] = {
    NackReason.NONE: ResultCode.FAILED,
    NackReason.TIMEOUT: ResultCode.FAILED,
    NackReason.NO_CONSUMERS: ResultCode.NOT_FOUND,
    NackReason.UNAUTHORIZED: ResultCode.UNAUTHORIZED,
    NackReason.NO_CHANNEL: ResultCode.NOT_FOUND,
    NackReason.NO_QUEUE: ResultCode.NOT_FOUND,
    NackReason.NO_ROUTE: ResultCode.NOT_FOUND,
    NackReason.LIMIT_EXCEEDED: ResultCode.LIMIT_EXCEEDED,
    NackReason.UNACCEPTABLE: ResultCode.UNACCEPTABLE,
    NackReason.BAD_REQUEST: ResultCode.BAD_REQUEST,
    NackReason.FAILED: ResultCode.FAILED,
    NackReason.ALREADY_CREATED: ResultCode.ALREADY_CREATED,
    NackReason.BUSY: ResultCode.BUSY,
    NackReason.SEND_ERROR: ResultCode.SEND_ERROR,
    NackReason.CLEARED: ResultCode.FAILED,
}


class NoContent:
    """Values of the ``No-Content`` header on pull replies (a marker, not a real message)."""

    EMPTY = "Empty"
    UNACCEPTABLE = "Unacceptable"
    UNAUTHORIZED = "Unauthorized"
    NO_CHANNEL = "No-Channel"
    NO_QUEUE = "No-Queue"
    ID_REQUIRED = "Id-Required"
    #: zerohub: the client already holds its prefetch window of this queue's deliveries.
    LIMIT_EXCEEDED = "Limit-Exceeded"
    END = "End"


class ClearOption:
    """Values of the pull request ``Clear`` header."""

    NONE = "none"
    ALL = "all"
    HIGH_PRIORITY = "high-priority"
    DEFAULT_PRIORITY = "default-priority"


class EventName:
    """Event names (the target of EVENT messages)."""

    CLIENT_CONNECTED = "ClientConnected"
    CLIENT_DISCONNECTED = "ClientDisconnected"
    CLIENT_JOINED = "ClientJoined"
    CLIENT_LEFT = "ClientLeft"
    CHANNEL_CREATED = "ChannelCreated"
    CHANNEL_REMOVED = "ChannelRemoved"
    QUEUE_CREATED = "QueueCreated"
    QUEUE_UPDATED = "QueueUpdated"
    QUEUE_REMOVED = "QueueRemoved"
    MESSAGE_PRODUCED = "MessageProduced"


#: Every event name the server emits.
EVENT_NAMES: frozenset[str] = frozenset(
    value for key, value in vars(EventName).items() if not key.startswith("_")
)

#: Events about a channel (subscriptions may narrow them with Channel-Name / Queue-Id).
CHANNEL_EVENTS: frozenset[str] = frozenset(
    {
        EventName.CLIENT_JOINED,
        EventName.CLIENT_LEFT,
        EventName.QUEUE_CREATED,
        EventName.QUEUE_UPDATED,
        EventName.QUEUE_REMOVED,
        EventName.MESSAGE_PRODUCED,
    }
)

#: Direct-message target prefixes (``@name:Mail-Sender``, ``@type:worker``).
TARGET_BY_NAME = "@name:"
TARGET_BY_TYPE = "@type:"


class Outgoing(NamedTuple):
    """One frame the engine wants sent to one client (``broker.engine`` re-exports it).

    A named tuple rather than a frozen dataclass: the engine makes one per delivery and
    a tuple is built in about half the time (and the server unpacks it directly).
    """

    client_id: str
    #: A frame, or (queue deliveries) a message the door encodes (``broker.message``).
    frame: tmqp.Frame | Message


class Tracked(Outgoing):
    """An :class:`Outgoing` queue delivery the engine wants to hear about once it is sent.

    The server reports, per client and in order, how many tracked frames libzmq took
    (``Engine.transmitted``); until then the delivery holds a slot of the client's
    window, and if the client goes away first the engine puts it back in its queue.
    """

    __slots__ = ()


class PlainSends(Sequence[Message]):
    """The STOMP door's messages of a run of plain SENDs to one queue, made only when
    read (``EngineDoor._publish_plain`` -> ``Engine.publish_many``): message ``i`` is
    ``Message(f"{prefix}{first + i}", source, target, queue_id, headers=headers,
    payload=bodies[i])`` -- the door's own id, no flag, the default TTL, one header block
    object, no octets -- a new tuple at each read.

    A run that reaches a quiet ``ack:auto`` consumer at once is sent whole as a slice of
    it (``Queue._send_auto_run``: ids and bodies are enough to write its MESSAGE frames,
    :meth:`ids`, :attr:`bodies`); whatever else happens to a message (queued, tracked,
    browsed, put back, a second consumer's turn) reads it, and so makes it, there.  The
    engine tells it apart by its class (``Engine._push_run``, ``Engine._accept_run``,
    ``Queue._auto_stretch``): uniform by construction, nothing to scan per message."""

    __slots__ = ("bodies", "first", "headers", "prefix", "queue_id", "source", "target")

    def __init__(
        self,
        prefix: str,
        first: int,
        source: str,
        target: str,
        queue_id: int,
        headers: Headers,
        bodies: list[bytes],
    ) -> None:
        self.prefix = prefix
        self.first = first
        self.source = source
        self.target = target
        self.queue_id = queue_id
        self.headers = headers
        #: The SENDs' bodies, in order (never changed: a slice shares nothing mutable).
        self.bodies = bodies

    def __len__(self) -> int:
        return len(self.bodies)

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> PlainSends: ...

    def __getitem__(self, index: int | slice) -> Message | PlainSends:
        bodies = self.bodies
        if isinstance(index, slice):
            start, stop, step = index.indices(len(bodies))
            if step != 1:
                raise ValueError("PlainSends slices have a step of 1")
            return PlainSends(
                self.prefix,
                self.first + start,
                self.source,
                self.target,
                self.queue_id,
                self.headers,
                bodies[start:stop],
            )
        n = len(bodies)
        i = index + n if index < 0 else index
        if not 0 <= i < n:
            raise IndexError(index)
        return _new(
            Message,
            (
                f"{self.prefix}{self.first + i}",
                self.source,
                self.target,
                self.queue_id,
                False,
                False,
                False,
                DEFAULT_TTL,
                self.headers,
                bodies[i],
                None,
            ),
        )

    def __iter__(self) -> Iterator[Message]:
        return self.made(self.source, False)

    def made(self, source: str, wants_ack: bool) -> Iterator[Message]:
        """The messages in order, naming ``source`` and with ``wants_ack`` (a run's
        delivered frames: :meth:`DeliveredRun.frames`), by C iterators: no Python call
        per message."""
        n = len(self.bodies)
        fields = zip(
            self.ids(),
            repeat(source, n),
            repeat(self.target, n),
            repeat(self.queue_id, n),
            repeat(False, n),
            repeat(False, n),
            repeat(wants_ack, n),
            repeat(DEFAULT_TTL, n),
            repeat(self.headers, n),
            self.bodies,
            repeat(None, n),
            strict=True,
        )
        return map(_new, repeat(Message, n), fields)

    def ids(self) -> list[str]:
        """The messages' ids, in order (an f-string per id: cheaper than ``map`` calls)."""
        prefix, first = self.prefix, self.first
        return [f"{prefix}{i}" for i in range(first, first + len(self.bodies))]


_new = tuple.__new__


class DeliveredRun(NamedTuple):
    """Consecutive AUTO deliveries of one queue to one consumer that acknowledges by
    taking (``broker.engine.flow.AUTO_RUN``), as ``Queue.accept_many`` sends a run of
    plain SENDs and ``Dispatcher.send_run`` a stretch of a backlog: uniform by
    construction -- one target, one header block, one source, each message the door's
    own (an id, no octets).

    The delivery of ``messages[i]`` is the frame the tracked path would have sent
    (:meth:`frames`); nothing is made per delivery unless someone needs those frames.
    """

    #: The messages as pushed (the door's own), or as delivered (a drain's: the same
    #: ids, flags, TTLs and payloads), in send order.
    messages: Sequence[Message]
    #: The source every delivered frame names ("" when the queue hides client names).
    source: str
    #: The channel and queue id.
    target: str
    queue_id: int
    #: The header block every message of the run shares (one object).
    headers: Headers

    def ids(self) -> list[str]:
        """The deliveries' message ids, in order (of a :class:`PlainSends` without making
        its messages)."""
        messages = self.messages
        if messages.__class__ is PlainSends:
            return messages.ids()
        return [m[0] for m in messages]

    def bodies(self) -> list[bytes | memoryview]:
        """The deliveries' bodies, in order (of a :class:`PlainSends`: its own list)."""
        messages = self.messages
        if messages.__class__ is PlainSends:
            return messages.bodies  # type: ignore[return-value]  # (list is invariant)
        return [m[9] for m in messages]

    def frames(self) -> list[Message]:
        """Each delivery as the frame the tracked path sends (the acknowledge wished)."""
        messages = self.messages
        if messages.__class__ is PlainSends:  # (made once, as frames: no message first)
            return list(messages.made(self.source, True))
        new = tuple.__new__
        source, target, qid, headers = self.source, self.target, self.queue_id, self.headers
        return [
            new(Message, (m[0], source, target, qid, m[4], m[5], True, m[7], headers, m[9], None))
            for m in self.messages
        ]


class AutoRun(Outgoing):
    """An :class:`Outgoing` standing for ``len(frame.messages)`` tracked deliveries to one
    consumer: ``frame`` is a :class:`DeliveredRun`.  The transport reports each of them
    taken as it would a :class:`Tracked` frame (``Engine.transmitted`` counts
    deliveries).  Only a consumer whose transport takes runs gets one
    (``Engine.acknowledge_taken(..., runs=True)``: the STOMP door's); never a TMQP peer.
    """

    __slots__ = ()
