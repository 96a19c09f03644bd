"""How STOMP destinations map onto the engine's channels and queues (engine backend).

``/queue/NAME`` is channel ``NAME``, ``/topic/NAME`` channel ``/topic/NAME``, ``/dsub/ID``
channel ``/dsub/ID`` (the whole mapping: ``broker.stomp.engine_backend``) on the default
virtual host; on virtual host ``V`` (its namespace, ``broker.stomp.vhosts``) the name or
id gets the prefix ``V/``: channels ``V/NAME``, ``/topic/V/NAME``, ``/dsub/V/ID`` (durable
subscription ``V/ID``).  No STOMP name holds a ``/`` nor does a virtual host's name, so the
first ``/`` after the kind's prefix ends the namespace: no two destinations share a channel.
The options a
STOMP-made queue gets; the headers the broker adds to a STOMP SEND and those a SEND may not
carry.  Pure functions and constants: no thread, no engine state.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from broker.engine import dsubs, tmqp_door
from broker.engine.options import ChannelOptions, ChannelQueueOptions
from broker.engine.per_message import PER_MESSAGE
from broker.message import Headers, Message
from broker.protocol import QueueStatus
from broker.stomp.destinations import Destination, DestinationKind, temp_owner
from broker.stomp.errors import BackendError
from zproto.errors import EncodeError

#: Queue id of every channel a STOMP destination maps to.
QUEUE_ID = 0
#: Options of a queue created for ``/queue/NAME``: one consumer per message, acknowledged.
#: Its delivery handler reads ``persistent``/``expires`` per message (``per_message``).
QUEUE_OPTIONS = ChannelQueueOptions(
    status=QueueStatus.ROUND_ROBIN,
    request_acknowledge=True,
    acknowledge_timeout=0,
    message_delivery_handler=PER_MESSAGE,
)
#: Options of a queue created for ``/topic/NAME``: a copy to every consumer online.
TOPIC_OPTIONS = ChannelQueueOptions(status=QueueStatus.BROADCAST)
#: Headers a STOMP SEND gets on the engine: its sender's user id and when the broker
#: received it (ms since the epoch), for ``add_user_header``/``add_timestamp_header``.
USER_HEADER = "Stomp-User"
TIMESTAMP_HEADER = "Stomp-Timestamp"
#: Header the engine thread adds to a queue delivery for an ``include-seq`` subscription:
#: the message's sequence in its queue (read into ``Delivery.sequence``, never shown).
SEQ_HEADER = "Stomp-Seq"
USER_KEY = USER_HEADER.lower()
SEQ_KEY = SEQ_HEADER.lower()
#: Engine headers a STOMP consumer does not see as user headers (read into the delivery).
HIDDEN_HEADERS = frozenset({"delivery-count", USER_KEY, TIMESTAMP_HEADER.lower(), SEQ_KEY})
#: The user id of a connection without ``login``.
ANONYMOUS = "anonymous"
#: Headers a STOMP SEND may not carry: the engine acts on them, or the broker sets them.
_RESERVED = frozenset({"cc", "delivery-count", USER_KEY, TIMESTAMP_HEADER.lower(), SEQ_KEY})


def check_headers(headers: Headers) -> None:
    """Refuse (BackendError) SEND headers a TMQP client could not receive (a name holding
    ``:`` or a value holding a line break, after STOMP unescaping; more than a TMQP
    header block holds) or that the engine would act on (``CC``, ``Delivery-Count``)."""
    if not headers:
        return  # nothing to refuse (the common SEND: only control headers)
    for key, _value in headers:
        if key.lower() in _RESERVED:
            raise BackendError(f"header {key!r} is reserved by the broker")
    try:
        tmqp_door.encode(Message("m", "s", "c", headers=headers))
    except EncodeError as exc:
        raise BackendError(f"headers cannot be carried to every client: {exc}") from None


#: Topic channels are named after their STOMP destination (queue channels: the bare name).
TOPIC_CHANNEL_PREFIX = "/topic/"


#: Separates a virtual host's namespace from the name on the engine (``V/NAME``).
NAMESPACE_SEPARATOR = "/"


def engine_name(namespace: str, name: str) -> str:
    """A destination's name (or a durable subscription's id) on the engine: ``name`` in
    the default namespace, else ``namespace/name``."""
    return name if not namespace else namespace + NAMESPACE_SEPARATOR + name


def channel_of(destination: Destination) -> str:
    """The engine channel a (non-wildcard) STOMP destination maps to."""
    name = destination.name
    if destination.namespace:  # (engine_name, inlined: a door maps every SEND)
        name = destination.namespace + NAMESPACE_SEPARATOR + name
    if destination.kind is DestinationKind.TOPIC:
        return TOPIC_CHANNEL_PREFIX + name
    if destination.kind is DestinationKind.DSUB:
        return dsubs.channel_name(name)
    return name


def destination_of(channel: str) -> Destination:
    """The STOMP destination of an engine channel (the inverse of :func:`channel_of`)."""
    if channel.startswith(TOPIC_CHANNEL_PREFIX):
        kind, rest = DestinationKind.TOPIC, channel[len(TOPIC_CHANNEL_PREFIX) :]
    elif channel.startswith(dsubs.CHANNEL_PREFIX):
        kind, rest = DestinationKind.DSUB, channel[len(dsubs.CHANNEL_PREFIX) :]
    else:
        kind, rest = DestinationKind.QUEUE, channel
    namespace, separator, name = rest.partition(NAMESPACE_SEPARATOR)
    if not separator:
        return Destination(kind, rest)
    return Destination(kind, name, namespace=namespace)


def in_namespace(destinations: tuple[Destination, ...], namespace: str) -> tuple[Destination, ...]:
    """``destinations`` (parsed in the default namespace) named in ``namespace``."""
    if not namespace:
        return destinations
    return tuple(dataclasses.replace(d, namespace=namespace) for d in destinations)


def wildcard_matches(pattern: Destination, channel: str, conn: int) -> bool:
    """Does wildcard ``pattern`` (of connection ``conn``) match an engine channel?  Never
    another connection's temporary destination, nor another virtual host's channel."""
    destination = destination_of(channel)
    owner = temp_owner(destination.name)
    if owner is not None and owner[1] != conn:
        return False
    return pattern.matches(destination.kind, destination.name, destination.namespace)


def channel_rest(base: ChannelOptions) -> dict[str, Any]:
    """A channel's options other than its queue defaults (to build a STOMP channel)."""
    return {
        "allow_multiple_queues": base.allow_multiple_queues,
        "allowed_queues": base.allowed_queues,
        "event_handler": base.event_handler,
        "authenticator": base.authenticator,
        "client_limit": base.client_limit,
        "queue_limit": base.queue_limit,
        "destroy_when_empty": base.destroy_when_empty,
    }
