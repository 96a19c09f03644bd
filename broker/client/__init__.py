"""Broker clients: the blocking ``Client`` and the asyncio ``AsyncClient``."""

from broker.client.blocking import Client, Message

__all__ = ["Client", "Message"]
