"""What the parts of a queue need: from the engine (:class:`QueueHost`) and from the queue
that owns them (:class:`QueueCore`).

:class:`broker.engine.queue.queue.Queue` is one class that has its parts, one module each:
the waiting messages (``messages``), the delivery handler's hooks (``hooks``), the store
and producer acknowledges (``ledger``), the consumer acknowledges and timers (``acks``),
sending to consumers (``dispatch``) and pull requests (``pull``); what a status decides is
its strategy's (``statuses``).  The parts call each other through their queue, which they
know as a :class:`QueueCore`: none of them imports the queue module, and the queue imports
them all.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from broker import tmqp
    from broker.engine.channel import Channel, Client
    from broker.engine.delivery import AckWhen, Decision, DeliveryHandler, PutBack
    from broker.engine.message import Delivery, Message, QueueMessage
    from broker.engine.options import BrokerConfig, ChannelQueueOptions
    from broker.engine.queue.dedupe import RecentIds
    from broker.engine.queue.hooks import HandlerHooks
    from broker.engine.queue.messages import MessageOrder
    from broker.engine.queue.retained import Retained
    from broker.engine.queue.seqindex import SequenceIndex
    from broker.engine.queue.statuses import StatusStrategy
    from broker.engine.receipts import Receipts
    from broker.protocol import Outgoing
from broker.store import Store

Q_contra = TypeVar("Q_contra", contravariant=True)


class QueueHost(Protocol[Q_contra]):
    """What a queue needs from the engine (``broker.engine.host.QueueServices``)."""

    store: Store
    config: BrokerConfig
    #: the ``now`` of the call being served
    now: float
    receipts: Receipts
    #: how the ids the engine's doors make begin (``QueueServices.add_door_prefix``)
    door_prefixes: tuple[str, ...]

    def client(self, client_id: str) -> Client[Any] | None: ...

    def new_id(self) -> str: ...

    def wake(self, queue: Q_contra, when: float) -> None: ...

    def handler_for(self, key: str | None) -> DeliveryHandler: ...

    def count_error(self, where: str, error: Exception) -> None: ...


class QueueCore(Protocol):
    """What the parts of a queue see of the queue that owns them."""

    #: Deadline of a delivery whose queue has no acknowledge timeout.
    NEVER: float

    channel: Channel[Any]
    id: int
    key: tuple[str, int]
    host: QueueHost[Any]
    options: ChannelQueueOptions
    strategy: StatusStrategy
    hooks: HandlerHooks
    messages: MessageOrder
    retained: Retained
    index: SequenceIndex | None
    #: The ids remembered for duplicate suppression (``UseMessageId``).
    recent: RecentIds
    #: False once the queue is removed (its messages went with it).
    alive: bool
    #: Deliveries in flight per consumer id; the default window size.
    used: dict[str, int]
    window: int
    rr: int
    stalled: bool
    sequence: int
    #: The stretch of sequence numbers given to messages with unique ids (``Queue``).
    unique_from: int
    unique_to: int
    # counters (QueueInformation)
    received: int
    sent: int
    deliveries: int
    acks: int
    nacks: int
    auto_in_flight: int
    timeouts: int
    saves: int
    unsaved: int
    removed: int
    dropped: int
    last_received: float | None
    last_sent: float | None

    @property
    def store(self) -> Store: ...

    @property
    def pending(self) -> OrderedDict[tuple[str, str], Delivery]: ...

    def client(self, client_id: str) -> Client[Any] | None: ...

    def wake(self, when: float) -> None: ...

    def track_in_flight(self, now: float, plain: bool = False) -> None: ...

    def error(self, where: str, exc: Exception) -> None: ...

    # the delivery handler (``hooks``)
    def hook(self, m: QueueMessage | None, name: str, *args: Any) -> Decision: ...

    # the store and the producers (``ledger``)
    def save(self, m: QueueMessage) -> None: ...

    def delivered(self, m: QueueMessage, now: float) -> None: ...

    def put_back_saved(self, m: QueueMessage, now: float) -> None: ...

    def finish(self, m: QueueMessage) -> None: ...

    def to_trash(self, m: QueueMessage, reason: str) -> None: ...

    def ack_producer(
        self, m: QueueMessage, when: AckWhen, out: list[Outgoing], reason: str, source: str = ""
    ) -> None: ...

    def side_effects(self, m: QueueMessage, d: Decision, out: list[Outgoing]) -> None: ...

    def drop(
        self, m: QueueMessage, out: list[Outgoing], reason: str, count: bool = True
    ) -> None: ...

    def clear(
        self, out: list[Outgoing], *, priority: bool, regular: bool, in_flight: bool
    ) -> int: ...

    # consumer acknowledges and timers (``acks``)
    def put_back(
        self, m: QueueMessage, where: PutBack, now: float, out: list[Outgoing]
    ) -> None: ...

    def expire(self, m: QueueMessage, out: list[Outgoing]) -> None: ...

    def expire_paged(self, now: float, out: list[Outgoing]) -> None: ...

    def track(self, m: QueueMessage, c: Client[Any], deadline: float) -> Delivery: ...

    # sending (``dispatch``)
    def drain(self, now: float, out: list[Outgoing]) -> None: ...

    def drain_again(self, when: float) -> None: ...

    def release(self, client_id: str) -> None: ...

    def room(self, c: Client[Any]) -> bool: ...

    def eligible(self, m: QueueMessage, c: Client[Any]) -> bool: ...

    def hand(
        self,
        c: Client[Any],
        kind: int,
        m: QueueMessage | None,
        frame: Message | tmqp.Frame,
        out: list[Outgoing],
    ) -> None: ...

    def after_send(
        self, m: QueueMessage, c: Client[Any], req_ack: bool, deadline: float, out: list[Outgoing]
    ) -> None: ...

    def send(
        self,
        m: QueueMessage,
        consumers: Sequence[Client[Any]],
        now: float,
        out: list[Outgoing],
        keep: bool = True,
    ) -> bool: ...
