"""The parts an engine is made of, as one value handed to the operations and routing.

:class:`EngineParts` names them: configuration, authorizer, event hub, the queues'
services (host, timers), the channel registry, the client registry, the router table
and the durable subscriptions.  :class:`broker.engine.Engine` builds one and dispatches
frames to the modules
that work on it (``operations``, ``routing``), which so never import the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.engine.auth import Authorizer
from broker.engine.channels import ChannelRegistry
from broker.engine.clients import ClientRegistry
from broker.engine.dsubs import DurableSubscriptions
from broker.engine.events import EventHub
from broker.engine.host import QueueServices
from broker.engine.options import BrokerConfig
from broker.engine.router import RouterTable


@dataclass(frozen=True, slots=True)
class EngineParts:
    config: BrokerConfig
    authorizer: Authorizer
    events: EventHub
    services: QueueServices
    channels: ChannelRegistry
    clients: ClientRegistry
    routers: RouterTable
    durable: DurableSubscriptions
