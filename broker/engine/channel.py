"""Clients and channels: who is connected, who joined which channel.

The bottom of the engine's state: this module imports no other part of the engine but
the options, so every other part (messages, flow control, queues, registries) may
refer to it.  A channel holds queues and a client holds the queues it owes
acknowledges to; the queue type is a parameter (``Q``) so this module need not know it
(the engine uses ``Channel[Queue]`` and ``Client[Queue]``).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Generic, TypeVar

from broker.engine.options import ChannelOptions
from broker.protocol import ConnectionInfo

Q = TypeVar("Q")

#: ``(kind, queue, message or None, frame or None, sequence number)``: see ``broker.engine.flow``.
Transit = tuple[int, Q, Any, Any, int]


#: The connection-info property that makes a client a low-priority consumer.
LOW_PRIORITY_PROPERTY = "Consumer-Priority"


class Client(Generic[Q]):
    """A connected client as the engine sees it."""

    __slots__ = (
        "auto_acked",
        "auto_runs",
        "awaiting",
        "channels",
        "connected_at",
        "id",
        "info",
        "low_priority",
        "name",
        "own_ids",
        "pending_queues",
        "prefetch",
        "requests",
        "token",
        "type",
        "unsent",
        "unsent_extra",
        "user",
    )

    def __init__(self, client_id: str, info: ConnectionInfo, now: float) -> None:
        self.id = client_id
        self.info = info
        self.name = info.name
        self.type = info.type
        self.token = info.token
        #: zerohub: ``Consumer-Priority: low`` in the connection info (a federation
        #: client): a queue that hands each message to one consumer hands it one only
        #: when no other consumer has room for it (``broker.engine.queue.dispatch``).
        self.low_priority = any(
            k.lower() == LOW_PRIORITY_PROPERTY.lower() and v.strip().lower() == "low"
            for k, v in info.properties.items()
        )
        self.connected_at = now
        #: Channels joined, in join order.
        self.channels: dict[str, Channel[Q]] = {}
        #: Direct requests this client must still answer: (requester id, message id).
        self.awaiting: set[tuple[str, str]] = set()
        #: Outstanding direct requests this client sent (message ids).
        self.requests: set[str] = set()
        #: Queues holding deliveries this client has not acknowledged yet.
        self.pending_queues: set[Q] = set()
        #: Deliveries handed to the transport and not yet reported sent, in send order.
        self.unsent: deque[Transit[Q]] = deque()
        #: Deliveries the ``AUTO_RUN`` entries of ``unsent`` stand for beyond one each
        #: (``broker.engine.flow.unsent_deliveries``).
        self.unsent_extra = 0
        #: Window asked for at JOIN (``Prefetch`` header), per channel name.
        self.prefetch: dict[str, int] = {}
        #: Channels whose deliveries this consumer acknowledges by taking them: one
        #: that waits for an acknowledge is acknowledged once the transport took it
        #: (``broker.engine.flow.transmitted``; STOMP's ``ack:auto``).
        self.auto_acked: set[str] = set()
        #: Its transport takes a run of such deliveries as one item
        #: (``broker.protocol.AutoRun``: the STOMP door), so a queue whose single
        #: consumer it is sends them so, from a run of pushes or a drain
        #: (``Engine.acknowledge_taken``'s ``runs``; never a TMQP peer's).
        self.auto_runs = False
        #: Every message it sends carries an id its door made, unique (the STOMP door's:
        #: set by the door, never from the wire), so a tracked delivery of one shares
        #: its id with no AUTO delivery in flight (``Dispatcher.send``).
        self.own_ids = False
        #: The user whose quotas count what this client creates (``broker.engine.quotas``),
        #: set by the client registry from the authorizer at connect; None: no quota.
        self.user: str | None = None

    def __repr__(self) -> str:
        return f"Client({self.id!r}, name={self.name!r}, type={self.type!r})"


class Channel(Generic[Q]):
    """A named set of queues and the clients that joined it (its consumers)."""

    __slots__ = ("consumer_list", "consumers", "fanout", "name", "options", "queues")

    def __init__(self, name: str, options: ChannelOptions) -> None:
        self.name = name
        self.options = options
        self.queues: dict[int, Q] = {}
        self.consumers: dict[str, Client[Q]] = {}
        #: Consumers in join order (the "first acquirer" is consumer_list[0]).
        self.consumer_list: list[Client[Q]] = []
        #: The channel's fan-out stream (``broker.engine.fanout.Stream``) while some
        #: consumer reads its broadcast queues through the broker's PUB socket.
        self.fanout: Any = None
