"""Queue messages and deliveries (what delivery handlers get to see).

The message itself is a :class:`broker.message.Message` (re-exported here): the engine's
one message model, whatever door it came through; a :class:`QueueMessage` is its life
in one queue (sequence number, state, producer, delivery counts).
"""

from __future__ import annotations

from operator import attrgetter
from sys import intern as _intern
from typing import TYPE_CHECKING, Generic, TypeVar, overload

from broker.message import Headers, Message, Wire, derive, with_source

if TYPE_CHECKING:
    from broker.engine.channel import Client

__all__ = [
    "DELAYED",
    "DONE",
    "FIRST_ACQUIRER_FLAG",
    "INFLIGHT",
    "QUEUED",
    "TTL_SHIFT",
    "Delivery",
    "Headers",
    "Message",
    "QueueMessage",
    "derive",
    "with_source",
]

_T = TypeVar("_T")

#: ``Message(...)`` from a tuple of every field (``broker.message._new``).
_new = tuple.__new__

# message states
QUEUED = 0  # waiting in the queue
INFLIGHT = 1  # handed to consumers: waiting for the transport or their acknowledges
DELAYED = 2  # put back, waiting for the put-back delay
DONE = 3  # finished (consumed, removed or timed out)


class Life:
    """What a queue message gathers once it is sent, awaited or put back: made at the
    first such change (a message that only waits has none, see :class:`QueueMessage`)."""

    __slots__ = (
        "acked",
        "deadline",
        "delivered",
        "inflight",
        "out",
        "out_version",
        "producer_waits",
        "put_backs",
        "saved",
        "transmitted",
        "unsent",
        "wire",
    )

    # What each field holds:
    # acked: the waiting producer was answered; deadline: MessageTimeout deadline
    # (monotonic seconds; 0: none); delivered: sends to consumers that had to acknowledge
    # it (Delivery-Count); inflight: deliveries waiting for their consumers' acknowledges;
    # out: what consumers get under the queue's current options (made at the first send),
    # for out_version; producer_waits: its producer waits for an acknowledge; saved: the
    # store holds it; transmitted: copies of the current send the transport took;
    # unsent: copies of the current send handed to the transport and not yet reported
    # sent; wire: the message's wire form until it is parked (``broker.message``).
    # (Chained assignments: a Life is made for every message sent, this is a hot path.)
    acked: bool
    deadline: float
    delivered: int
    inflight: int
    out: Message | None
    out_version: int
    producer_waits: bool
    put_backs: int
    saved: bool
    transmitted: int
    unsent: int
    wire: Wire | None

    def __init__(self) -> None:
        self.acked = self.producer_waits = self.saved = False
        self.deadline = 0.0
        self.delivered = self.inflight = self.put_backs = self.transmitted = self.unsent = 0
        self.out = self.wire = None
        self.out_version = -1

    def plain(self) -> bool:
        """Nothing gathered yet (the message may do without)."""
        return (
            not (
                self.acked
                or self.deadline
                or self.delivered
                or self.inflight
                or self.out is not None
                or self.producer_waits
                or self.put_backs
                or self.saved
                or self.transmitted
                or self.unsent
                or self.wire is not None
            )
            and self.out_version == -1
        )


#: ``QueueMessage.flags``: first acquirer, wants ack, and the TTL above them (with the
#: default TTL the value stays a small int, one Python keeps shared: no object).
_FIRST, _WANTS_ACK = 1, 2
#: The layout for code that makes frames of many messages from ``flags`` without a
#: property call per field (``Dispatcher.hand_auto``): ``flags & FIRST_ACQUIRER_FLAG``,
#: ``flags >> TTL_SHIFT``.
FIRST_ACQUIRER_FLAG = _FIRST
TTL_SHIFT = 2


if TYPE_CHECKING:

    class _LifeField(Generic[_T]):
        """How type checkers see what :func:`_of_life` makes (a ``property``)."""

        @overload
        def __get__(self, obj: None, owner: object = None) -> _LifeField[_T]: ...
        @overload
        def __get__(self, obj: QueueMessage, owner: object = None) -> _T: ...
        def __get__(self, obj: object, owner: object = None) -> object: ...
        def __set__(self, obj: QueueMessage, value: _T) -> None: ...


def _of_life(name: str, default: _T) -> _LifeField[_T]:
    """A :class:`QueueMessage` attribute kept in its :class:`Life`: reading gives
    ``default`` while the message has none, writing makes it (a ``property``: its
    getter and setter cost what hand-written ones do; a descriptor class's Python
    ``__get__`` measured slower)."""
    read = attrgetter(name)

    def get(self: QueueMessage) -> _T:
        life = self.life
        return default if life is None else read(life)

    def put(self: QueueMessage, value: _T) -> None:
        life = self.life
        if life is None:
            life = self.life = Life()
        setattr(life, name, value)

    return property(get, put)  # type: ignore[return-value]


class QueueMessage:
    """A message in a queue (hooks receive it; ``message`` is what consumers get).

    Memory: one object per waiting message, holding the message's own fields (no
    :class:`Message` tuple: :attr:`message` makes one when asked) and what its life in
    the queue adds once it is sent, awaited or put back (:class:`Life`, None until
    then).  A waiting 100-byte message costs this object, its payload, its id and its
    sequence number (``bench/bench_memory.py``).  ``created`` is accepted and not kept.
    """

    __slots__ = (
        "content_type",
        "flags",
        "headers",
        "high_priority",
        "life",
        "message_id",
        "payload",
        "producer",
        "seq",
        "source",
        "state",
        "target",
    )

    def __init__(
        self,
        seq: int,
        message: Message,
        producer: Client | None,
        producer_waits: bool,
        created: float = 0.0,
    ) -> None:
        self.seq = seq
        self.producer = producer
        self.state = QUEUED
        self.life: Life | None = None
        # (the ``message`` setter without its call: a message per push is made here)
        (
            self.message_id,
            self.source,
            self.target,
            self.content_type,
            self.high_priority,
            first,
            wants_ack,
            ttl,
            self.headers,
            self.payload,
            wire,
        ) = message
        self.flags = (_FIRST if first else 0) | (_WANTS_ACK if wants_ack else 0) | ttl << TTL_SHIFT
        if wire is not None:
            self.lived().wire = wire
        if producer_waits:
            self.lived().producer_waits = True

    @property
    def message(self) -> Message:
        """The message (a new tuple each time; its wire form until parked)."""
        flags, life = self.flags, self.life
        return _new(
            Message,
            (
                self.message_id,
                self.source,
                self.target,
                self.content_type,
                self.high_priority,
                bool(flags & _FIRST),
                bool(flags & _WANTS_ACK),
                flags >> TTL_SHIFT,
                self.headers,
                self.payload,
                None if life is None else life.wire,
            ),
        )

    @message.setter
    def message(self, message: Message) -> None:
        (
            self.message_id,
            self.source,
            self.target,
            self.content_type,
            self.high_priority,
            first,
            wants_ack,
            ttl,
            self.headers,
            self.payload,
            wire,
        ) = message
        self.flags = (_FIRST if first else 0) | (_WANTS_ACK if wants_ack else 0) | ttl << TTL_SHIFT
        if self.life is not None or wire is not None:
            self.wire = wire

    @property
    def ttl(self) -> int:
        return self.flags >> TTL_SHIFT

    @property
    def first_acquirer(self) -> bool:
        return bool(self.flags & _FIRST)

    # What the message's Life holds, read as the default while it has none (a write
    # makes it): see :func:`_of_life`.
    acked: _LifeField[bool] = _of_life("acked", False)
    deadline: _LifeField[float] = _of_life("deadline", 0.0)
    delivered: _LifeField[int] = _of_life("delivered", 0)
    inflight: _LifeField[int] = _of_life("inflight", 0)
    out: _LifeField[Message | None] = _of_life("out", None)
    out_version: _LifeField[int] = _of_life("out_version", -1)
    producer_waits: _LifeField[bool] = _of_life("producer_waits", False)
    put_backs: _LifeField[int] = _of_life("put_backs", 0)
    saved: _LifeField[bool] = _of_life("saved", False)
    transmitted: _LifeField[int] = _of_life("transmitted", 0)
    unsent: _LifeField[int] = _of_life("unsent", 0)
    wire: _LifeField[Wire | None] = _of_life("wire", None)

    def lived(self) -> Life:
        """Its :class:`Life`, made now if it has none (hot paths use it directly rather
        than one property call per field)."""
        life = self.life
        if life is None:
            life = self.life = Life()
        return life

    def park(self) -> None:
        """The form a message waits in (``broker.message.parked``): no wire form, its
        source and target the interned strings."""
        self.source = _intern(self.source)
        self.target = _intern(self.target)
        life = self.life
        if life is not None:
            life.wire = None
            if life.plain():
                self.life = None

    @property
    def producer_id(self) -> str:
        return self.producer.id if self.producer is not None else self.source

    def __repr__(self) -> str:
        return f"QueueMessage(seq={self.seq}, id={self.message_id!r}, state={self.state})"


class Delivery:
    """One message sent to one consumer (waiting for its acknowledge when requested)."""

    __slots__ = ("deadline", "message", "receiver")

    def __init__(self, message: QueueMessage, receiver: Client, deadline: float) -> None:
        self.message = message
        self.receiver = receiver
        self.deadline = deadline
