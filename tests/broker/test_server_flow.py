"""The server's side of flow control, against a scripted engine that sends Tracked frames.

A peer that stops reading keeps its session; the engine hears, in order, how many of
each peer's tracked frames libzmq took, and everything before a peer's disconnect.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from broker import tmqp
from broker.engine.engine import Outgoing, Tracked
from broker.protocol import MessageType
from broker.server.server import Server
from tests.broker.test_server_transport import Peer, ScriptedEngine, options
from tests.polling import wait_until

Ctx = zmq.Context[zmq.Socket[bytes]]
BIG = b"x" * 10_000  # socket buffers hold few of these


class BurstEngine(ScriptedEngine):
    """A QUEUE frame ``burst N`` (``tracked`` in its target) answers N frames of 10 kB."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, str, int]] = []  # ("sent", client, n) / ("gone", client, 0)

    def receive(
        self, client_id: str, frame: tmqp.Frame, now: float, data: bytes | None = None
    ) -> list[Any]:
        if frame.message_type != MessageType.QUEUE or not frame.payload.startswith(b"burst"):
            return super().receive(client_id, frame, now)
        kind = Tracked if frame.target == "tracked" else Outgoing
        count = int(frame.payload.split()[1])
        return [
            kind(client_id, tmqp.Frame(message_type=MessageType.QUEUE, target="ch",
                                       payload=b"%d " % i + BIG))
            for i in range(count)
        ]  # fmt: skip

    def transmitted(self, counts: dict[str, int], now: float) -> list[Any]:
        self.log += [("sent", client, n) for client, n in counts.items()]
        return []

    def disconnect(self, client_id: str, now: float) -> list[Any]:
        self.log.append(("gone", client_id, 0))
        return super().disconnect(client_id, now)

    def sent(self, client_id: str) -> int:
        return sum(n for what, c, n in list(self.log) if what == "sent" and c == client_id)


@pytest.fixture
def engine() -> BurstEngine:
    return BurstEngine()


@pytest.fixture
def server(zctx: Ctx, engine: BurstEngine) -> Iterator[Server]:
    # max_backlog=5: the old send path dropped a peer whose backlog passed it
    srv = Server(engine, options(hwm=10, max_backlog=5), context=zctx)
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
def peer(zctx: Ctx, server: Server) -> Iterator[Peer]:
    assert server.endpoint is not None
    p = Peer(zctx, server.endpoint)
    p.sock.rcvhwm = 10
    yield p
    p.close()


def burst(p: Peer, count: int, tracked: bool = True) -> None:
    target = "tracked" if tracked else "plain"
    p.frame(tmqp.Frame(message_type=MessageType.QUEUE, target=target, payload=b"burst %d" % count))


def test_a_peer_that_stops_reading_keeps_its_session(peer: Peer, engine: BurstEngine) -> None:
    peer.handshake()
    burst(peer, 3000)  # about 30 MB: far more than the socket buffers hold
    assert wait_until(lambda: engine.sent("gen-1") > 0)
    assert engine.sent("gen-1") < 3000  # the rest waits in its backlog, not on the wire
    got = [int(peer.recv_frame().payload.split()[0]) for _ in range(3000)]
    assert got == list(range(3000))
    assert wait_until(lambda: engine.sent("gen-1") == 3000)
    assert engine.disconnected == [] and engine.connected == ["gen-1"]


def test_the_engine_hears_what_was_sent_before_the_peer_goes(
    peer: Peer, engine: BurstEngine
) -> None:
    peer.handshake()
    burst(peer, 3000)
    assert wait_until(lambda: engine.sent("gen-1") > 0)
    for _ in range(50):
        peer.recv()
    peer.frame(tmqp.Frame(message_type=MessageType.TERMINATE))
    assert wait_until(lambda: engine.disconnected == ["gen-1"])
    assert engine.log[-1] == ("gone", "gen-1", 0)
    assert 50 <= engine.sent("gen-1") < 3000


def test_other_frames_beyond_the_backlog_limit_are_discarded_and_counted(
    peer: Peer, engine: BurstEngine, server: Server
) -> None:
    peer.handshake()
    burst(peer, 3000, tracked=False)
    assert wait_until(lambda: int(server.stats()["server"]["overflowed"]) > 0)  # type: ignore[index]
    got = 0
    while not peer.silent(0.5):
        peer.recv()
        got += 1
    counters = server.stats()["server"]
    assert isinstance(counters, dict)
    assert got + counters["overflowed"] == 3000
    assert engine.disconnected == []  # discarded frames, kept session
