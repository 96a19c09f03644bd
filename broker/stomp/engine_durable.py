"""Durable subscriptions from STOMP (``persistent:true`` with ``id``, ``/dsub/ID``) on the
engine's ``broker.engine.dsubs``: what a SUBSCRIBE may ask for, and the channel of an
existing one.  The engine thread's operations are ``EngineDoor.op_subscribe_durable`` and
``EngineDoor.op_destroy_durable``.
"""

from __future__ import annotations

from broker.engine.engine import Engine
from broker.stomp.destinations import Destination, DestinationKind
from broker.stomp.engine_mapping import channel_of, engine_name
from broker.stomp.errors import BackendError
from broker.stomp.subscription import SubscriptionSpec


def durable_plan(
    spec: SubscriptionSpec, namespace: str = ""
) -> tuple[list[Destination], Destination]:
    """The topics a ``persistent:true`` SUBSCRIBE names (none: it addresses an existing
    subscription by ``/dsub/<id>``) and the destination its deliveries show (the topic
    when there is one, else ``/dsub/<id>``), its destinations named in ``namespace`` (the
    connection's virtual host's).  BackendError for what the engine cannot do."""
    topics = [d for d in spec.destinations if d.kind is DestinationKind.TOPIC]
    others = [d for d in spec.destinations if d.kind is not DestinationKind.TOPIC]
    if any(d.wildcard for d in spec.destinations):
        raise BackendError("a durable subscription takes no wildcard destinations (engine)")
    if spec.selector is not None:
        raise BackendError("a durable subscription takes no selector (engine)")
    own = Destination(DestinationKind.DSUB, spec.id, namespace=namespace)
    if others and (topics or others != [own]):
        raise BackendError("a durable subscription needs /topic/ destinations")
    shown = topics[0] if len(topics) == 1 else own
    return topics, shown


def existing_channel(engine: Engine, destination: Destination) -> str:
    """The channel of an existing durable subscription (BackendError if none)."""
    if engine.durable.get(engine_name(destination.namespace, destination.name)) is None:
        raise BackendError(f"no durable subscription {destination.name!r}")
    return channel_of(destination)
