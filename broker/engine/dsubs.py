"""Durable subscriptions: named queues that collect a topic's messages while no one reads.

A durable subscription (Apollo's "topic durable subscription") has an id and the topic
channels it collects from.  It is backed by an ordinary engine channel named
``/dsub/<id>`` (:func:`channel_name`) with one queue (id 0) in RoundRobin status that
requests acknowledges (no acknowledge timeout) and saves every message it takes (the
``persistent`` delivery handler when the broker registered it, as ``broker serve`` does):
consumers join that channel as any other (several consumers share its messages), browse
it by sequence number, and what it holds survives a restart with the store.

Rules:

* every message pushed into any queue of a topic channel gets a copy (same message id,
  headers and payload) in each durable subscription collecting from that channel, all or
  nothing: if one of those subscriptions is full (``limits.max_durable_subscription_
  messages``, enforced as its queue's ``MessageLimit``) the push is refused with 482
  before any copy is made -- the producer learns it (a negative acknowledge when it
  waits), nothing it was told was taken is dropped;
* a topic may not itself be a durable subscription's channel (no copies of copies);
* creating an existing id updates its topics (Apollo: a SUBSCRIBE with the same id and
  another destination updates the subscription); at most ``limits.max_durable_
  subscriptions`` exist (482 beyond), at most ``limits.max_durable_subscriptions_per_user``
  created by one user (``broker.engine.quotas``: its channel and queue count only as the
  subscription; updating one's topics changes nothing of who holds it);
* destroying one removes its channel and every message it held;
* the definition (id and topics) is kept in the store as ``dsub/<id>``
  (``broker.engine.definitions``); the channel and queue definitions are kept as any
  other's, so a restart brings back the subscription, its options and its saved messages.
  A recovered definition whose channel is gone is forgotten.

This module is sans-IO, like the rest of the engine: the registry works on the channel
registry and returns nothing but the output it appends to ``out``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from broker.engine.channels import ChannelRegistry, Client, valid_channel_name
from broker.engine.errors import OperationError
from broker.engine.options import ChannelQueueOptions
from broker.engine.queue.queue import Queue
from broker.engine.quotas import Kind, dsub_key
from broker.protocol import NackReason, Outgoing, QueueStatus, ResultCode

log = logging.getLogger("broker.engine.dsubs")

#: The engine channel that backs durable subscription ``id`` is this prefix + id.
CHANNEL_PREFIX = "/dsub/"
#: The queue id of a durable subscription's channel.
QUEUE_ID = 0
#: The delivery handler a durable subscription's queue uses when registered (it saves
#: every message; without it, the broker's default handler keeps them in memory).
PERSISTENT_HANDLER = "persistent"
#: Topics one durable subscription may collect from.
MAX_TOPICS = 64


def channel_name(sub_id: str) -> str:
    """The engine channel backing durable subscription ``sub_id``."""
    return CHANNEL_PREFIX + sub_id


@dataclass(frozen=True, slots=True)
class DurableSubscription:
    id: str
    topics: tuple[str, ...]

    @property
    def channel(self) -> str:
        return channel_name(self.id)

    def to_json(self) -> dict[str, Any]:
        return {"Id": self.id, "Topics": list(self.topics)}


def _check(sub_id: str, topics: Iterable[str]) -> tuple[str, ...]:
    if not sub_id or not valid_channel_name(channel_name(sub_id)):
        raise OperationError(ResultCode.BAD_REQUEST, f"invalid durable subscription id {sub_id!r}")
    unique = tuple(dict.fromkeys(topics))
    if not unique:
        raise OperationError(ResultCode.BAD_REQUEST, "a durable subscription needs a topic")
    if len(unique) > MAX_TOPICS:
        raise OperationError(ResultCode.LIMIT_EXCEEDED, f"more than {MAX_TOPICS} topics")
    for topic in unique:
        if not isinstance(topic, str) or not valid_channel_name(topic):
            raise OperationError(ResultCode.BAD_REQUEST, f"invalid topic channel {topic!r}")
        if topic.startswith(CHANNEL_PREFIX):
            raise OperationError(
                ResultCode.BAD_REQUEST, f"{topic!r}: a durable subscription is not a topic"
            )
    return unique


class DurableSubscriptions:
    """The durable subscriptions of one engine (see the module docstring)."""

    def __init__(self, registry: ChannelRegistry) -> None:
        self.registry = registry
        self.subs: dict[str, DurableSubscription] = {}
        #: topic channel -> ids of the subscriptions collecting from it
        self.by_topic: dict[str, list[str]] = {}

    def __len__(self) -> int:
        return len(self.subs)

    def get(self, sub_id: str) -> DurableSubscription | None:
        return self.subs.get(sub_id)

    def _options(self) -> ChannelQueueOptions:
        registry = self.registry
        limit = registry.config.limits.max_durable_subscription_messages
        handler = PERSISTENT_HANDLER if PERSISTENT_HANDLER in registry.services.handlers else None
        return ChannelQueueOptions(
            status=QueueStatus.ROUND_ROBIN,
            request_acknowledge=True,
            acknowledge_timeout=0,
            message_limit=limit,
            message_delivery_handler=handler,
        )

    def create(
        self,
        sub_id: str,
        topics: Iterable[str],
        out: list[Outgoing],
        by: Client | None = None,
    ) -> DurableSubscription:
        """Create durable subscription ``sub_id`` (or set the topics of an existing one);
        OperationError when invalid or beyond a limit.  A new one counts for ``by``'s
        user (None: for no one)."""
        unique = _check(sub_id, topics)
        registry = self.registry
        old = self.subs.get(sub_id)
        name = channel_name(sub_id)
        user = by.user if by is not None else None
        if old is None:
            if len(self.subs) >= registry.config.limits.max_durable_subscriptions:
                raise OperationError(ResultCode.LIMIT_EXCEEDED, "too many durable subscriptions")
            registry.quotas.check(user, Kind.DURABLE_SUBSCRIPTION)
            channel = registry.channels.get(name)
            if channel is None:
                base = registry.config.channel_defaults
                options = dataclasses.replace(
                    base,
                    queue=self._options(),
                    allow_multiple_queues=False,
                    allowed_queues=None,
                    destroy_when_empty=False,
                )
                registry.create_channel(name, options, out)
            elif QUEUE_ID not in channel.queues or len(channel.queues) != 1:
                raise OperationError(
                    ResultCode.ALREADY_CREATED, f"channel {name!r} exists and is not one"
                )
            if QUEUE_ID not in registry.channels[name].queues:
                registry.create_queue(name, QUEUE_ID, self._options(), out)
        else:
            self._unlink(old)
        sub = DurableSubscription(sub_id, unique)
        self._link(sub)
        registry.definitions.dsub(sub_id, sub.to_json())
        if old is None:
            registry.quotas.charge(user, Kind.DURABLE_SUBSCRIPTION, dsub_key(sub_id))
        return sub

    def destroy(self, sub_id: str, out: list[Outgoing]) -> None:
        """Remove the subscription, its channel and what it held (404 if unknown)."""
        sub = self.subs.get(sub_id)
        if sub is None:
            raise OperationError(
                ResultCode.NOT_FOUND, f"no durable subscription {sub_id!r}", NackReason.NO_CHANNEL
            )
        self._unlink(sub)
        registry = self.registry
        channel = registry.channels.get(sub.channel)
        if channel is not None:  # first: a crash before the next write leaves a
            registry.remove_channel(channel, out)  # definition without channel (forgotten)
        registry.definitions.forget_dsub(sub_id)
        registry.quotas.release(dsub_key(sub_id))

    def queues_for(self, topic: str) -> list[Queue]:
        """The queues a message pushed into ``topic`` is copied to (a subscription whose
        channel was removed by hand is forgotten here)."""
        ids = self.by_topic.get(topic)
        if not ids:
            return []
        found: list[Queue] = []
        channels = self.registry.channels
        for sub_id in list(ids):
            channel = channels.get(channel_name(sub_id))
            queue = channel.queues.get(QUEUE_ID) if channel is not None else None
            if queue is None:
                log.warning("durable subscription %r lost its channel: forgotten", sub_id)
                self._unlink(self.subs[sub_id])
                self.registry.definitions.forget_dsub(sub_id)
                self.registry.quotas.release(dsub_key(sub_id))
                continue
            found.append(queue)
        return found

    def recover(self, saved: dict[str, Any]) -> int:
        """Bring back the kept definitions whose channel exists (after the channels and
        queues were recovered); returns how many."""
        count = 0
        for sub_id, definition in sorted(saved.items()):
            topics = definition.get("Topics") if isinstance(definition, dict) else None
            try:
                if not isinstance(topics, list):
                    raise OperationError(ResultCode.BAD_REQUEST, "no topic list")
                unique = _check(sub_id, topics)
            except OperationError as exc:
                log.warning("durable subscription %r not recovered: %s", sub_id, exc.reason)
                continue
            channel = self.registry.channels.get(channel_name(sub_id))
            if channel is None or QUEUE_ID not in channel.queues:
                log.warning("durable subscription %r has no channel: forgotten", sub_id)
                self.registry.definitions.forget_dsub(sub_id)
                continue
            self._link(DurableSubscription(sub_id, unique))
            count += 1
        return count

    def listing(self) -> list[dict[str, Any]]:
        """Every subscription with the messages its queue holds (JSON-able), by id."""
        out = []
        for sub_id in sorted(self.subs):
            sub = self.subs[sub_id]
            model = sub.to_json()
            channel = self.registry.channels.get(sub.channel)
            queue = channel.queues.get(QUEUE_ID) if channel is not None else None
            model["Messages"] = queue.message_count if queue is not None else 0
            model["Consumers"] = len(channel.consumers) if channel is not None else 0
            out.append(model)
        return out

    def _link(self, sub: DurableSubscription) -> None:
        self.subs[sub.id] = sub
        for topic in sub.topics:
            self.by_topic.setdefault(topic, []).append(sub.id)

    def _unlink(self, sub: DurableSubscription) -> None:
        self.subs.pop(sub.id, None)
        for topic in sub.topics:
            ids = self.by_topic.get(topic)
            if ids is not None and sub.id in ids:
                ids.remove(sub.id)
                if not ids:
                    del self.by_topic[topic]
