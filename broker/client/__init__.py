"""Broker clients: the blocking ``Client`` and the asyncio ``AsyncClient``, one session core.

The clients are imported lazily, so that the sans-IO modules (``broker.client.session``,
``broker.client.api``, the frame builders) load without ZeroMQ, and the blocking client
without asyncio.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from broker.client.aio import AsyncClient
    from broker.client.blocking import Client, Message

__all__ = ["AsyncClient", "Client", "Message"]

_HOMES = {
    "AsyncClient": "broker.client.aio",
    "Client": "broker.client.blocking",
    "Message": "broker.client.message",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'broker.client' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(home), name)
