"""The sans-IO STOMP session with a fake clock and the in-memory backend."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.stomp.backend import STORE_FAILED, Refusal
from broker.stomp.errors import BackendError
from broker.stomp.frames import Command, Frame, Version, make_frame, serialize
from broker.stomp.memory import MemoryBackend
from broker.stomp.session import Credentials, SessionConfig, SessionState, VirtualHost

from .kit import WALL_MS, Peer, World

V10, V11, V12 = Version.V1_0, Version.V1_1, Version.V1_2
CONNECT_12 = {"accept-version": "1.2", "host": "localhost"}


def assert_error_then_close(peer: Peer, match: str) -> None:
    assert_error_then_close_after(peer, peer.read_one(Command.ERROR), match)


def assert_error_then_close_after(peer: Peer, error: Frame, match: str) -> None:
    assert match in (error.header("message") or ""), error
    assert peer.session.state is SessionState.CLOSING
    peer.send(Command.SEND, {"destination": "/queue/ignored"}, b"x")
    assert peer.read() == []  # input after ERROR is ignored
    deadline = peer.session.next_deadline()
    assert deadline is not None
    peer.clock.now = deadline - 0.001
    peer.tick()
    assert not peer.session.closed
    peer.clock.now = deadline
    peer.tick()
    assert peer.session.closed


# -- CONNECT -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("offered", "chosen"),
    [("1.0", "1.0"), ("1.1", "1.1"), ("1.0,1.1", "1.1"), ("1.1,1.2,2.0", "1.2"), ("1.2", "1.2")],
)
def test_version_negotiation_picks_the_highest_common(offered: str, chosen: str) -> None:
    peer = World().peer()
    peer.send(Command.CONNECT, {"accept-version": offered, "host": "localhost"})
    connected = peer.read_one(Command.CONNECTED)
    assert connected.header("version") == chosen
    assert connected.header("session") == "1"


def test_no_accept_version_is_1_0_without_version_or_heartbeat_headers() -> None:
    peer = World().peer(V10)
    peer.send(Command.CONNECT, {})
    connected = peer.read_one(Command.CONNECTED)
    assert connected.header("version") is None
    assert connected.header("heart-beat") is None
    assert peer.session.version is V10


def test_no_common_version_gets_error_listing_ours() -> None:
    peer = World().peer()
    peer.send(Command.CONNECT, {"accept-version": "2.0,3.1", "host": "localhost"})
    error = peer.read()[0]
    assert error.header("version") == "1.0,1.1,1.2"
    assert peer.session.state is SessionState.CLOSING


def test_stomp_frame_connects_like_connect() -> None:
    peer = World().peer()
    peer.send(Command.STOMP, {"accept-version": "1.2", "host": "127.0.0.1"})
    assert peer.read_one(Command.CONNECTED).header("version") == "1.2"


def test_unknown_virtual_host_is_refused_on_1_1_but_1_0_gets_the_first() -> None:
    world = World(config=SessionConfig(virtual_hosts=(VirtualHost("v1", ("a.example",)),)))
    peer = world.peer()
    peer.send(Command.CONNECT, {"accept-version": "1.1", "host": "b.example"})
    assert_error_then_close(peer, "unknown virtual host")
    old = world.peer(V10)
    old.send(Command.CONNECT, {"host": "b.example"})
    old.read_one(Command.CONNECTED)
    assert old.session.info is not None and old.session.info.virtual_host == "v1"


def test_missing_host_is_refused_when_required() -> None:
    world = World(config=SessionConfig(require_host=True))
    peer = world.peer()
    peer.send(Command.CONNECT, {"accept-version": "1.2"})
    assert_error_then_close(peer, "needs a host header")
    lenient = World().peer()
    lenient.send(Command.CONNECT, {"accept-version": "1.2"})
    lenient.read_one(Command.CONNECTED)


def test_authenticator_sees_credentials_and_can_refuse() -> None:
    seen: list[Credentials] = []

    def only_admin(credentials: Credentials) -> str | None:
        seen.append(credentials)
        return "admin" if (credentials.login, credentials.passcode) == ("admin", "pw") else None

    world = World(authenticator=only_admin)
    ok = world.peer()
    ok.connect(login="admin", passcode="pw")
    assert ok.session.info is not None and ok.session.info.user == "admin"
    bad = world.peer()
    bad.send(Command.CONNECT, {"accept-version": "1.2", "host": "localhost", "login": "admin"})
    assert_error_then_close(bad, "authentication failed")
    assert [c.login for c in seen] == ["admin", "admin"]
    assert seen[1].passcode is None
    assert world.backend.connections == 1


def test_first_frame_must_be_connect() -> None:
    peer = World().peer()
    peer.send(Command.SEND, {"destination": "/queue/a"}, b"x")
    assert_error_then_close(peer, "expected CONNECT")


def test_connect_timeout() -> None:
    world = World(config=SessionConfig(connect_timeout=5.0))
    peer = world.peer()
    world.clock.advance(4.9)
    peer.tick()
    assert peer.read() == []
    world.clock.advance(0.1)
    peer.tick()
    assert_error_then_close(peer, "no CONNECT")


# -- heart-beats ---------------------------------------------------------------------------


def test_heartbeat_negotiation_and_schedule() -> None:
    world = World(config=SessionConfig(heartbeat=(500, 2000), heartbeat_grace=2.0))
    peer = world.peer()
    peer.send(Command.CONNECT, {**CONNECT_12, "heart-beat": "1000,300"})
    connected = peer.read_one(Command.CONNECTED)
    assert connected.header("heart-beat") == "500,2000"
    # we send every max(500, 300) = 500 ms; the client must send every max(1000, 2000) ms
    start = world.clock.now
    world.clock.now = start + 0.499
    peer.tick()
    assert peer.read() == [] and peer.heartbeats == 0
    world.clock.now = start + 0.5
    peer.tick()
    peer.read()
    assert peer.heartbeats == 1
    # the client stays alive with bytes (an EOL is enough) before 2 s * grace 2 = 4 s
    world.clock.now = start + 3.9
    peer.send_bytes(b"\n")
    world.clock.now = start + 7.8
    peer.tick()
    assert not peer.session.closed
    world.clock.now = start + 3.9 + 4.0
    peer.tick()
    assert peer.session.closed
    assert "heart-beat" in (peer.session.error or "")


def test_heartbeat_zero_disables_and_1_0_has_none() -> None:
    world = World(config=SessionConfig(heartbeat=(500, 500)))
    peer = world.peer()
    peer.send(Command.CONNECT, {"accept-version": "1.2", "host": "localhost", "heart-beat": "0,0"})
    peer.read()
    assert peer.session.next_deadline() is None
    old = world.peer(V10)
    old.send(Command.CONNECT, {"heart-beat": "10,10"})
    old.read()
    assert old.session.next_deadline() is None


def test_bad_heartbeat_header() -> None:
    peer = World().peer()
    peer.send(Command.CONNECT, {**CONNECT_12, "heart-beat": "fast"})
    assert_error_then_close(peer, "heart-beat")


def test_no_heartbeat_while_other_output_pending() -> None:
    world = World(config=SessionConfig(heartbeat=(100, 0)))
    peer = world.connected(heart_beat="0,100")
    world.clock.advance(1.0)
    peer.send(Command.SEND, {"destination": "/queue/a", "receipt": "r"}, b"x")
    peer.tick()
    assert [f.command for f in peer.read()] == [Command.RECEIPT]
    assert peer.heartbeats == 0


# -- receipts, errors ----------------------------------------------------------------------


def test_receipt_for_every_frame_kind() -> None:
    peer = World().connected()
    peer.send(Command.SUBSCRIBE, {"id": "s", "destination": "/topic/t", "receipt": "1"})
    peer.send(Command.BEGIN, {"transaction": "tx", "receipt": "2"})
    peer.send(Command.ABORT, {"transaction": "tx", "receipt": "3"})
    peer.send(Command.UNSUBSCRIBE, {"id": "s", "receipt": "4"})
    peer.send(Command.DISCONNECT, {"receipt": "5"})
    assert [f.header("receipt-id") for f in peer.read()] == ["1", "2", "3", "4", "5"]
    assert peer.session.closed


def test_error_carries_receipt_id_of_the_frame_that_caused_it() -> None:
    peer = World().connected()
    peer.send(Command.SEND, {"destination": "/nowhere/a", "receipt": "77"}, b"x")
    error = peer.read_one(Command.ERROR)
    assert error.header("receipt-id") == "77"
    assert b"/queue/" in error.body


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b"\x00\xff\xfegarbage\n\n\x00", "unknown command"),
        (b"HELLO\n\n\x00", "unknown command"),
        (b"SEND\ndestination:/queue/a\nk:\x00\n\n\x00", "NUL"),
        (b"SEND\ncontent-length:1073741824\n\n", "max_body"),
        (b"SEND\nk:v\\tx\n\n\x00", "undefined escape"),
        (b"CONNECTED\n\n\x00", "unexpected command"),
    ],
)
def test_bad_bytes_get_one_error_then_close(raw: bytes, match: str) -> None:
    peer = World().connected()
    peer.send_bytes(raw)
    assert_error_then_close(peer, match)


def test_error_closes_nothing_for_the_others_and_loses_nothing() -> None:
    world = World()
    good = world.connected()
    good.send(Command.SEND, {"destination": "/queue/q", "receipt": "r"}, b"kept")
    good.read()
    bad = world.connected()
    bad.send(Command.SUBSCRIBE, {"id": "s", "destination": "/queue/q", "ack": "client"})
    assert bad.read()[0].body == b"kept"
    bad.send_bytes(b"junk\n\n\x00")
    bad.read()
    world.clock.advance(1.0)
    bad.tick()
    assert bad.session.closed
    bad.session.connection_lost()
    good.send(Command.SUBSCRIBE, {"id": "s", "destination": "/queue/q"})
    (message,) = good.read()
    assert message.body == b"kept"


# -- subscriptions and acks ----------------------------------------------------------------


def test_subscribe_needs_id_on_1_1_but_not_on_1_0() -> None:
    world = World()
    new = world.connected(V11)
    new.send(Command.SUBSCRIBE, {"destination": "/queue/a"})
    assert_error_then_close(new, "needs an id")
    old = world.connected(V10)
    old.send(Command.SUBSCRIBE, {"destination": "/queue/a"})
    old.send(Command.SEND, {"destination": "/queue/a"}, b"hi")
    (message,) = old.read()
    assert message.header("subscription") == "/queue/a"
    old.send(Command.UNSUBSCRIBE, {"destination": "/queue/a", "receipt": "u"})
    assert old.read_one(Command.RECEIPT).header("receipt-id") == "u"


def test_duplicate_subscription_id() -> None:
    peer = World().connected()
    peer.send(Command.SUBSCRIBE, {"id": "s", "destination": "/queue/a"})
    peer.send(Command.SUBSCRIBE, {"id": "s", "destination": "/queue/b"})
    assert_error_then_close(peer, "already in use")


def fill(peer: Peer, queue: str, count: int) -> None:
    for i in range(count):
        peer.send(Command.SEND, {"destination": f"/queue/{queue}"}, f"m{i}".encode())


def test_client_mode_acks_cumulatively_on_1_2() -> None:
    world = World()
    peer = world.connected()
    fill(peer, "q", 3)
    peer.send(Command.SUBSCRIBE, {"id": "s", "destination": "/queue/q", "ack": "client"})
    messages = peer.read()
    assert [m.body for m in messages] == [b"m0", b"m1", b"m2"]
    ack_id = messages[1].header("ack")
    assert ack_id is not None
    peer.send(Command.ACK, {"id": ack_id, "receipt": "r"})
    peer.read()
    assert world.backend.queue_depth("q") == 1  # m0 and m1 consumed


def test_client_individual_acks_one_and_nack_redelivers() -> None:
    world = World()
    peer = world.connected()
    fill(peer, "q", 3)
    peer.send(
        Command.SUBSCRIBE, {"id": "s", "destination": "/queue/q", "ack": "client-individual"}
    )
    messages = peer.read()
    peer.send(Command.ACK, {"id": messages[1].header("ack") or ""})
    assert world.backend.queue_depth("q") == 2
    peer.send(Command.NACK, {"id": messages[0].header("ack") or ""})
    (again,) = peer.read()
    assert again.body == b"m0"
    assert again.header("message-id") == messages[0].header("message-id")
    assert again.header("ack") != messages[0].header("ack")


def test_1_1_acks_by_message_id_and_subscription() -> None:
    world = World()
    peer = world.connected(V11)
    fill(peer, "q", 2)
    peer.send(
        Command.SUBSCRIBE, {"id": "s", "destination": "/queue/q", "ack": "client-individual"}
    )
    messages = peer.read()
    assert messages[0].header("ack") is None
    peer.send(Command.ACK, {"message-id": messages[1].header("message-id") or ""})
    assert_error_then_close(peer, "needs a subscription header")
    peer.session.connection_lost()  # the unacked pair goes back to the queue
    peer2 = world.connected(V11)
    peer2.send(Command.SUBSCRIBE, {"id": "t", "destination": "/queue/q", "ack": "client"})
    (_first, second) = peer2.read()
    peer2.send(Command.ACK, {"message-id": second.header("message-id") or "", "subscription": "x"})
    assert world.backend.queue_depth("q") == 2  # names no pending delivery: ignored
    peer2.send(Command.ACK, {"message-id": second.header("message-id") or "", "subscription": "t"})
    assert world.backend.queue_depth("q") == 0


def test_unsubscribe_and_disconnect_redeliver_unacked() -> None:
    world = World()
    a = world.connected()
    fill(a, "q", 2)
    a.send(Command.SUBSCRIBE, {"id": "s", "destination": "/queue/q", "ack": "client"})
    assert len(a.read()) == 2
    a.send(Command.UNSUBSCRIBE, {"id": "s"})
    b = world.connected()
    b.send(Command.SUBSCRIBE, {"id": "s", "destination": "/queue/q", "ack": "client"})
    redelivered = b.read()
    assert [m.body for m in redelivered] == [b"m0", b"m1"]
    b.session.connection_lost()  # gone without ACK
    c = world.connected()
    c.send(Command.SUBSCRIBE, {"id": "s", "destination": "/queue/q"})
    assert [m.body for m in c.read()] == [b"m0", b"m1"]
    assert world.backend.queue_depth("q") == 0


def test_duplicate_or_unknown_ack_is_harmless() -> None:
    world = World()
    peer = world.connected()
    fill(peer, "q", 1)
    peer.send(Command.SUBSCRIBE, {"id": "s", "destination": "/queue/q", "ack": "client"})
    (message,) = peer.read()
    for _ in range(2):
        peer.send(Command.ACK, {"id": message.header("ack") or "", "receipt": "r"})
        assert peer.read_one(Command.RECEIPT).header("receipt-id") == "r"
    peer.send(Command.ACK, {"id": "nonsense", "receipt": "r2"})
    assert peer.read_one(Command.RECEIPT).header("receipt-id") == "r2"


def test_queue_round_robin_and_topic_fan_out() -> None:
    world = World()
    a, b, sender = world.connected(), world.connected(), world.connected()
    for peer in (a, b):
        peer.send(Command.SUBSCRIBE, {"id": "q", "destination": "/queue/work"})
        peer.send(Command.SUBSCRIBE, {"id": "t", "destination": "/topic/news"})
    fill(sender, "work", 4)
    sender.send(Command.SEND, {"destination": "/topic/news"}, b"hello")
    got_a, got_b = a.read(), b.read()
    queue_a = [m.body for m in got_a if m.header("subscription") == "q"]
    queue_b = [m.body for m in got_b if m.header("subscription") == "q"]
    assert sorted(queue_a + queue_b) == [b"m0", b"m1", b"m2", b"m3"]
    assert len(queue_a) == 2 and len(queue_b) == 2
    assert [m.body for m in got_a if m.header("subscription") == "t"] == [b"hello"]
    assert [m.body for m in got_b if m.header("subscription") == "t"] == [b"hello"]


# -- transactions --------------------------------------------------------------------------


def test_transaction_buffers_send_and_ack_until_commit() -> None:
    world = World()
    peer = world.connected()
    fill(peer, "q", 1)
    peer.send(Command.SUBSCRIBE, {"id": "s", "destination": "/queue/q", "ack": "client"})
    (first,) = peer.read()
    peer.send(Command.BEGIN, {"transaction": "tx"})
    peer.send(Command.SEND, {"destination": "/queue/q", "transaction": "tx"}, b"later")
    peer.send(Command.ACK, {"id": first.header("ack") or "", "transaction": "tx"})
    assert peer.read() == []
    assert world.backend.queue_depth("q") == 1
    peer.send(Command.COMMIT, {"transaction": "tx", "receipt": "c"})
    frames = peer.read()
    assert [f.command for f in frames] == [Command.MESSAGE, Command.RECEIPT]
    assert frames[0].body == b"later"
    assert world.backend.queue_depth("q") == 1  # first consumed, "later" pending


def test_abort_drops_the_buffered_frames() -> None:
    world = World()
    peer = world.connected()
    peer.send(Command.BEGIN, {"transaction": "tx"})
    peer.send(Command.SEND, {"destination": "/queue/q", "transaction": "tx"}, b"never")
    peer.send(Command.ABORT, {"transaction": "tx"})
    assert world.backend.queue_depth("q") == 0
    peer.send(Command.COMMIT, {"transaction": "tx"})
    assert_error_then_close(peer, "no open transaction")


def test_disconnect_drops_open_transactions() -> None:
    world = World()
    peer = world.connected()
    peer.send(Command.BEGIN, {"transaction": "tx"})
    peer.send(Command.SEND, {"destination": "/queue/q", "transaction": "tx"}, b"never")
    peer.send(Command.DISCONNECT, {})
    peer.session.connection_lost()
    assert world.backend.queue_depth("q") == 0


@pytest.mark.parametrize(
    ("frames", "match"),
    [
        ([(Command.SEND, {"destination": "/queue/q", "transaction": "nope"})], "no open"),
        ([(Command.BEGIN, {"transaction": "t"}), (Command.BEGIN, {"transaction": "t"})], "open"),
        ([(Command.BEGIN, {})], "needs a transaction"),
    ],
)
def test_transaction_errors(frames: list[tuple[Command, dict[str, str]]], match: str) -> None:
    peer = World().connected()
    for command, headers in frames:
        peer.send(command, headers)
    assert_error_then_close(peer, match)


def test_transaction_limits() -> None:
    world = World(config=SessionConfig(max_transactions=1, max_transaction_frames=2))
    peer = world.connected()
    peer.send(Command.BEGIN, {"transaction": "a"})
    peer.send(Command.BEGIN, {"transaction": "b"})
    assert_error_then_close(peer, "max_transactions=1")
    other = world.connected()
    other.send(Command.BEGIN, {"transaction": "a"})
    for _ in range(3):
        other.send(Command.SEND, {"destination": "/queue/q", "transaction": "a"})
    assert_error_then_close(other, "max_transaction_frames=2")


def test_transaction_bytes_are_bounded_per_connection_and_freed_at_commit_or_abort() -> None:
    """``max_transaction_bytes`` counts every open transaction of a connection (bodies and
    header text): a frame that would cross it is an ERROR carrying its receipt, and what
    a COMMIT or ABORT took away is room again."""
    world = World(config=SessionConfig(max_transaction_bytes=1000))
    peer = world.connected()
    for tx in ("a", "b"):
        peer.send(Command.BEGIN, {"transaction": tx})
    send = {"destination": "/queue/q", "transaction": "a"}  # 31 characters of header text
    peer.send(Command.SEND, send, b"x" * 400)
    peer.send(Command.SEND, {**send, "transaction": "b"}, b"x" * 400)  # 2 x 431 held
    peer.send(Command.ABORT, {"transaction": "b"})
    peer.send(Command.SEND, send, b"x" * 400)
    peer.send(Command.COMMIT, {"transaction": "a", "receipt": "c"})
    assert peer.read_one(Command.RECEIPT).header("receipt-id") == "c"
    assert world.backend.queue_depth("q") == 2
    peer.send(Command.BEGIN, {"transaction": "a"})
    peer.send(Command.SEND, send, b"x" * 969)  # 1000 exactly: kept
    peer.send(Command.BEGIN, {"transaction": "b"})
    peer.send(Command.ACK, {"id": "1", "transaction": "b", "receipt": "over"})  # 26 more
    error = peer.read()[-1]
    assert error.command is Command.ERROR and error.header("receipt-id") == "over"
    assert_error_then_close_after(peer, error, "max_transaction_bytes=1000")
    assert world.backend.queue_depth("q") == 2  # the open transaction was dropped


# -- destinations and Apollo options -------------------------------------------------------


def test_temporary_destinations_reply_to_rewrite_and_owner_only() -> None:
    world = World()
    requester, worker = world.connected(), world.connected()
    requester.send(Command.SUBSCRIBE, {"id": "replies", "destination": "/temp-queue/r"})
    worker.send(Command.SUBSCRIBE, {"id": "w", "destination": "/queue/requests"})
    requester.send(
        Command.SEND, {"destination": "/queue/requests", "reply-to": "/temp-queue/r"}, b"ask"
    )
    (request,) = worker.read()
    reply_to = request.header("reply-to")
    assert reply_to == "/queue/temp.default.1.r"
    worker.send(Command.SEND, {"destination": reply_to}, b"answer")
    (answer,) = requester.read()
    assert answer.body == b"answer"
    thief = world.connected()
    thief.send(Command.SUBSCRIBE, {"id": "x", "destination": reply_to})
    assert_error_then_close(thief, "temporary destination of another connection")
    requester.session.connection_lost()
    assert "temp.default.1.r" not in world.backend.destination_names()


def test_wildcards_only_in_subscribe_and_from_seq_not_on_them() -> None:
    world = World()
    sender = world.connected()
    sender.send(Command.SEND, {"destination": "/topic/a.*"}, b"x")
    assert_error_then_close(sender, "wildcards may only be used in SUBSCRIBE")
    sub = world.connected()
    sub.send(Command.SUBSCRIBE, {"id": "s", "destination": "/queue/a.*", "from-seq": "0"})
    assert_error_then_close(sub, "from-seq")
    comp = world.connected()
    comp.send(Command.SUBSCRIBE, {"id": "s", "destination": "/queue/a,/queue/b", "from-seq": "0"})
    assert_error_then_close(comp, "from-seq")


def test_wildcard_and_composite_delivery() -> None:
    world = World()
    sub, sender = world.connected(), world.connected()
    sub.send(Command.SUBSCRIBE, {"id": "w", "destination": "/topic/PRICE.STOCK.*.I*"})
    sub.send(Command.SUBSCRIBE, {"id": "d", "destination": "/topic/PRICE.**"})
    sub.send(Command.SUBSCRIBE, {"id": "r", "destination": "/topic/X.*{[0-9]}"})
    sender.send(Command.SEND, {"destination": "/topic/PRICE.STOCK.NASDAQ.IBM,/queue/a"}, b"1")
    sender.send(Command.SEND, {"destination": "/topic/PRICE.STOCK.NYSE.SUNW"}, b"2")
    sender.send(Command.SEND, {"destination": "/topic/X.ab7,/topic/X.abc"}, b"3")
    got = [(m.header("subscription"), m.body, m.header("destination")) for m in sub.read()]
    assert got == [
        ("w", b"1", "/topic/PRICE.STOCK.NASDAQ.IBM"),
        ("d", b"1", "/topic/PRICE.STOCK.NASDAQ.IBM"),
        ("d", b"2", "/topic/PRICE.STOCK.NYSE.SUNW"),
        ("r", b"3", "/topic/X.ab7"),
    ]
    assert world.backend.queue_depth("a") == 1


def test_destination_name_restrictions() -> None:
    peer = World().connected()
    peer.send(Command.SEND, {"destination": "/queue/a$b"}, b"x")
    assert_error_then_close(peer, "names use")


def test_ttl_becomes_expires_and_expired_messages_are_dropped() -> None:
    world = World()
    peer = world.connected()
    peer.send(Command.SEND, {"destination": "/queue/q", "ttl": "2000"}, b"short")
    peer.send(Command.SEND, {"destination": "/queue/q", "expires": str(WALL_MS + 60_000)}, b"long")
    world.clock.advance(2.0)
    peer.send(Command.SUBSCRIBE, {"id": "s", "destination": "/queue/q"})
    (message,) = peer.read()
    assert message.body == b"long"
    assert message.header("expires") == str(WALL_MS + 60_000)


def test_retained_topic_message() -> None:
    world = World()
    sender = world.connected()
    sender.send(Command.SEND, {"destination": "/topic/ibm", "retain": "set"}, b"112.12")
    late = world.connected()
    late.send(Command.SUBSCRIBE, {"id": "s", "destination": "/topic/ibm"})
    assert [m.body for m in late.read()] == [b"112.12"]
    sender.send(Command.SEND, {"destination": "/topic/ibm", "retain": "remove"}, b"")
    later = world.connected()
    later.send(Command.SUBSCRIBE, {"id": "s", "destination": "/topic/ibm"})
    assert later.read() == []


def test_credit_limits_unacked_deliveries() -> None:
    world = World()
    peer = world.connected()
    fill(peer, "q", 5)
    peer.send(
        Command.SUBSCRIBE, {"id": "s", "destination": "/queue/q", "ack": "client", "credit": "2,0"}
    )
    first = peer.read()
    assert [m.body for m in first] == [b"m0", b"m1"]
    peer.send(Command.ACK, {"id": first[0].header("ack") or ""})
    assert [m.body for m in peer.read()] == [b"m2"]


def test_transactional_ack_returns_credit_now_and_only_once() -> None:
    world = World()
    peer = world.connected()
    fill(peer, "q", 4)
    credit = {"id": "s", "destination": "/queue/q", "ack": "client-individual", "credit": "1,0"}
    peer.send(Command.SUBSCRIBE, credit)
    (m0,) = peer.read()
    peer.send(Command.BEGIN, {"transaction": "t"})
    peer.send(Command.ACK, {"id": m0.header("ack") or "", "transaction": "t"})
    (m1,) = peer.read()  # the credit came back before COMMIT
    assert m1.body == b"m1"
    assert world.backend.queue_depth("q") == 4  # nothing consumed yet
    peer.send(Command.ABORT, {"transaction": "t"})
    peer.send(Command.ACK, {"id": m0.header("ack") or ""})
    assert peer.read() == []  # m0's credit was already returned: no m2
    assert world.backend.queue_depth("q") == 3
    peer.send(Command.ACK, {"id": m1.header("ack") or ""})
    assert [m.body for m in peer.read()] == [b"m2"]


def test_browser_include_seq_and_from_seq() -> None:
    world = World()
    peer = world.connected()
    fill(peer, "q", 3)
    peer.send(
        Command.SUBSCRIBE,
        {
            "id": "b",
            "destination": "/queue/q",
            "browser": "true",
            "include-seq": "seq",
            "from-seq": "2",
        },
    )
    frames = peer.read()
    assert [(f.body, f.header("seq")) for f in frames[:-1]] == [(b"m1", "2"), (b"m2", "3")]
    assert frames[-1].header("browser") == "end"
    assert world.backend.queue_depth("q") == 3  # nothing consumed


def test_a_full_transport_holds_queue_and_browse_deliveries_until_resume() -> None:
    world = World()
    room = [True]
    peer = world.peer(writable=lambda: room[0])
    peer.connect()
    fill(peer, "q", 2)
    fill(peer, "r", 1)
    room[0] = False
    peer.send(Command.SUBSCRIBE, {"id": "b", "destination": "/queue/q", "browser": "true"})
    peer.send(Command.SUBSCRIBE, {"id": "c", "destination": "/queue/r"})
    assert peer.read() == []
    assert world.backend.queue_depth("r") == 1  # kept, not lost
    room[0] = True
    world.backend.resume(peer.session.connection_id)
    got = [(f.header("subscription"), f.body, f.header("browser")) for f in peer.read()]
    assert sorted(got, key=str) == sorted(
        [("b", b"m0", None), ("b", b"m1", None), ("b", b"", "end"), ("c", b"m0", None)], key=str
    )


def test_from_seq_on_consumers_and_a_browser_that_keeps_listening() -> None:
    world = World()
    peer = world.connected()
    fill(peer, "q", 3)
    peer.send(
        Command.SUBSCRIBE,
        {"id": "tail", "destination": "/queue/q", "from-seq": "-1", "include-seq": "n"},
    )
    peer.send(Command.SUBSCRIBE, {"id": "from3", "destination": "/queue/q", "from-seq": "3"})
    got = [(m.header("subscription"), m.body) for m in peer.read()]
    assert got == [("from3", b"m2")]  # the tail subscription skips what was there
    listen = {"id": "b", "destination": "/queue/q", "browser": "true", "browser-end": "false"}
    peer.send(Command.SUBSCRIBE, listen)
    assert [m.body for m in peer.read()] == [b"m0", b"m1"]  # no end marker
    peer.send(Command.UNSUBSCRIBE, {"id": "from3"})
    peer.send(Command.SEND, {"destination": "/queue/q"}, b"new")
    got = sorted((m.header("subscription") or "", m.body, m.header("n")) for m in peer.read())
    assert got == [("b", b"new", None), ("tail", b"new", "4")]
    assert world.backend.queue_depth("q") == 2  # m0, m1: only browsed


def test_durable_subscription_keeps_messages_while_away() -> None:
    world = World()
    sub = world.connected()
    sub.send(Command.SUBSCRIBE, {"id": "mysub", "destination": "/topic/foo", "persistent": "true"})
    sub.send(Command.DISCONNECT, {})
    sub.session.connection_lost()
    sender = world.connected()
    sender.send(Command.SEND, {"destination": "/topic/foo"}, b"while away")
    sender.send(Command.SEND, {"destination": "/dsub/mysub"}, b"direct")
    back = world.connected()
    back.send(Command.SUBSCRIBE, {"id": "0", "destination": "/dsub/mysub"})
    assert [m.body for m in back.read()] == [b"while away", b"direct"]
    back.send(Command.UNSUBSCRIBE, {"id": "mysub", "persistent": "true", "receipt": "gone"})
    back.read()
    assert world.backend.durable_depth("mysub") is None


def test_a_refused_composite_subscription_leaves_nothing_attached() -> None:
    world = World()
    owner = world.connected()
    owner.send(Command.SUBSCRIBE, {"id": "d1", "destination": "/topic/t", "persistent": "true"})
    owner.send(Command.UNSUBSCRIBE, {"id": "d1"})  # detach; the durable queue stays
    bad = world.connected()
    composite = {"id": "s", "destination": "/dsub/d1,/dsub/missing", "exclusive": "true"}
    bad.send(Command.SUBSCRIBE, composite)
    assert_error_then_close(bad, "no durable subscription")
    bad.session.connection_lost()
    good = world.connected()
    good.send(Command.SUBSCRIBE, {"id": "s", "destination": "/dsub/d1"})
    good.send(Command.SEND, {"destination": "/topic/t"}, b"for the living")
    assert [m.body for m in good.read()] == [b"for the living"]


def test_exclusive_consumer_and_failover() -> None:
    world = World()
    a, b = world.connected(), world.connected()
    a.send(Command.SUBSCRIBE, {"id": "s", "destination": "/queue/q", "exclusive": "true"})
    b.send(Command.SUBSCRIBE, {"id": "s", "destination": "/queue/q", "exclusive": "true"})
    fill(b, "q", 3)
    assert len(a.read()) == 3 and b.read() == []
    a.session.connection_lost()
    fill(b, "q", 1)
    assert [m.body for m in b.read()] == [b"m0"]


def test_message_groups_stick_to_one_consumer() -> None:
    world = World()
    a, b, sender = world.connected(), world.connected(), world.connected()
    for peer in (a, b):
        peer.send(Command.SUBSCRIBE, {"id": "s", "destination": "/queue/q", "ack": "client"})
    for i in range(20):
        group = f"g{i % 4}"
        sender.send(Command.SEND, {"destination": "/queue/q", "message_group": group}, b"x")
    owners: dict[str, set[int]] = {}
    for index, peer in enumerate((a, b)):
        for message in peer.read():
            owners.setdefault(message.header("message_group") or "", set()).add(index)
    assert set(owners) == {"g0", "g1", "g2", "g3"}
    assert all(len(who) == 1 for who in owners.values())


def test_selectors_filter_topics_and_leave_queue_messages_for_others() -> None:
    world = World()
    picky, other, sender = world.connected(), world.connected(), world.connected()
    blue = "color = 'blue' AND weight > 2500"
    picky.send(Command.SUBSCRIBE, {"id": "t", "destination": "/topic/cars", "selector": blue})
    picky.send(Command.SUBSCRIBE, {"id": "q", "destination": "/queue/cars", "selector": blue})
    for color, weight in (("blue", "3000"), ("red", "3000"), ("blue", "100")):
        headers = {"destination": "/topic/cars,/queue/cars", "color": color, "weight": weight}
        sender.send(Command.SEND, headers, color.encode())
    got = [(m.header("subscription"), m.header("weight")) for m in picky.read()]
    assert got == [("t", "3000"), ("q", "3000")]
    assert world.backend.queue_depth("cars") == 2  # the others wait for a consumer
    other.send(Command.SUBSCRIBE, {"id": "all", "destination": "/queue/cars"})
    assert [m.body for m in other.read()] == [b"red", b"blue"]


def test_bad_selector_is_an_error() -> None:
    peer = World().connected()
    peer.send(Command.SUBSCRIBE, {"id": "s", "destination": "/queue/a", "selector": "a = "})
    assert_error_then_close(peer, "selector")


def test_message_groups_rebalance_only_idle_groups_when_a_consumer_joins() -> None:
    world = World()
    a, b, sender = world.connected(), world.connected(), world.connected()
    a.send(Command.SUBSCRIBE, {"id": "s", "destination": "/queue/q", "ack": "client-individual"})

    def send_groups() -> None:
        for i in range(8):
            headers = {"destination": "/queue/q", "message_group": f"g{i}"}
            sender.send(Command.SEND, headers, b"x")

    send_groups()
    first = a.read()
    assert len(first) == 8  # alone: a owns every group
    for message in first[4:]:  # g4..g7 finish; g0..g3 stay in flight
        a.send(Command.ACK, {"id": message.header("ack") or ""})
    b.send(Command.SUBSCRIBE, {"id": "s", "destination": "/queue/q", "ack": "client-individual"})
    send_groups()
    to_a = {m.header("message_group") for m in a.read()}
    to_b = {m.header("message_group") for m in b.read()}
    assert {"g0", "g1", "g2", "g3"} <= to_a  # busy groups do not move
    assert to_b and to_b <= {"g4", "g5", "g6", "g7"}  # idle ones are hashed again
    assert to_a.isdisjoint(to_b)


def test_add_headers_options() -> None:
    config = SessionConfig(
        add_user_header="JMSXUserID",
        add_timestamp_header="timestamp",
        add_redeliveries_header="redeliveries",
    )
    world = World(config=config)
    peer = world.connected(login="alice")
    peer.send(Command.SEND, {"destination": "/queue/q", "JMSXUserID": "mallory"}, b"x")
    peer.send(Command.SUBSCRIBE, {"id": "s", "destination": "/queue/q", "ack": "client"})
    (message,) = peer.read()
    assert message.header("JMSXUserID") == "alice"  # the sender cannot forge it
    assert message.header("timestamp") == str(WALL_MS)
    assert message.header("redeliveries") is None
    peer.send(Command.NACK, {"id": message.header("ack") or ""})
    (again,) = peer.read()
    assert again.header("redeliveries") == "1"


# -- fuzz: whatever the bytes, the session answers with frames and never raises -------------

_FRAGMENTS = [
    b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\x00",
    b"SUBSCRIBE\nid:s\ndestination:/queue/f\nack:client\n\n\x00",
    b"SEND\ndestination:/queue/f\n\nbody\x00",
    b"SEND\ndestination:/queue/f\ncontent-length:3\n\na\x00b\x00",
    b"ACK\nid:1\n\n\x00",
    b"NACK\nid:2\n\n\x00",
    b"BEGIN\ntransaction:t\n\n\x00",
    b"COMMIT\ntransaction:t\n\n\x00",
    b"UNSUBSCRIBE\nid:s\n\n\x00",
    b"\n",
    b"\r\n",
    b"\x00",
    b":",
    b"\\",
    b"content-length:99999999999\n",
]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.one_of(st.sampled_from(_FRAGMENTS), st.binary(max_size=16)), max_size=12),
    st.integers(1, 9),
)
def test_random_input_never_raises_and_every_reply_is_a_frame(
    pieces: list[bytes], step: int
) -> None:
    world = World()
    peer = world.peer()
    stream = b"".join(pieces)
    for i in range(0, len(stream), step):
        peer.send_bytes(stream[i : i + step])
        peer.read()  # raises if the session wrote anything that is not a frame
    errors = [f for f in peer.received if f.command is Command.ERROR]
    assert len(errors) <= 1
    if errors:
        assert peer.received[-1] is errors[0]
        assert peer.session.state is SessionState.CLOSING
    peer.session.connection_lost()
    assert world.backend.connections == 0


# -- a backend that publishes asynchronously --------------------------------------------


class _LaterBackend(MemoryBackend):
    """Publishes when the test says so (``answer``), as the engine backend answers."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting: list[tuple[Any, Any]] = []
        self.sync_publishes = 0

    def publish_async(self, connection_id: int, spec: Any, answer: Any) -> None:
        self.waiting.append((spec, answer))

    def publish(self, connection_id: int, spec: Any) -> None:
        self.sync_publishes += 1
        super().publish(connection_id, spec)

    def answer(self, count: int, error: Refusal | None = None) -> None:
        for _spec, answer in self.waiting[:count]:
            answer(error)
        del self.waiting[:count]


def _later_peer(**config: Any) -> tuple[_LaterBackend, Peer]:
    world = World(config=SessionConfig(**config))
    backend = _LaterBackend()
    world.backend = backend
    return backend, world.connected()


def test_async_send_receipts_wait_for_answers_in_order() -> None:
    backend, peer = _later_peer()
    peer.send(Command.SEND, {"destination": "/queue/a", "receipt": "s1"}, b"1")
    peer.send(Command.SUBSCRIBE, {"destination": "/queue/b", "id": "x", "receipt": "sub"})
    peer.send(Command.SEND, {"destination": "/queue/a", "receipt": "s2"}, b"2")
    assert peer.read() == []  # nothing answered yet: no receipt, not even SUBSCRIBE's
    backend.answer(1)
    assert [f.header("receipt-id") for f in peer.read()] == ["s1", "sub"]
    peer.send(Command.DISCONNECT, {"receipt": "bye"})
    assert peer.read() == [] and not peer.session.closed
    backend.answer(1)
    assert [f.header("receipt-id") for f in peer.read()] == ["s2", "bye"]
    assert peer.session.closed


def test_async_send_refused_is_an_error_with_its_receipt() -> None:
    backend, peer = _later_peer(die_delay=0.1)
    peer.send(Command.SEND, {"destination": "/queue/a", "receipt": "ok"}, b"1")
    peer.send(Command.SEND, {"destination": "/queue/a", "receipt": "no"}, b"2")
    peer.send(Command.SEND, {"destination": "/queue/a", "receipt": "after"}, b"3")
    backend.answer(1)
    backend.answer(1, Refusal("queue full"))
    backend.answer(1)  # the answer after the ERROR says nothing more
    frames = peer.read()
    assert [f.command for f in frames] == [Command.RECEIPT, Command.ERROR]
    assert frames[1].header("receipt-id") == "no" and frames[1].header("message") == "queue full"


def test_async_sends_in_flight_are_bounded() -> None:
    """A full window parks the next frames (reading pauses) instead of blocking the
    listener on a synchronous publish per SEND; answers resume them in order."""
    backend, peer = _later_peer(max_unanswered_sends=3)
    for i in range(5):
        peer.send(Command.SEND, {"destination": "/queue/a"}, str(i).encode())
    peer.send(Command.DISCONNECT, {"receipt": "bye"})
    assert len(backend.waiting) == 3 and backend.sync_publishes == 0
    assert peer.session.reading_paused and not peer.session.closed
    backend.answer(3)
    assert [spec.body for spec, _ in backend.waiting] == [b"3", b"4"]
    assert not peer.session.reading_paused
    backend.answer(2)
    assert [f.header("receipt-id") for f in peer.read()] == ["bye"]
    assert peer.session.closed and backend.sync_publishes == 0


def test_parked_frames_after_a_refused_send_take_no_effect() -> None:
    backend, peer = _later_peer(max_unanswered_sends=1)
    peer.send(Command.SEND, {"destination": "/queue/a", "receipt": "r0"}, b"0")
    peer.send(Command.SEND, {"destination": "/queue/a", "receipt": "r1"}, b"1")
    peer.send(Command.SUBSCRIBE, {"destination": "/queue/b", "id": "x"})
    assert len(backend.waiting) == 1 and peer.session.reading_paused
    backend.answer(1, Refusal("queue full"))
    frames = peer.read()
    assert [f.command for f in frames] == [Command.ERROR]
    assert frames[0].header("receipt-id") == "r0"
    assert backend.waiting == [] and backend.sync_publishes == 0
    assert not peer.session.reading_paused


# -- runs of SENDs handed over in one call (BatchPublisher) -----------------------------


class _RunBackend(_LaterBackend):
    """Takes runs of SENDs (``publish_batch``) and answers them when the test says so;
    a SEND with a ``bad`` header is refused at once, as ``check_headers`` refuses one."""

    def __init__(self) -> None:
        super().__init__()
        self.runs: list[tuple[list[Any], Any]] = []

    def publish_batch(self, connection_id: int, streaks: Any, answer: Any) -> None:
        if any(name == "bad" for streak in streaks for name, _ in streak.headers):
            raise BackendError("bad header")
        self.runs.append(([spec for streak in streaks for spec in streak.specs()], answer))

    def publish_async(self, connection_id: int, spec: Any, answer: Any) -> None:
        if any(name == "bad" for name, _ in spec.headers):
            raise BackendError("bad header")
        super().publish_async(connection_id, spec, answer)

    def answer_run(self, taken: int | None = None, error: Refusal | None = None) -> None:
        specs, answer = self.runs.pop(0)
        answer(len(specs) if taken is None else taken, error)


def _run_peer(**config: Any) -> tuple[_RunBackend, Peer]:
    world = World(config=SessionConfig(**config))
    backend = _RunBackend()
    world.backend = backend
    return backend, world.connected()


def _sends(*items: tuple[str, dict[str, str]]) -> bytes:
    """SEND frames to /queue/a in one string: (body, extra headers) each."""
    return b"".join(
        serialize(make_frame(Command.SEND, [("destination", "/queue/a"), *h.items()], b.encode()))
        for b, h in items
    )


def _bodies(run: tuple[list[Any], Any]) -> list[bytes]:
    return [spec.body for spec in run[0]]


def test_pipelined_sends_reach_the_backend_as_one_run_with_one_answer() -> None:
    backend, peer = _run_peer()
    peer.send_bytes(_sends(*[(str(i), {"receipt": f"r{i}"}) for i in range(5)]))
    assert [_bodies(r) for r in backend.runs] == [[b"0", b"1", b"2", b"3", b"4"]]
    assert backend.waiting == [] and peer.read() == []
    backend.answer_run()
    assert [f.header("receipt-id") for f in peer.read()] == [f"r{i}" for i in range(5)]


def test_a_run_refused_in_the_middle_receipts_those_before_then_one_error() -> None:
    backend, peer = _run_peer(die_delay=0.1)
    peer.send_bytes(_sends(*[(str(i), {"receipt": f"r{i}"}) for i in range(5)]))
    peer.send_bytes(_sends(("late", {"receipt": "late"})))
    assert len(backend.runs) == 2
    backend.answer_run(2, Refusal("queue full"))
    backend.answer_run()  # the run after the refused SEND: nothing more is said
    frames = peer.read()
    assert [f.command for f in frames] == [Command.RECEIPT] * 2 + [Command.ERROR]
    assert [f.header("receipt-id") for f in frames] == ["r0", "r1", "r2"]
    assert frames[2].header("message") == "queue full"
    assert peer.session.state is SessionState.CLOSING


def test_a_receipted_frame_after_a_refused_run_gets_the_error_not_a_receipt() -> None:
    """A run refused in the middle, then a SUBSCRIBE asking for a receipt (applied by
    the backend at once, its RECEIPT waiting for the run's answer): the SENDs before the
    refused one get their RECEIPTs, the ERROR names the refused one, and the SUBSCRIBE
    gets no RECEIPT -- a RECEIPT says every frame before it was applied (until session 17
    it was sent before the ERROR: `test_full_disk_stomp`'s SUBSCRIBE-synced runs saw
    RECEIPT s3, then an ERROR naming s3, when the disk filled)."""
    backend, peer = _run_peer(die_delay=0.1)
    peer.send_bytes(_sends(*[(str(i), {"receipt": f"r{i}"}) for i in range(3)]))
    peer.send(Command.SUBSCRIBE, {"destination": "/queue/b", "id": "x", "receipt": "sub"})
    assert peer.read() == []
    backend.answer_run(1, Refusal("queue full"))
    frames = peer.read()
    assert [f.command for f in frames] == [Command.RECEIPT, Command.ERROR]
    assert [f.header("receipt-id") for f in frames] == ["r0", "r1"]


def test_a_store_failure_of_a_run_names_the_receipt_of_the_frame_after_it_and_sends_none() -> None:
    """Runs of SENDs without receipts, synced by a SUBSCRIBE that asks for one: the store
    fails under the run (``STORE_FAILED``, none of it taken): one ERROR naming the
    SUBSCRIBE's receipt, no RECEIPT for it."""
    backend, peer = _run_peer(die_delay=0.1)
    peer.send_bytes(_sends(*[(str(i), {}) for i in range(4)]))
    peer.send(Command.SUBSCRIBE, {"destination": "/queue/b", "id": "x", "receipt": "s3"})
    assert peer.read() == []
    backend.answer_run(0, STORE_FAILED)
    (error,) = peer.read()
    assert error.command is Command.ERROR and error.header("receipt-id") == "s3"
    assert "not saved" in str(error.header("message"))


def test_a_refusal_worded_as_a_store_failure_is_not_taken_for_one() -> None:
    """The answer says a store failure by its type (``Refusal.store_failed``), not by its
    words: a refusal whose reason reads as ``STORE_FAILED``'s is an ordinary one, so its
    ERROR names no receipt the refused SEND did not ask for (was: a string compare)."""
    backend, peer = _run_peer(die_delay=0.1)
    peer.send_bytes(_sends(*[(str(i), {}) for i in range(4)]))
    peer.send(Command.SUBSCRIBE, {"destination": "/queue/b", "id": "x", "receipt": "s3"})
    assert peer.read() == []
    backend.answer_run(0, Refusal(STORE_FAILED.reason))
    (error,) = peer.read()
    assert error.command is Command.ERROR and error.header("receipt-id") is None


def test_a_run_stops_at_a_transactional_send_and_before_a_send_that_does_not_parse() -> None:
    backend, peer = _run_peer(die_delay=0.1)
    peer.send(Command.BEGIN, {"transaction": "t"})
    peer.send_bytes(
        _sends(
            ("1", {}),
            ("2", {}),
            ("tx", {"transaction": "t"}),
            ("4", {}),
            ("5", {"expires": "soon", "receipt": "bad"}),
            ("6", {}),
        )
        + serialize(make_frame(Command.COMMIT, [("transaction", "t")]))
    )
    assert [_bodies(r) for r in backend.runs] == [[b"1", b"2"], [b"4"]]
    assert peer.read() == []  # the ERROR waits for the answers to the SENDs before it
    backend.answer_run()
    assert peer.read() == []
    backend.answer_run()
    (error,) = peer.read()
    assert error.command is Command.ERROR and "expires" in str(error.header("message"))
    assert error.header("receipt-id") == "bad"
    assert backend.waiting == [] and backend.sync_publishes == 0  # neither tx nor 6


def test_a_run_the_backend_refuses_at_once_goes_one_by_one_up_to_the_bad_send() -> None:
    backend, peer = _run_peer(die_delay=0.1)
    peer.send_bytes(
        _sends(("0", {"receipt": "r0"}), ("1", {"bad": "x", "receipt": "r1"}), ("2", {}))
    )
    assert backend.runs == [] and [s.body for s, _ in backend.waiting] == [b"0"]
    assert peer.read() == []  # the ERROR waits for the answer to the SEND before it
    backend.answer(1)
    receipt, error = peer.read()  # (until session 14 r0 lost its RECEIPT: it was taken)
    assert receipt.command is Command.RECEIPT and receipt.header("receipt-id") == "r0"
    assert error.command is Command.ERROR and error.header("receipt-id") == "r1"
    assert backend.waiting == [] and peer.read() == []  # nothing after its ERROR


def test_runs_are_cut_to_the_window_of_unanswered_sends() -> None:
    backend, peer = _run_peer(max_unanswered_sends=3)
    peer.send_bytes(_sends(*[(str(i), {"receipt": f"r{i}"}) for i in range(7)]))
    assert [_bodies(r) for r in backend.runs] == [[b"0", b"1", b"2"]]
    assert peer.session.reading_paused
    backend.answer_run()
    assert [_bodies(r) for r in backend.runs] == [[b"3", b"4", b"5"]]
    backend.answer_run()
    backend.answer_run()
    assert [f.header("receipt-id") for f in peer.read()] == [f"r{i}" for i in range(7)]
    assert not peer.session.reading_paused and backend.sync_publishes == 0
