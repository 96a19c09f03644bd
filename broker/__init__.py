"""zerohub broker: a ZeroMQ-native message broker speaking TMQP (Twino MQ 3.0 frames).

``broker.Client`` and ``broker.Server`` are imported lazily, so ``import broker.tmqp``
stays cheap (no pyzmq import).  The server binds ``tcp://127.0.0.1:5680`` by default.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from broker.client import Client, Message
    from broker.engine import Engine
    from broker.server import Server, ServerOptions

__all__ = ["Client", "Engine", "Message", "Server", "ServerOptions"]

_LAZY = {
    "Client": "broker.client",
    "Message": "broker.client",
    "Engine": "broker.engine",
    "Server": "broker.server",
    "ServerOptions": "broker.server",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'broker' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
