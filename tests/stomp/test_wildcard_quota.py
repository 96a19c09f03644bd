"""The per-connection cap on STOMP wildcard subscriptions (``max_wildcard_subscriptions``,
default 16, the same as a TMQP client's ``max_pattern_joins``).

The broker holds at most ``max_patterns`` distinct patterns for both doors together; without
a cap of its own one STOMP connection could take them all.  Each wildcard destination a
connection's subscriptions hold counts (a composite counts each wildcard part); past the cap
the SUBSCRIBE is an ERROR carrying its ``receipt-id``, the backend is never asked, and the
connection closes like any crossed limit.  UNSUBSCRIBE frees, and a connection gone (asked,
reset) holds nothing; every connection has its own quota.

Sans-IO sessions on the in-memory backend, a real STOMP listener and TMQP server on one
engine over loopback (``tests.stomp.two_doors``), and ``broker serve``'s ``[stomp]`` key.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable, Iterator

import pytest
import zmq

from broker.stomp.errors import BackendError
from broker.stomp.frames import Command
from broker.stomp.memory import MemoryBackend
from broker.stomp.session import SessionConfig
from broker.stomp.subscription import SubscriptionSpec
from tests.broker.test_pattern_doors import Stomp, _patterns, _receipted, _refused
from tests.polling import wait_until
from tests.stomp.test_listener import Raw
from tests.stomp.test_serve import Serve, serve_factory
from tests.stomp.two_doors import Broker

from .kit import Peer, World
from .test_session import assert_error_then_close

__all__ = ["serve_factory"]  # (the fixture, imported for pytest)

Ctx = zmq.Context[zmq.Socket[bytes]]
DEFAULT = SessionConfig().max_wildcard_subscriptions


class CountingBackend(MemoryBackend):
    """The in-memory backend, counting the subscriptions it was asked for; ``refuse``:
    the next subscribe raises BackendError (the broker could not take it)."""

    def __init__(self) -> None:
        super().__init__()
        self.subscribed: list[str] = []
        self.refuse = False

    def subscribe(self, connection_id: int, spec: SubscriptionSpec) -> None:
        if self.refuse:
            self.refuse = False
            raise BackendError("the broker holds too many patterns")
        self.subscribed.append(spec.id)
        super().subscribe(connection_id, spec)


def _world(cap: int | None = None) -> tuple[World, CountingBackend]:
    config = SessionConfig() if cap is None else SessionConfig(max_wildcard_subscriptions=cap)
    world = World(config=config)
    backend = world.backend = CountingBackend()
    return world, backend


def _subscribe(peer: Peer, sub: str, destination: str) -> None:
    peer.send(Command.SUBSCRIBE, {"id": sub, "destination": destination, "receipt": f"r-{sub}"})


def _accepted(peer: Peer, sub: str, destination: str) -> None:
    _subscribe(peer, sub, destination)
    assert peer.read_one(Command.RECEIPT).header("receipt-id") == f"r-{sub}"


# -- sans-IO --------------------------------------------------------------------------------


def test_the_default_cap_is_16_and_plain_subscriptions_do_not_count() -> None:
    assert DEFAULT == 16
    world, backend = _world()
    peer = world.connected()
    for i in range(DEFAULT):
        _accepted(peer, f"w{i}", f"/topic/w{i}.*")
    for i in range(5):  # plain ones: no pattern, not counted
        _accepted(peer, f"p{i}", f"/queue/plain{i}")
    _subscribe(peer, "late", "/queue/late.**")
    error = peer.read_one(Command.ERROR)
    assert error.header("receipt-id") == "r-late"
    assert "max_wildcard_subscriptions=16" in (error.header("message") or "")
    assert "late" not in backend.subscribed  # nothing half-attached
    assert len(backend.subscribed) == DEFAULT + 5


def test_past_the_cap_an_error_with_the_receipt_then_the_close() -> None:
    world, backend = _world(cap=2)
    peer = world.connected()
    _accepted(peer, "a", "/topic/a.*")
    _accepted(peer, "b", "/queue/b.{[0-9]+}")
    _subscribe(peer, "c", "/topic/c.*")
    assert_error_then_close(peer, "max_wildcard_subscriptions=2")
    assert backend.subscribed == ["a", "b"]


def test_a_composite_counts_each_wildcard_part() -> None:
    world, backend = _world(cap=4)
    peer = world.connected()
    _accepted(peer, "three", "/topic/a.*,/queue/plain,/topic/b.**,/queue/c*")
    _subscribe(peer, "two", "/topic/d.*,/topic/e.*")  # 3 + 2 > 4: refused whole
    error = peer.read_one(Command.ERROR)
    assert error.header("receipt-id") == "r-two"
    assert "held 3, this one has 2" in (error.header("message") or "")
    assert backend.subscribed == ["three"]
    other = world.connected()
    _accepted(other, "four", "/topic/a.*,/topic/b.*,/topic/c.*,/topic/d.*")  # exactly the cap
    _subscribe(other, "five", "/queue/plain,/topic/e.*")
    assert_error_then_close(other, "max_wildcard_subscriptions=4")


def test_unsubscribe_frees_and_a_refused_backend_charges_nothing() -> None:
    world, backend = _world(cap=2)
    peer = world.connected()
    _accepted(peer, "a", "/topic/a.*,/topic/b.*")
    peer.send(Command.UNSUBSCRIBE, {"id": "a", "receipt": "u"})
    assert peer.read_one(Command.RECEIPT).header("receipt-id") == "u"
    _accepted(peer, "b", "/topic/c.*")
    backend.refuse = True  # the broker-wide budget is full: an ERROR, nothing held
    _subscribe(peer, "full", "/topic/d.*")
    assert peer.read_one(Command.ERROR).header("receipt-id") == "r-full"
    again = world.connected()  # (the refused one closed; count on a fresh one)
    _accepted(again, "x", "/topic/x.*")
    backend.refuse = True
    _subscribe(again, "y", "/topic/y.*")
    peer_error = again.read_one(Command.ERROR)
    assert "too many patterns" in (peer_error.header("message") or "")
    assert again.session._wildcards == 1  # the refused one was not charged


def test_a_1_0_unsubscribe_by_destination_frees() -> None:
    from broker.stomp.frames import Version

    world, _ = _world(cap=1)
    peer = world.connected(Version.V1_0)
    peer.send(Command.SUBSCRIBE, {"destination": "/topic/a.*", "receipt": "s1"})
    assert peer.read_one(Command.RECEIPT).header("receipt-id") == "s1"
    peer.send(Command.UNSUBSCRIBE, {"destination": "/topic/a.*", "receipt": "u1"})
    assert peer.read_one(Command.RECEIPT).header("receipt-id") == "u1"
    peer.send(Command.SUBSCRIBE, {"destination": "/topic/b.*", "receipt": "s2"})
    assert peer.read_one(Command.RECEIPT).header("receipt-id") == "s2"


def test_every_connection_has_its_own_quota() -> None:
    world, backend = _world(cap=3)
    first, second = world.connected(), world.connected()
    for i in range(3):
        _accepted(first, f"f{i}", f"/topic/f{i}.*")
    for i in range(3):  # the first is full; the second still has all of its own
        _accepted(second, f"s{i}", f"/topic/s{i}.*")
    _subscribe(first, "f3", "/topic/f3.*")
    assert_error_then_close(first, "max_wildcard_subscriptions=3")
    _subscribe(second, "s3", "/topic/s3.*")
    assert_error_then_close(second, "max_wildcard_subscriptions=3")
    assert len(backend.subscribed) == 6


# -- a real listener and TMQP server on one engine ------------------------------------------


@pytest.fixture
def doors(zctx: Ctx) -> Iterator[Broker]:
    made = Broker(zctx)
    yield made
    made.stop()


@pytest.fixture
def stomps(doors: Broker) -> Iterator[Callable[[], Stomp]]:
    made: list[Stomp] = []

    def make() -> Stomp:
        conn = Stomp(doors.listener.port)
        made.append(conn)
        return conn

    yield make
    for conn in made:
        conn.close()


def _closed_by_server(conn: Stomp) -> bool:
    try:
        while conn.sock.recv(65536):
            pass
    except (TimeoutError, ConnectionResetError):
        return False
    return True


def test_one_connection_full_a_second_gets_its_own_then_refused_alike(
    doors: Broker, stomps: Callable[[], Stomp]
) -> None:
    first, second = stomps(), stomps()
    # a composite with two wildcards and a plain part counts two
    assert _receipted(first.subscribe("c", "/topic/c1.*,/queue/plain,/topic/c2.**"), "c")
    for i in range(DEFAULT - 2):
        assert _receipted(first.subscribe(f"f{i}", f"/queue/f{i}.*"), f"f{i}")
    assert _receipted(first.subscribe("plain", "/queue/not.a.pattern"), "plain")
    assert _patterns(doors) == DEFAULT
    for i in range(DEFAULT):  # the first is full; the second has its own 16
        assert _receipted(second.subscribe(f"s{i}", f"/topic/s{i}.*"), f"s{i}")
    assert _patterns(doors) == 2 * DEFAULT
    answer = first.subscribe("late", "/topic/late.*")
    assert _refused(answer, "late"), answer
    assert b"max_wildcard_subscriptions=16" in answer
    assert _closed_by_server(first)
    # nothing of the refused one was held, and the first's 16 went with it
    assert wait_until(lambda: _patterns(doors) == DEFAULT)
    answer = second.subscribe("late", "/topic/late.*,/topic/later.*")
    assert _refused(answer, "late"), answer
    assert wait_until(lambda: _patterns(doors) == 0)


def test_unsubscribe_frees_one_and_a_reset_frees_all(
    doors: Broker, stomps: Callable[[], Stomp]
) -> None:
    holder = stomps()
    for i in range(DEFAULT):
        assert _receipted(holder.subscribe(f"h{i}", f"/topic/h{i}.*"), f"h{i}")
    holder.unsubscribe("h0")
    assert _receipted(holder.subscribe("back", "/topic/back.*"), "back")
    assert _patterns(doors) == DEFAULT
    # the connection reset (RST, no DISCONNECT): its patterns go, a new one starts empty
    holder.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    holder.close()
    assert wait_until(lambda: _patterns(doors) == 0)
    fresh = stomps()
    for i in range(DEFAULT):
        assert _receipted(fresh.subscribe(f"n{i}", f"/topic/h{i}.*"), f"n{i}")
    fresh.send(b"DISCONNECT\nreceipt:bye\n\n\x00")
    assert fresh.next_frame().startswith(b"RECEIPT\nreceipt-id:bye")
    assert wait_until(lambda: _patterns(doors) == 0)


# -- broker serve: the [stomp] key --------------------------------------------------------


def test_the_config_key_sets_the_cap(serve_factory: Callable[..., Serve]) -> None:
    server = serve_factory(config="[stomp]\nmax_wildcard_subscriptions = 2\n")
    greedy = Raw(server.port)
    try:
        greedy.connect()
        greedy.send(b"SUBSCRIBE\nid:a\ndestination:/topic/a.*,/queue/b.*\nreceipt:ra\n\n\x00")
        assert greedy.next().header("receipt-id") == "ra"
        greedy.send(b"SUBSCRIBE\nid:p\ndestination:/queue/plain\nreceipt:rp\n\n\x00")
        assert greedy.next().header("receipt-id") == "rp"
        greedy.send(b"SUBSCRIBE\nid:c\ndestination:/topic/c.*\nreceipt:rc\n\n\x00")
        error = greedy.next()
        assert error.command is Command.ERROR and error.header("receipt-id") == "rc"
        assert "max_wildcard_subscriptions=2" in str(error.header("message"))
        assert greedy.closed_by_server()
    finally:
        greedy.close()
