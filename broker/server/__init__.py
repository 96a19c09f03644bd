"""The first front door: TMQP frames over a ZeroMQ ROUTER socket (CURVE optional)."""

from broker.server.options import ServerOptions
from broker.server.server import Server

__all__ = ["Server", "ServerOptions"]
