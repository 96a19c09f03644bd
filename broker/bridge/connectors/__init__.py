"""One small connector per remote protocol, each over its ecosystem's client library.

A connector is used by one thread only (the bridge driver's) and follows
:class:`Connector`: ``open`` connects (and subscribes the inbound routes) or raises
``ConnectorError``; ``publish`` sends (flagging a ``resent`` copy where the protocol has
headers: ``broker.bridge.core.RESENT_HEADER``) and later reports ``RemoteAccepted`` or
``RemoteRefused`` to the sink; inbound deliveries are reported as ``RemoteMessage`` and
acknowledged by ``ack(ref)``; ``pump`` runs the network for a while and raises
``ConnectorError`` once the connection is gone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from broker.bridge.events import Event

Sink = Callable[[Event], None]


class Connector(Protocol):
    def open(self, sink: Sink, generation: int, timeout: float) -> None: ...

    def publish(self, token: int, remote: str, payload: bytes, resent: bool = False) -> None: ...

    def ack(self, ref: Any) -> None: ...

    def pump(self, timeout: float) -> None: ...

    def close(self) -> None: ...
