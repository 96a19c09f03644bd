"""Real ``broker serve`` processes for the federation tests (restartable, same port)."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any

import zmq

from broker.client.blocking import Client
from tests.broker.test_cli import start_serve
from tests.polling import wait_until
from tests.ports import free_port


class Broker:
    """One ``broker serve`` with a fixed id and port; ``start``/``kill``/``stop``."""

    def __init__(self, broker_id: str, *args: str, data: Path | None = None) -> None:
        self.id = broker_id
        self.port = free_port()  # (never another Broker's: tests/ports.py)
        self.endpoint = f"tcp://127.0.0.1:{self.port}"
        self.args = list(args)
        self.data = data
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *more: str) -> Broker:
        args = ["--bind", self.endpoint, "--broker-id", self.id, "--federate", *self.args]
        if self.data is not None:
            args += ["--data", str(self.data)]
        self.proc = start_serve(*args, *more)
        return self

    def link(self, other: Broker, query: str = "") -> str:
        """The ``--link`` value toward ``other``."""
        return f"--link={other.endpoint}{query}"

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
            self.proc = None

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(20)
        self.proc = None
        return code

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def client(self, zctx: zmq.Context[zmq.Socket[bytes]], **options: Any) -> Client:
        return Client(self.endpoint, context=zctx, timeout=10, **options).connect()


def linked_pair(brokers: list[Broker], data: Path) -> tuple[Broker, Broker]:
    """Brokers A and B with data dirs under ``data``, B started, then A linked to B
    (both added to ``brokers``, the fixture that kills what is left at the end)."""
    a = Broker("A", data=data / "a")
    b = Broker("B", data=data / "b")
    brokers += [a, b]
    b.start()
    a.start(a.link(b))
    return a, b


def consumers(client: Client, channel: str) -> int:
    """Consumers of ``channel`` (the federation client included), 0 if it is missing."""
    try:
        return int(client.channel_info(channel)["ActiveClients"])
    except Exception:
        return 0


def wait_joined(clients: list[Client], channel: str, count: int = 2) -> None:
    """Until each broker's channel has ``count`` consumers (its subscriber and its
    federation client, which joins once a linked broker asked for the channel)."""
    for c in clients:
        assert wait_until(lambda c=c: consumers(c, channel) >= count, timeout=20), (
            f"{channel} never got {count} consumers on {c.endpoint}"
        )


def federation_stats(client: Client) -> dict[str, Any]:
    """The broker's federation statistics (its federation client answers STATS)."""
    from broker.federation.wire import FEDERATION_CLIENT, STATS

    answer = client.request(FEDERATION_CLIENT, b"", content_type=STATS, timeout=10)
    stats: dict[str, Any] = answer.json()
    return stats


def stats_or_none(client: Client) -> dict[str, Any] | None:
    """The federation statistics, None while the federation client is not connected yet
    (it connects once its broker serves)."""
    from broker.client.blocking import RemoteError

    try:
        return federation_stats(client)
    except RemoteError as exc:
        if exc.code != 404:
            raise
        return None


def wait_interest(client: Client, peers: set[str], channel: str) -> None:
    """Until the broker heard from each of ``peers`` that it wants ``channel``."""

    def heard() -> bool:
        stats = stats_or_none(client)
        if stats is None:
            return False
        known = stats["peers"]
        return all(
            p in known and known[p]["up"] and channel in known[p]["interest"] for p in peers
        )

    assert wait_until(heard, timeout=20), (
        f"{channel}: interest of {peers} never heard: {federation_stats(client)}"
    )
