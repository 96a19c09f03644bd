"""Broker clients: the blocking ``Client`` and the asyncio ``AsyncClient``, one session core.

The asyncio client is imported lazily (``broker.client.AsyncClient``), so that the
blocking client does not pay for importing asyncio.
"""

from typing import Any

from broker.client.blocking import Client, Message

__all__ = ["AsyncClient", "Client", "Message"]


def __getattr__(name: str) -> Any:
    if name == "AsyncClient":
        from broker.client.aio import AsyncClient

        return AsyncClient
    raise AttributeError(f"module 'broker.client' has no attribute {name!r}")
