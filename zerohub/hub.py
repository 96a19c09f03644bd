"""One process serving files and messages: a FILEMQ server and the broker on one context.

The composition sits above both packages (``filemq`` and ``broker`` never import each
other); ``zerohub serve`` (:mod:`zerohub.main`) runs it from the command line.  Both
sockets are bound before a published directory is walked or hashed, so an endpoint
in use fails at once and nothing was done for nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.server.server import Server
from filemq.live import LiveFileServer

__all__ = ["Hub", "HubEndpoints"]


@dataclass(frozen=True, slots=True)
class HubEndpoints:
    """Where the hub listens (the bound endpoints: a ``*`` port is resolved)."""

    files: str
    broker: str


class Hub:
    """A :class:`LiveFileServer` and a broker :class:`Server`, started and stopped together.

    Both are built by the caller on the same ZeroMQ context (injected; the caller
    terminates it after :meth:`stop`).
    """

    def __init__(self, files: LiveFileServer, broker: Server) -> None:
        self.files = files
        self.broker = broker

    def start(self) -> HubEndpoints:
        """Bind both sockets, then start serving (walks and hashes the published trees).

        Raises what the file server or the broker raises when a bind fails; whatever was
        started by then is stopped again.
        """
        try:
            server = self.files.server
            files_endpoint = server.bind()
            broker_endpoint = self.broker.start()
            self.files.start()
        except BaseException:
            self.stop()
            raise
        return HubEndpoints(files=files_endpoint, broker=broker_endpoint)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop both (idempotent): the file server first, then the broker."""
        try:
            self.files.stop(timeout)
        finally:
            self.broker.stop(timeout)
