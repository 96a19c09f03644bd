"""The seven queue statuses, one small strategy object each.

A queue holds its messages, acknowledges and flow windows; its *status* decides what it
does with them.  :class:`StatusStrategy` lists every such decision:

* whether a push is accepted at all (Stopped refuses: Unacceptable) and whether the
  queue's ``MessageLimit`` counts waiting messages (not Broadcast: it keeps nothing);
* what happens to an accepted push (:meth:`StatusStrategy.admit`): sent at once, kept,
  broadcast then forgotten, or kept as the only (latest) message;
* whether waiting messages are sent to consumers (:attr:`StatusStrategy.delivers`: on a
  drain after an acknowledge, a settled delivery, a JOIN, a timer) and to which consumers
  among those with room in their window (:meth:`StatusStrategy.targets`);
* whether plain pushes may take the queue's fast path and to which consumer
  (:meth:`StatusStrategy.plain_target`);
* how a pull request is answered (:meth:`StatusStrategy.pull`);
* whether a message coming back (put back, never sent) re-enters the queue
  (:attr:`StatusStrategy.keeps_returns`; Stopped drops it);
* what a switch to the status does (:meth:`StatusStrategy.entered`; Stopped clears).

Strategies hold no state (the round-robin position, the windows, the messages all live
in the queue), so one instance per status serves every queue: :data:`STATUSES`.  They
see the queue only through :class:`StatusHost`, the operations a status may use.  Every
status respects the per-consumer windows (``broker.engine.flow``): the queue's
``with_room``/``choose_one``/``next_with_room`` only ever return consumers with room.

A new reading mode (say a "log" status whose pull reads from an offset without removing)
is one new class implementing :class:`StatusStrategy` and one entry in :data:`STATUSES`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from broker.engine.message import INFLIGHT, QUEUED
from broker.protocol import NackReason, Outgoing, QueueStatus

if TYPE_CHECKING:
    from broker.engine.channel import Channel, Client
    from broker.engine.message import QueueMessage
    from broker.engine.options import ChannelQueueOptions
    from broker.message import Message


class StatusHost(Protocol):
    """What a status may use of its queue."""

    channel: Channel
    options: ChannelQueueOptions
    #: Round-robin position (index into the channel's consumer list).
    rr: int
    #: The last drain stopped on full windows (see ``broker.engine.queue.dispatch``).
    stalled: bool

    def waiting(self) -> bool: ...

    def blocked(self) -> bool: ...

    def enqueue(self, m: QueueMessage) -> None: ...

    def start_timeout(self, m: QueueMessage, now: float) -> None: ...

    def send(
        self,
        m: QueueMessage,
        consumers: Sequence[Client],
        now: float,
        out: list[Outgoing],
        keep: bool = True,
    ) -> bool: ...

    def drain(self, now: float, out: list[Outgoing]) -> None: ...

    def publish(self, m: QueueMessage, stream: Any, now: float, out: list[Outgoing]) -> bool: ...

    def finish(self, m: QueueMessage) -> None: ...

    def drop(
        self, m: QueueMessage, out: list[Outgoing], reason: str, count: bool = True
    ) -> None: ...

    def clear(
        self, out: list[Outgoing], *, priority: bool, regular: bool, in_flight: bool
    ) -> int: ...

    def room(self, c: Client) -> bool: ...

    def next_with_room(self, consumers: list[Client]) -> Client | None: ...

    def choose_one(
        self, m: QueueMessage, consumers: Sequence[Client], rotate: bool, req_ack: bool
    ) -> tuple[Client, ...]: ...

    def with_room(
        self, m: QueueMessage, consumers: Sequence[Client], req_ack: bool, keep: bool
    ) -> list[Client]: ...

    def pull_messages(
        self, client: Client, request: Message, now: float, out: list[Outgoing], limit: int
    ) -> None: ...

    def pull_latest(self, client: Client, request: Message, out: list[Outgoing]) -> None: ...

    def refuse_pull(self, client: Client, request: Message, out: list[Outgoing]) -> None: ...


class StatusStrategy(Protocol):
    """What a queue status decides (see the module docstring)."""

    #: The status this strategy implements.
    status: ClassVar[QueueStatus]
    #: A push is accepted (False: refused with Unacceptable).
    accepts_pushes: ClassVar[bool]
    #: ``MessageLimit`` counts the messages waiting in the queue.
    limits_count: ClassVar[bool]
    #: Waiting messages are sent to consumers when the queue drains.
    delivers: ClassVar[bool]
    #: Plain pushes may take the fast path (``Queue.push_plain``).
    takes_plain: ClassVar[bool]
    #: The fast path may choose among several consumers (else it needs exactly one).
    plain_many: ClassVar[bool]
    #: A message coming back to the queue (put back, never sent) re-enters it.
    keeps_returns: ClassVar[bool]

    def admit(self, q: StatusHost, m: QueueMessage, now: float, out: list[Outgoing]) -> None:
        """An accepted push (the delivery handler allowed it): send, keep or forget it."""

    def targets(
        self,
        q: StatusHost,
        m: QueueMessage,
        consumers: Sequence[Client],
        req_ack: bool,
        keep: bool,
    ) -> Sequence[Client]:
        """The consumers a dequeued message goes to now (empty: it waits)."""

    def plain_target(self, q: StatusHost, consumers: list[Client]) -> Client | None:
        """Fast path: the consumer a plain push goes to (None: it waits in the queue).

        Called only when nothing waits in the queue and ``consumers`` holds one consumer
        (or several, with :attr:`plain_many`)."""

    def pull(
        self,
        q: StatusHost,
        client: Client,
        request: Message,
        now: float,
        out: list[Outgoing],
        limit: int,
    ) -> None:
        """Answer a pull request of a consumer of the channel."""

    def entered(self, q: StatusHost, old: QueueStatus, out: list[Outgoing]) -> None:
        """The queue switched to this status from ``old`` (the queue drains afterwards)."""


# ---------------------------------------------------------------------- shared pieces


def _keep(q: StatusHost, m: QueueMessage, now: float) -> None:
    """Keep an accepted message (with its MessageTimeout) until it is pulled or sent."""
    q.start_timeout(m, now)
    q.enqueue(m)


def _send_or_keep(q: StatusHost, m: QueueMessage, now: float, out: list[Outgoing]) -> None:
    """Push and round robin: send at once when nothing waits ahead of it, else queue."""
    q.start_timeout(m, now)
    consumers = q.channel.consumer_list
    if consumers and not q.waiting() and not q.blocked():
        # nothing waits ahead of it: send without queueing (a message nobody can take
        # is put at the front of the queue by send)
        q.send(m, consumers, now, out)
        return
    q.enqueue(m)
    if not q.stalled or m.high_priority:
        # (stalled: the head of the queue waits for room; a push behind it cannot change
        # that, the next settled delivery or acknowledge drains)
        q.drain(now, out)


def _all_or_first(
    q: StatusHost, m: QueueMessage, consumers: Sequence[Client], req_ack: bool, keep: bool
) -> Sequence[Client]:
    """Every consumer with room, or the first one with room (first acquirer)."""
    if q.options.send_only_first_acquirer or m.first_acquirer:
        return q.choose_one(m, consumers, False, req_ack)
    return q.with_room(m, consumers, req_ack, keep)


def _only_one(q: StatusHost, consumers: list[Client]) -> Client | None:
    c = consumers[0]
    return c if q.room(c) else None


class _Holds:
    """Shared answers of the statuses that never send on their own (no delivery)."""

    delivers: ClassVar[bool] = False
    takes_plain: ClassVar[bool] = False
    plain_many: ClassVar[bool] = False

    def targets(
        self,
        q: StatusHost,
        m: QueueMessage,
        consumers: Sequence[Client],
        req_ack: bool,
        keep: bool,
    ) -> Sequence[Client]:
        return ()

    def plain_target(self, q: StatusHost, consumers: list[Client]) -> Client | None:
        return None


# ---------------------------------------------------------------------- the statuses


class Broadcast:
    """Every consumer with room gets a copy; a message nobody took is dropped (not kept)."""

    status: ClassVar[QueueStatus] = QueueStatus.BROADCAST
    accepts_pushes: ClassVar[bool] = True
    limits_count: ClassVar[bool] = False
    delivers: ClassVar[bool] = True
    takes_plain: ClassVar[bool] = False
    plain_many: ClassVar[bool] = False
    keeps_returns: ClassVar[bool] = True

    def admit(self, q: StatusHost, m: QueueMessage, now: float, out: list[Outgoing]) -> None:
        channel = q.channel
        stream = channel.fanout
        if stream is not None and q.publish(m, stream, now, out):
            # the fan-out members have it (``broker.engine.fanout``): the others one by one
            others = stream.others(channel.consumer_list)
            if others:
                q.send(m, others, now, out, keep=False)
            if m.state == INFLIGHT and not m.lived().unsent:
                q.finish(m)  # no copy waits for the transport
            return
        consumers = channel.consumer_list
        sent = bool(consumers) and q.send(m, consumers, now, out, keep=False)
        if not sent and m.state == QUEUED:  # nobody took it: broadcast keeps nothing
            q.drop(m, out, NackReason.NO_CONSUMERS, count=False)

    targets = staticmethod(_all_or_first)

    def plain_target(self, q: StatusHost, consumers: list[Client]) -> Client | None:
        return None

    def pull(
        self,
        q: StatusHost,
        client: Client,
        request: Message,
        now: float,
        out: list[Outgoing],
        limit: int,
    ) -> None:
        q.refuse_pull(client, request, out)

    def entered(self, q: StatusHost, old: QueueStatus, out: list[Outgoing]) -> None:
        pass


class Push:
    """Each message goes to every consumer with room (or the first acquirer); with no
    room anywhere it waits in the queue."""

    status: ClassVar[QueueStatus] = QueueStatus.PUSH
    accepts_pushes: ClassVar[bool] = True
    limits_count: ClassVar[bool] = True
    delivers: ClassVar[bool] = True
    takes_plain: ClassVar[bool] = True
    plain_many: ClassVar[bool] = False  # several consumers: a QueueMessage follows the copies
    keeps_returns: ClassVar[bool] = True

    def admit(self, q: StatusHost, m: QueueMessage, now: float, out: list[Outgoing]) -> None:
        _send_or_keep(q, m, now, out)

    targets = staticmethod(_all_or_first)

    def plain_target(self, q: StatusHost, consumers: list[Client]) -> Client | None:
        return _only_one(q, consumers)

    def pull(
        self,
        q: StatusHost,
        client: Client,
        request: Message,
        now: float,
        out: list[Outgoing],
        limit: int,
    ) -> None:
        q.refuse_pull(client, request, out)

    def entered(self, q: StatusHost, old: QueueStatus, out: list[Outgoing]) -> None:
        pass


class RoundRobin:
    """Each message goes to one consumer: the next one with room after the last chosen."""

    status: ClassVar[QueueStatus] = QueueStatus.ROUND_ROBIN
    accepts_pushes: ClassVar[bool] = True
    limits_count: ClassVar[bool] = True
    delivers: ClassVar[bool] = True
    takes_plain: ClassVar[bool] = True
    plain_many: ClassVar[bool] = True
    keeps_returns: ClassVar[bool] = True

    def admit(self, q: StatusHost, m: QueueMessage, now: float, out: list[Outgoing]) -> None:
        _send_or_keep(q, m, now, out)

    def targets(
        self,
        q: StatusHost,
        m: QueueMessage,
        consumers: Sequence[Client],
        req_ack: bool,
        keep: bool,
    ) -> Sequence[Client]:
        return q.choose_one(m, consumers, True, req_ack)

    def plain_target(self, q: StatusHost, consumers: list[Client]) -> Client | None:
        if len(consumers) == 1:
            c = _only_one(q, consumers)
            if c is not None:
                q.rr = 0  # (as choose_one leaves it)
            return c
        return q.next_with_room(consumers)

    def pull(
        self,
        q: StatusHost,
        client: Client,
        request: Message,
        now: float,
        out: list[Outgoing],
        limit: int,
    ) -> None:
        q.refuse_pull(client, request, out)

    def entered(self, q: StatusHost, old: QueueStatus, out: list[Outgoing]) -> None:
        pass


class Pull(_Holds):
    """Messages wait until a consumer pulls them (``broker.engine.queue.pull``)."""

    status: ClassVar[QueueStatus] = QueueStatus.PULL
    accepts_pushes: ClassVar[bool] = True
    limits_count: ClassVar[bool] = True
    keeps_returns: ClassVar[bool] = True

    def admit(self, q: StatusHost, m: QueueMessage, now: float, out: list[Outgoing]) -> None:
        _keep(q, m, now)

    def pull(
        self,
        q: StatusHost,
        client: Client,
        request: Message,
        now: float,
        out: list[Outgoing],
        limit: int,
    ) -> None:
        q.pull_messages(client, request, now, out, limit)

    def entered(self, q: StatusHost, old: QueueStatus, out: list[Outgoing]) -> None:
        pass


class Cache(_Holds):
    """Only the latest message is kept; a pull reads it without removing it."""

    status: ClassVar[QueueStatus] = QueueStatus.CACHE
    accepts_pushes: ClassVar[bool] = True
    limits_count: ClassVar[bool] = True
    keeps_returns: ClassVar[bool] = True

    def admit(self, q: StatusHost, m: QueueMessage, now: float, out: list[Outgoing]) -> None:
        q.clear(out, priority=True, regular=True, in_flight=False)
        _keep(q, m, now)

    def pull(
        self,
        q: StatusHost,
        client: Client,
        request: Message,
        now: float,
        out: list[Outgoing],
        limit: int,
    ) -> None:
        q.pull_latest(client, request, out)

    def entered(self, q: StatusHost, old: QueueStatus, out: list[Outgoing]) -> None:
        pass  # messages already waiting stay until the next push replaces them


class Paused(_Holds):
    """Pushes are kept; nothing is sent until the status changes."""

    status: ClassVar[QueueStatus] = QueueStatus.PAUSED
    accepts_pushes: ClassVar[bool] = True
    limits_count: ClassVar[bool] = True
    keeps_returns: ClassVar[bool] = True

    def admit(self, q: StatusHost, m: QueueMessage, now: float, out: list[Outgoing]) -> None:
        _keep(q, m, now)

    def pull(
        self,
        q: StatusHost,
        client: Client,
        request: Message,
        now: float,
        out: list[Outgoing],
        limit: int,
    ) -> None:
        q.refuse_pull(client, request, out)

    def entered(self, q: StatusHost, old: QueueStatus, out: list[Outgoing]) -> None:
        pass


class Stopped(_Holds):
    """Pushes are refused; a switch to Stopped drops every message (waiting, in flight,
    delayed) and one coming back later is dropped too."""

    status: ClassVar[QueueStatus] = QueueStatus.STOPPED
    accepts_pushes: ClassVar[bool] = False
    limits_count: ClassVar[bool] = True
    keeps_returns: ClassVar[bool] = False

    def admit(self, q: StatusHost, m: QueueMessage, now: float, out: list[Outgoing]) -> None:
        _keep(q, m, now)  # (not reached: the push is refused before it is accepted)

    def pull(
        self,
        q: StatusHost,
        client: Client,
        request: Message,
        now: float,
        out: list[Outgoing],
        limit: int,
    ) -> None:
        q.refuse_pull(client, request, out)

    def entered(self, q: StatusHost, old: QueueStatus, out: list[Outgoing]) -> None:
        if old is not QueueStatus.STOPPED:
            q.clear(out, priority=True, regular=True, in_flight=True)


#: The strategy of each status (stateless: shared by every queue).
STATUSES: dict[QueueStatus, StatusStrategy] = {
    s.status: s for s in (Broadcast(), Push(), RoundRobin(), Pull(), Cache(), Paused(), Stopped())
}


def strategy_for(status: QueueStatus) -> StatusStrategy:
    """The strategy of ``status``."""
    return STATUSES[status]
