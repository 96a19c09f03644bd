"""Channels and queues of the engine: creation (also on the fly), removal, join, leave.

A channel created with ``destroy_when_empty`` goes away once it has no consumer and its
queues hold nothing.  The broker's limits (``config.limits``) bound the channels, the
queues (in all and per channel), the messages a queue holds and the channels a client
joins: past them an operation fails with LimitExceeded (482); so do the per-user quotas
(``broker.engine.quotas``: the channels and queues a client's user created, ``by``).
Every change emits its event (CHANNEL_CREATED, QUEUE_CREATED, CLIENT_JOINED, ...) into
the output list it is given.

:class:`ChannelRegistry` owns the channels (by name) and the count of queues; queues
get the engine's :class:`~broker.engine.host.QueueServices` as their host.
"""

from __future__ import annotations

from collections.abc import Callable

from broker.engine import models
from broker.engine.auth import Action, Authorizer
from broker.engine.channel import Channel as _Channel
from broker.engine.channel import Client as _Client
from broker.engine.definitions import Definitions
from broker.engine.delivery import per_message_rules
from broker.engine.errors import OperationError
from broker.engine.events import EventHub
from broker.engine.fanout import FanoutStreams
from broker.engine.host import QueueServices
from broker.engine.options import BrokerConfig, ChannelOptions, ChannelQueueOptions
from broker.engine.patterns import PatternJoins
from broker.engine.queue.queue import Queue
from broker.engine.quotas import Kind, UserQuotas, channel_key, queue_key
from broker.engine.retain import RetainedMessages
from broker.protocol import EventName, NackReason, Outgoing, ResultCode
from broker.store import Store

#: The engine's channels and clients, holding its queues.
Channel = _Channel[Queue]
Client = _Client[Queue]


def valid_channel_name(name: str) -> bool:
    return bool(name) and " " not in name and ";" not in name and len(name.encode()) <= 255


class ChannelRegistry:
    """Channel and queue management (see the module docstring)."""

    def __init__(
        self,
        config: BrokerConfig,
        authorizer: Authorizer,
        store: Store,
        events: EventHub,
        services: QueueServices,
    ) -> None:
        self.config = config
        self.authorizer = authorizer
        self.store = store
        self.events = events
        self.services = services
        #: Channel and queue options kept in the store (recreated on restart).
        self.definitions = Definitions(store, services.count_error)
        self.channels: dict[str, Channel] = {}
        #: Queues in all channels (bounded by ``config.limits.max_queues``).
        self.queue_count = 0
        #: The broker's fan-out streams (``broker.engine.fanout``); None: no fan-out socket.
        self.fanout: FanoutStreams | None = None
        #: Clients' pattern joins (``broker.engine.patterns``): a new channel a pattern
        #: matches is joined as it is created, if the client may join it.
        self.patterns = PatternJoins()
        #: Called with each channel created and the output list, after the pattern joins
        #: (a door with its own wildcard subscriptions: ``broker.stomp.engine_door``).
        self.on_created: Callable[[Channel, list[Outgoing]], None] | None = None
        #: The retained message of each broadcast channel (``broker.engine.retain``).
        self.retained = RetainedMessages()
        #: Who created which channel, queue and durable subscription, per user.
        self.quotas = UserQuotas(config.limits, self.definitions)

    def check_push(self, queue: Queue, size: int) -> int:
        """Result code a push of ``size`` octets into ``queue`` would get (0 = accepted):
        the queue's own rules, then the broker's bound on the messages one queue holds."""
        code = queue.check_push(size)
        if (
            not code
            and queue.message_count >= self.config.limits.max_queue_messages
            and queue.strategy.limits_count
        ):
            return ResultCode.LIMIT_EXCEEDED
        return code

    def resolve_queue(
        self, client: Client | None, channel_name: str, queue_id: int, out: list[Outgoing]
    ) -> Queue:
        """The queue, created on the fly when the config allows it (OperationError if not);
        what it creates counts for ``client``'s user (both quotas checked first)."""
        channel = self.channels.get(channel_name)
        if channel is None:
            if not self.config.auto_create_channel:
                raise OperationError(
                    ResultCode.NOT_FOUND, "no such channel", NackReason.NO_CHANNEL
                )
            if not valid_channel_name(channel_name):
                raise OperationError(ResultCode.BAD_REQUEST, "invalid channel name")
            if client is not None and not self.authorizer.allows(
                client, Action.CHANNEL_CREATE, channel_name
            ):
                raise OperationError(ResultCode.UNAUTHORIZED, "may not create channels")
            if client is not None and self.config.auto_create_queue:
                self.quotas.check(client.user, Kind.QUEUE)
            channel = self.create_channel(channel_name, out=out, by=client)
        queue = channel.queues.get(queue_id)
        if queue is None:
            if not self.config.auto_create_queue:
                raise OperationError(ResultCode.NOT_FOUND, "no such queue", NackReason.NO_QUEUE)
            if client is not None and not self.authorizer.allows(
                client, Action.QUEUE_CREATE, channel_name, queue_id
            ):
                raise OperationError(ResultCode.UNAUTHORIZED, "may not create queues")
            queue = self.create_queue(channel_name, queue_id, out=out, by=client)
        return queue

    def create_channel(
        self,
        name: str,
        options: ChannelOptions | None = None,
        out: list[Outgoing] | None = None,
        by: Client | None = None,
    ) -> Channel:
        """Create a channel (OperationError when invalid, existing or past a limit); it
        counts for ``by``'s user (None: for no one)."""
        if not valid_channel_name(name):
            raise OperationError(ResultCode.BAD_REQUEST, f"invalid channel name {name!r}")
        if name in self.channels:
            raise OperationError(ResultCode.ALREADY_CREATED, f"channel {name!r} exists")
        if len(self.channels) >= self.config.limits.max_channels:
            raise OperationError(ResultCode.LIMIT_EXCEEDED, "too many channels")
        user = by.user if by is not None else None
        self.quotas.check(user, Kind.CHANNEL)
        channel: Channel = _Channel(name, options or self.config.channel_defaults)
        self.channels[name] = channel
        self.definitions.channel(name, channel.options.to_json())
        self.quotas.charge(user, Kind.CHANNEL, channel_key(name))
        if out is None:
            out = []
        self.events.emit(EventName.CHANNEL_CREATED, models.channel_event(channel), out)
        if self.patterns.by_client:
            self._join_patterns(channel, out)
        if self.on_created is not None:
            now = self.services.now  # (the hook may run engine calls with its own clock)
            try:
                self.on_created(channel, out)
            except Exception as exc:  # a door's hook never fails the creation
                self.services.count_error("channel created", exc)
            finally:
                self.services.now = now
        return channel

    def _join_patterns(self, channel: Channel, out: list[Outgoing]) -> None:
        """A new channel: each client with a pattern matching it joins it, when its
        authorizer lets it join that channel (not allowed, or a limit: skipped)."""
        clients = self.services.clients
        for client_id, join in self.patterns.matching(channel.name):
            client = clients.get(client_id)
            if client is None or not self.authorizer.allows(client, Action.JOIN, channel.name):
                continue
            try:
                self.join(client, channel, self.services.now, out, join.prefetch)
            except OperationError:
                continue
            join.channels.add(channel.name)

    def create_queue(
        self,
        channel_name: str,
        queue_id: int,
        options: ChannelQueueOptions | None = None,
        out: list[Outgoing] | None = None,
        by: Client | None = None,
    ) -> Queue:
        """Create a queue in an existing channel, enforcing the channel's queue rules and
        the limits; it counts for ``by``'s user (None: for no one)."""
        channel = self.channels.get(channel_name)
        if channel is None:
            raise OperationError(ResultCode.NOT_FOUND, "no such channel", NackReason.NO_CHANNEL)
        if not 0 <= queue_id <= 0xFFFF:
            raise OperationError(ResultCode.BAD_REQUEST, "queue id must be 0..65535")
        if queue_id in channel.queues:
            raise OperationError(ResultCode.ALREADY_CREATED, f"queue {queue_id} exists")
        copts = channel.options
        if copts.allowed_queues and queue_id not in copts.allowed_queues:
            raise OperationError(ResultCode.UNACCEPTABLE, f"queue {queue_id} not allowed here")
        if not copts.allow_multiple_queues and channel.queues:
            raise OperationError(ResultCode.UNACCEPTABLE, "channel allows a single queue")
        limits = self.config.limits
        per_channel = limits.max_queues_per_channel
        if copts.queue_limit:
            per_channel = min(per_channel, copts.queue_limit)
        if len(channel.queues) >= per_channel:
            raise OperationError(ResultCode.LIMIT_EXCEEDED, "channel queue limit reached")
        if self.queue_count >= limits.max_queues:
            raise OperationError(ResultCode.LIMIT_EXCEEDED, "too many queues")
        user = by.user if by is not None else None
        self.quotas.check(user, Kind.QUEUE)
        options = options or copts.queue
        self.services.check_handler(options.message_delivery_handler)
        queue = Queue(channel, queue_id, options, self.services)
        channel.queues[queue_id] = queue
        self.queue_count += 1
        self.definitions.queue(channel_name, queue_id, options.to_json())
        self.quotas.charge(user, Kind.QUEUE, queue_key(channel_name, queue_id))
        if out is None:
            out = []
        self.events.emit(
            EventName.QUEUE_CREATED, models.queue_summary(queue), out, channel_name, queue_id
        )
        queue.drain(self.services.now, out)
        return queue

    def remove_queue(self, queue: Queue, out: list[Outgoing]) -> None:
        channel = queue.channel
        if channel.queues.get(queue.id) is not queue:
            return
        del channel.queues[queue.id]
        self.queue_count -= 1
        queue.close(out)
        self.store.drop_queue(queue.key)
        self.definitions.forget_queue(channel.name, queue.id)
        self.quotas.release(queue_key(channel.name, queue.id))
        self.events.emit(
            EventName.QUEUE_REMOVED, models.queue_summary(queue), out, channel.name, queue.id
        )

    def remove_channel(self, channel: Channel, out: list[Outgoing]) -> None:
        if self.channels.get(channel.name) is not channel:
            return
        del self.channels[channel.name]
        for queue in list(channel.queues.values()):
            queue.close(out)
            self.store.drop_queue(queue.key)
            self.definitions.forget_queue(channel.name, queue.id)
            self.quotas.release(queue_key(channel.name, queue.id))
        self.definitions.forget_channel(channel.name)
        self.quotas.release(channel_key(channel.name))
        if self.fanout is not None:
            self.fanout.drop(channel)
        self.queue_count -= len(channel.queues)
        channel.queues.clear()
        self.retained.forget(channel.name)
        rules = per_message_rules(self.services.handlers)
        for client in channel.consumer_list:
            client.channels.pop(channel.name, None)
            client.prefetch.pop(channel.name, None)
            if self.patterns.by_client:
                self.patterns.release(client.id, channel.name)
            if rules is not None:
                rules.forget(channel.name, client.id)
        channel.consumers.clear()
        channel.consumer_list.clear()
        self.events.emit(EventName.CHANNEL_REMOVED, models.channel_event(channel), out)

    def join(
        self,
        client: Client,
        channel: Channel,
        now: float,
        out: list[Outgoing],
        prefetch: int | None = None,
    ) -> None:
        """Make ``client`` a consumer of ``channel``; ``prefetch``: its own window for the
        channel's queues (None: theirs; see ``broker.flow``), also when joined already."""
        if client.id in channel.consumers:
            if prefetch is not None:
                client.prefetch[channel.name] = prefetch
                for queue in list(channel.queues.values()):
                    queue.drain(now, out)
            return
        if len(client.channels) >= self.config.limits.max_joined_channels:
            raise OperationError(ResultCode.LIMIT_EXCEEDED, "this client joined too many channels")
        client.prefetch.pop(channel.name, None)  # a new membership: the default unless asked
        limit = channel.options.client_limit
        if limit and len(channel.consumers) >= limit:
            raise OperationError(ResultCode.LIMIT_EXCEEDED, "channel client limit reached")
        channel.consumers[client.id] = client
        channel.consumer_list.append(client)
        if channel.fanout is not None:
            channel.fanout.direct = None
        client.channels[channel.name] = channel
        if prefetch is not None:
            client.prefetch[channel.name] = prefetch
        self.events.emit(
            EventName.CLIENT_JOINED, models.subscription_event(channel, client), out, channel.name
        )
        for queue in list(channel.queues.values()):
            queue.drain(now, out)

    def leave(self, client: Client, channel: Channel, out: list[Outgoing]) -> bool:
        if client.id not in channel.consumers:
            return False
        self.remove_consumer(channel, client, out)
        self.maybe_destroy(channel, out)
        return True

    def remove_consumer(self, channel: Channel, client: Client, out: list[Outgoing]) -> None:
        if self.fanout is not None:
            self.fanout.leave(channel, client.id, out)
        channel.consumers.pop(client.id, None)
        if client in channel.consumer_list:
            channel.consumer_list.remove(client)
        client.channels.pop(channel.name, None)
        client.prefetch.pop(channel.name, None)
        client.auto_acked.discard(channel.name)
        rules = per_message_rules(self.services.handlers)
        if rules is not None:  # (its selector and credit end with its membership)
            rules.forget(channel.name, client.id)
        self.events.emit(
            EventName.CLIENT_LEFT, models.subscription_event(channel, client), out, channel.name
        )

    def maybe_destroy(self, channel: Channel, out: list[Outgoing]) -> None:
        if (
            channel.options.destroy_when_empty
            and not channel.consumers
            and self.channels.get(channel.name) is channel
            and all(q.is_empty() for q in channel.queues.values())
        ):
            self.remove_channel(channel, out)
