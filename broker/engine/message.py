"""Queue messages and deliveries (what delivery handlers get to see).

The message itself is a :class:`broker.message.Message` (re-exported here): the engine's
one message model, whatever door it came through; a :class:`QueueMessage` is its life
in one queue (sequence number, state, producer, delivery counts).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.message import Headers, Message, derive, with_source

if TYPE_CHECKING:
    from broker.engine.channel import Client

__all__ = [
    "DELAYED",
    "DONE",
    "INFLIGHT",
    "QUEUED",
    "Delivery",
    "Headers",
    "Message",
    "QueueMessage",
    "derive",
    "with_source",
]

# message states
QUEUED = 0  # waiting in the queue
INFLIGHT = 1  # handed to consumers: waiting for the transport or their acknowledges
DELAYED = 2  # put back, waiting for the put-back delay
DONE = 3  # finished (consumed, removed or timed out)


class QueueMessage:
    """A message in a queue (hooks receive it; ``message`` is what consumers get)."""

    __slots__ = (
        "acked",
        "created",
        "deadline",
        "delivered",
        "high_priority",
        "inflight",
        "message",
        "message_id",
        "out",
        "out_version",
        "producer",
        "producer_waits",
        "put_backs",
        "saved",
        "seq",
        "state",
        "transmitted",
        "unsent",
    )

    def __init__(
        self,
        seq: int,
        message: Message,
        producer: Client | None,
        producer_waits: bool,
        created: float,
    ) -> None:
        self.seq = seq
        self.message = message
        self.message_id = message.message_id
        self.high_priority = message.high_priority
        self.producer = producer
        self.producer_waits = producer_waits
        self.created = created
        self.deadline = 0.0
        self.put_backs = 0
        self.saved = False
        self.acked = False
        self.inflight = 0
        #: Copies of the current send handed to the transport and not yet reported sent.
        self.unsent = 0
        #: Copies of the current send the transport took; all sends ever (Delivery-Count).
        self.transmitted = 0
        self.delivered = 0
        self.state = QUEUED
        #: What consumers get under the queue's current options (made at the first send).
        self.out: Message | None = None
        self.out_version = -1

    @property
    def payload(self) -> bytes | memoryview:
        return self.message.payload

    @property
    def producer_id(self) -> str:
        return self.producer.id if self.producer is not None else self.message.source

    def __repr__(self) -> str:
        return f"QueueMessage(seq={self.seq}, id={self.message_id!r}, state={self.state})"


class Delivery:
    """One message sent to one consumer (waiting for its acknowledge when requested)."""

    __slots__ = ("deadline", "message", "receiver")

    def __init__(self, message: QueueMessage, receiver: Client, deadline: float) -> None:
        self.message = message
        self.receiver = receiver
        self.deadline = deadline
