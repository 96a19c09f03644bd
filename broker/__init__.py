"""zerohub broker: a ZeroMQ-native message broker speaking TMQP (Twino MQ 3.0 frames).

``broker.Client`` and ``broker.Server`` are imported lazily, so ``import broker.tmqp``
stays cheap (no pyzmq import).  The server binds ``tcp://127.0.0.1:5680`` by default.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from broker.client.aio import AsyncClient
    from broker.client.blocking import Client, Message
    from broker.engine.engine import Engine
    from broker.sequence import Browsed, SequenceBounds
    from broker.server.server import Server, ServerOptions

__all__ = [
    "AsyncClient",
    "Browsed",
    "Client",
    "Engine",
    "Message",
    "SequenceBounds",
    "Server",
    "ServerOptions",
]

_LAZY = {
    "AsyncClient": "broker.client.aio",
    "Client": "broker.client.blocking",
    "Message": "broker.client.blocking",
    "Engine": "broker.engine.engine",
    "Browsed": "broker.sequence",
    "SequenceBounds": "broker.sequence",
    "Server": "broker.server.server",
    "ServerOptions": "broker.server.server",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'broker' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
