"""``broker serve --stomp``: STOMP on the broker process itself, over real sockets, with
stomp.py and raw frames; logins checked by the broker's authorizer, persistent SENDs on
its durable store (kill -9 after the RECEIPT, restart: the message is there)."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import stomp

from broker.stomp.frames import Command, Frame
from tests.broker.test_cli import start_serve
from tests.polling import WAIT, wait_until
from tests.ports import free_port
from tests.stomp.test_listener import Raw
from tests.stomp.two_doors import Recorder

#: A config whose broker lets in the token ``s3cret`` (all actions) and, without a
#: token, only consumers (``join``): no SEND, no channel creation.
TOKENS = '[tokens]\ns3cret = "all"\nreader = ["join"]\n'


def tokens(top: str) -> str:
    """The token table after top-level keys (TOML puts what follows a table in it)."""
    return top + TOKENS


class Serve:
    """One ``broker serve --stomp`` process; stopped with SIGTERM (or killed)."""

    def __init__(self, tmp: Path, *extra: str, config: str | None = None) -> None:
        self.port = free_port()
        self.tmp = tmp
        self.extra = extra
        self.config = config
        self.proc = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        args = [
            "--bind",
            f"tcp://127.0.0.1:{free_port()}",
            "--stomp",
            f"tcp://127.0.0.1:{self.port}",
            *self.extra,
        ]
        if self.config is not None:
            path = self.tmp / "broker.toml"
            path.write_text(self.config)
            args += ["--config", str(path)]
        return start_serve(*args)

    def restart(self) -> None:
        self.proc = self._start()

    def kill9(self) -> None:
        self.proc.kill()
        self.proc.wait(WAIT)
        self._close_pipes()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                code = self.proc.wait(WAIT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                code = self.proc.wait(WAIT)
        else:
            code = self.proc.returncode
        self._close_pipes()
        return code

    def _close_pipes(self) -> None:
        if self.proc.stderr is not None:
            self.proc.stderr.close()


@pytest.fixture
def serve_factory(tmp_path: Path) -> Iterator[Callable[..., Serve]]:
    made: list[Serve] = []

    def make(*extra: str, config: str | None = None) -> Serve:
        server = Serve(tmp_path, *extra, config=config)
        made.append(server)
        return server

    yield make
    for server in made:
        server.stop()


@pytest.fixture
def raws() -> Iterator[Callable[[int], Raw]]:
    made: list[Raw] = []

    def make(port: int) -> Raw:
        raw = Raw(port)
        made.append(raw)
        return raw

    yield make
    for raw in made:
        raw.close()


def connect_frame(**headers: str) -> bytes:
    lines = ["CONNECT"] + [f"{k.replace('_', '-')}:{v}" for k, v in headers.items()]
    return ("\n".join(lines) + "\n\n\x00").encode()


def stomp12(port: int, login: str | None = None, passcode: str | None = None) -> Any:
    conn = stomp.Connection12([("127.0.0.1", port)])
    conn.set_listener("rec", Recorder())
    conn.connect(login, passcode, wait=True)
    return conn


def bodies(conn: Any) -> list[str]:
    rec = recorder(conn)
    with rec.lock:
        return [m.body for m in rec.messages]


def recorder(conn: Any) -> Recorder:
    rec: Recorder = conn.get_listener("rec")
    return rec


# -- CONNECT: the broker's authorizer decides -------------------------------------------


def test_connect_with_a_known_token_is_connected(
    serve_factory: Callable[..., Serve], raws: Callable[[int], Raw]
) -> None:
    server = serve_factory(config=tokens("require_token = true\n"))
    raw = raws(server.port)
    raw.send(connect_frame(accept_version="1.2", host="localhost", login="u", passcode="s3cret"))
    frame = raw.next()
    assert frame.command is Command.CONNECTED and frame.header("version") == "1.2"


@pytest.mark.parametrize("passcode", ["wrong", None])
def test_connect_refused_by_the_authorizer_gets_error_not_connected(
    serve_factory: Callable[..., Serve], raws: Callable[[int], Raw], passcode: str | None
) -> None:
    server = serve_factory(config=tokens("require_token = true\n"))
    bad = raws(server.port)
    headers = {"accept_version": "1.2", "host": "localhost", "login": "u"}
    if passcode is not None:
        headers["passcode"] = passcode
    bad.send(connect_frame(**headers))
    frame = bad.next()
    assert frame.command is Command.ERROR
    assert "authentication failed" in (frame.header("message") or "")
    assert bad.closed_by_server()
    assert [f.command for f in bad.frames] == []  # no CONNECTED, nothing after the ERROR
    # the broker keeps serving: a good login still works, end to end
    conn = stomp12(server.port, "u", "s3cret")
    conn.subscribe("/queue/auth-ok", id="s")
    conn.send("/queue/auth-ok", "fine", receipt="r")
    assert wait_until(lambda: bodies(conn) == ["fine"])
    conn.disconnect()


def test_stomp_py_with_a_bad_passcode_fails_to_connect(
    serve_factory: Callable[..., Serve],
) -> None:
    server = serve_factory(config=tokens("require_token = true\n"))
    conn = stomp.Connection12([("127.0.0.1", server.port)])
    rec = Recorder()
    conn.set_listener("rec", rec)
    with pytest.raises(stomp.exception.ConnectFailedException):
        conn.connect("u", "nope", wait=True)
    assert wait_until(lambda: len(rec.errors) == 1)
    assert "authentication failed" in rec.errors[0].headers["message"]


def test_actions_are_authorized_per_token(
    serve_factory: Callable[..., Serve], raws: Callable[[int], Raw]
) -> None:
    """Without a token (anonymous: ``join`` only) a SEND and the creation of a channel
    are refused with an ERROR; the token holder's traffic is untouched."""
    server = serve_factory(config=tokens('anonymous = ["join"]\n'))
    writer = stomp12(server.port, "w", "s3cret")
    writer.send("/queue/guarded", "first", receipt="r1")
    assert wait_until(lambda: recorder(writer).receipts == ["r1"])

    anon = raws(server.port)
    anon.send(connect_frame(accept_version="1.2", host="localhost"))
    assert anon.next().command is Command.CONNECTED
    anon.send(b"SEND\ndestination:/queue/guarded\nreceipt:x\n\nforged\x00")
    error = anon.next()
    assert error.command is Command.ERROR and error.header("receipt-id") == "x"
    assert anon.closed_by_server()

    creator = raws(server.port)
    creator.send(connect_frame(accept_version="1.2", host="localhost"))
    assert creator.next().command is Command.CONNECTED
    creator.send(b"SUBSCRIBE\nid:1\ndestination:/queue/brand-new\nreceipt:y\n\n\x00")
    error = creator.next()
    assert error.command is Command.ERROR and "not authorized" in (error.header("message") or "")

    reader = raws(server.port)  # anonymous may consume: gets only the token holder's message
    reader.send(connect_frame(accept_version="1.2", host="localhost"))
    assert reader.next().command is Command.CONNECTED
    reader.send(b"SUBSCRIBE\nid:1\ndestination:/queue/guarded\n\n\x00")
    message = reader.next()
    assert message.command is Command.MESSAGE and message.body == b"first"
    writer.send("/queue/guarded", "second", receipt="r2")
    assert reader.next().body == b"second"
    writer.disconnect()


# -- virtual hosts (the manual: 1.0 -> the first one; 1.1+ must name a known one) -------


def _first(raw: Raw) -> Frame:
    return raw.next()


def test_virtual_host_rules(
    serve_factory: Callable[..., Serve], raws: Callable[[int], Raw]
) -> None:
    server = serve_factory()
    unknown = raws(server.port)
    unknown.send(connect_frame(accept_version="1.1", host="elsewhere.example"))
    frame = _first(unknown)
    assert frame.command is Command.ERROR
    assert "unknown virtual host" in (frame.header("message") or "")
    old = raws(server.port)  # STOMP 1.0 names no host: the first virtual host
    old.send(connect_frame(host="elsewhere.example"))
    assert _first(old).command is Command.CONNECTED
    named = raws(server.port)
    named.send(connect_frame(accept_version="1.2", host="127.0.0.1"))
    assert _first(named).command is Command.CONNECTED


# -- reliable messaging: persistent:true + receipt survives kill -9 ----------------------


def assert_nothing_queued(server: Serve) -> None:
    """``/queue/orders`` of ``server`` is empty: a subscriber's first message is a
    marker sent after it subscribed (a redelivery would come first)."""
    again = stomp12(server.port)
    again.subscribe("/queue/orders", id="s")
    again.send("/queue/orders", "marker", receipt="m")
    assert wait_until(lambda: bodies(again) == ["marker"]), bodies(again)
    again.disconnect()


def test_persistent_send_receipted_survives_kill_9(
    serve_factory: Callable[..., Serve], tmp_path: Path
) -> None:
    data = tmp_path / "data"
    server = serve_factory("--data", str(data))
    producer = stomp12(server.port)
    for i in range(20):
        producer.send(
            "/queue/orders", f"order-{i}", headers={"persistent": "true"}, receipt=f"p{i}"
        )
    producer.send("/queue/orders", "fleeting", receipt="np")  # not persistent: memory only
    assert wait_until(lambda: len(recorder(producer).receipts) == 21)
    server.kill9()  # no chance to flush anything after the receipts
    server.restart()
    consumer = stomp12(server.port)
    consumer.subscribe("/queue/orders", id="s", ack="client-individual")
    want = [f"order-{i}" for i in range(20)]
    assert wait_until(lambda: bodies(consumer) == want), bodies(consumer)
    frames = list(recorder(consumer).messages)
    assert all(f.headers["persistent"] == "true" for f in frames)
    for frame in frames:
        consumer.ack(frame.headers["ack"])
    consumer.disconnect(receipt="bye")
    # acknowledged: deleted from the store, so a second restart has nothing to redeliver
    assert server.stop() == 0
    server.restart()
    assert_nothing_queued(server)


def _twenty_orders_taken(server: Serve, raws: Callable[[int], Raw]) -> tuple[Raw, list[Frame]]:
    """20 persistent messages (receipted) in ``/queue/orders``, then a raw consumer
    (``ack:client-individual``) that read them all, unacknowledged: it and them."""
    producer = stomp12(server.port)
    for i in range(20):
        producer.send(
            "/queue/orders", f"order-{i}", headers={"persistent": "true"}, receipt=f"p{i}"
        )
    assert wait_until(lambda: len(recorder(producer).receipts) == 20)
    consumer = raws(server.port)
    consumer.connect()
    consumer.send(b"SUBSCRIBE\nid:s\ndestination:/queue/orders\nack:client-individual\n\n\x00")
    messages = [consumer.next() for _ in range(20)]
    assert [m.body for m in messages] == [f"order-{i}".encode() for i in range(20)]
    return consumer, messages


def test_acks_before_a_receipted_disconnect_survive_kill_9(
    serve_factory: Callable[..., Serve], tmp_path: Path, raws: Callable[[int], Raw]
) -> None:
    """A consumer ACKs every persistent message, then DISCONNECTs with a receipt; once
    the RECEIPT is read the broker is killed (-9) at once: after the restart the next
    subscriber gets none of them (the RECEIPT waited for the ACKs to be applied and
    durable; before session 12 it could leave first, and a kill in that gap redelivered)."""
    server = serve_factory("--data", str(tmp_path / "data"))
    consumer, messages = _twenty_orders_taken(server, raws)
    acks = b"".join(b"ACK\nid:%s\n\n\x00" % m.header("ack").encode() for m in messages)
    consumer.send(acks + b"DISCONNECT\nreceipt:bye\n\n\x00")
    receipt = consumer.next()
    assert receipt.command is Command.RECEIPT and receipt.header("receipt-id") == "bye"
    server.kill9()
    server.restart()
    assert_nothing_queued(server)


def _browse_bodies(raw: Raw) -> list[bytes]:
    """The MESSAGE bodies ``raw`` reads up to its browser's ``browser:end``."""
    bodies_seen: list[bytes] = []
    while True:
        frame = raw.next()
        assert frame.command is Command.MESSAGE, frame
        if frame.header("browser") == "end":
            return bodies_seen
        bodies_seen.append(frame.body)


@pytest.mark.parametrize("kill", [False, True], ids=["browsed", "killed"])
def test_a_browser_subscribe_after_acks_sees_none_of_them(
    serve_factory: Callable[..., Serve], tmp_path: Path, raws: Callable[[int], Raw], kill: bool
) -> None:
    """Raw frames, one write: ACKs of the even messages, then a browser SUBSCRIBE with a
    receipt on the same connection.  The browser sees only the odd ones (the ACKs were
    applied before it read the queue); ``killed``: the broker killed (-9) as soon as the
    RECEIPT is read, a new browser after the restart sees the same (the RECEIPT waited for
    the ACKs' removals to be durable: session 12's open edge)."""
    server = serve_factory("--data", str(tmp_path / "data"))
    consumer, messages = _twenty_orders_taken(server, raws)
    acks = b"".join(b"ACK\nid:%s\n\n\x00" % m.header("ack").encode() for m in messages[::2])
    browse = b"SUBSCRIBE\nid:b\ndestination:/queue/orders\nbrowser:true\nreceipt:r\n\n\x00"
    consumer.send(acks + browse)
    receipt = consumer.next()
    assert receipt.command is Command.RECEIPT and receipt.header("receipt-id") == "r"
    odd = [f"order-{i}".encode() for i in range(1, 20, 2)]
    if not kill:
        assert _browse_bodies(consumer) == odd
        return
    server.kill9()
    server.restart()
    browser = raws(server.port)
    browser.connect()
    browser.send(b"SUBSCRIBE\nid:b\ndestination:/queue/orders\nbrowser:true\n\n\x00")
    assert _browse_bodies(browser) == odd


# -- expiration ------------------------------------------------------------------------


def test_expired_messages_are_dropped_and_ttl_sets_expires(
    serve_factory: Callable[..., Serve],
) -> None:
    server = serve_factory()
    producer = stomp12(server.port)
    producer.send("/queue/exp", "stale", headers={"expires": "1"}, receipt="a")  # 1970
    producer.send("/queue/exp", "fresh", headers={"ttl": "600000"}, receipt="b")
    producer.send("/queue/exp", "forever", receipt="c")
    assert wait_until(lambda: len(recorder(producer).receipts) == 3)
    consumer = stomp12(server.port)
    consumer.subscribe("/queue/exp", id="s")
    assert wait_until(lambda: bodies(consumer) == ["fresh", "forever"]), bodies(consumer)
    fresh = recorder(consumer).messages[0]
    assert int(fresh.headers["expires"]) > 1_700_000_000_000 and "ttl" not in fresh.headers
    bad = stomp.Connection12([("127.0.0.1", server.port)])
    rec = Recorder()
    bad.set_listener("rec", rec)
    bad.connect(wait=True)
    bad.send("/queue/exp", "x", headers={"ttl": "soon"})
    assert wait_until(lambda: len(rec.errors) == 1)
    assert "ttl must be an integer" in rec.errors[0].headers["message"]


# -- Apollo destination features on the engine (one broker for the lot) ------------------

FEATURES = (
    '[stomp]\nadd_user_header = "JMSXUserID"\nadd_timestamp_header = "timestamp"\n'
    'add_redeliveries_header = "redeliveries"\n'
    "max_data_length = 65536\nmax_headers = 50\nmax_header_length = 4096\n"
)


@pytest.fixture(scope="module")
def featured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    server = Serve(tmp_path_factory.mktemp("featured"), config=FEATURES)
    yield server
    assert server.stop() == 0


@pytest.fixture
def clients(featured: Serve) -> Iterator[Callable[..., Any]]:
    made: list[Any] = []

    def make(login: str | None = None) -> Any:
        conn = stomp12(featured.port, login, None)
        made.append(conn)
        return conn

    yield make
    for conn in made:
        if conn.is_connected():
            conn.disconnect()


def synced(conn: Any, tag: str) -> None:
    """Wait until the broker has done everything ``conn`` sent before (a receipt)."""
    conn.send("/queue/sync-sink", "", receipt=tag)
    assert wait_until(lambda: tag in recorder(conn).receipts)


def test_composite_send_and_subscribe(clients: Callable[..., Any]) -> None:
    consumer = clients()
    consumer.subscribe("/queue/comp-a,/topic/comp-t", id="s")
    synced(consumer, "sub")
    other = clients()
    other.subscribe("/queue/comp-b", id="s")
    synced(other, "sub")
    producer = clients()
    producer.send("/queue/comp-a,/queue/comp-b,/topic/comp-t", "rocks", receipt="r")
    assert wait_until(lambda: sorted(bodies(consumer)) == ["rocks", "rocks"])
    assert wait_until(lambda: bodies(other) == ["rocks"])
    destinations = sorted(m.headers["destination"] for m in recorder(consumer).messages)
    assert destinations == ["/queue/comp-a", "/topic/comp-t"]


def test_wildcard_subscriptions_match_existing_and_new_destinations(
    clients: Callable[..., Any],
) -> None:
    producer = clients()
    producer.send("/topic/PRICE.STOCK.NASDAQ.IBM", "warm-up", receipt="w")  # exists first
    synced(producer, "w2")
    stocks = clients()
    stocks.subscribe("/topic/PRICE.STOCK.**", id="all")
    digits = clients()
    digits.subscribe("/topic/PRICE.STOCK.*.*{[0-9]}", id="digits")
    nasdaq = clients()
    nasdaq.subscribe("/topic/PRICE.STOCK.NASDAQ.*", id="nasdaq")
    for conn in (stocks, digits, nasdaq):
        synced(conn, "subscribed")
    for name in ("PRICE.STOCK.NASDAQ.IBM", "PRICE.STOCK.NYSE.SUNW", "PRICE.STOCK.NYSE.X1"):
        producer.send(f"/topic/{name}", name, receipt=name)  # two of them created now
    producer.send("/topic/PRICE.BOND.X1", "bond", receipt="bond")
    assert wait_until(lambda: len(bodies(stocks)) == 3), bodies(stocks)
    assert sorted(bodies(stocks)) == [
        "PRICE.STOCK.NASDAQ.IBM",
        "PRICE.STOCK.NYSE.SUNW",
        "PRICE.STOCK.NYSE.X1",
    ]
    assert wait_until(lambda: bodies(digits) == ["PRICE.STOCK.NYSE.X1"])
    assert bodies(nasdaq) == ["PRICE.STOCK.NASDAQ.IBM"]
    frame = recorder(stocks).messages[0]
    assert frame.headers["destination"].startswith("/topic/PRICE.STOCK.")
    stocks.unsubscribe("all")
    synced(stocks, "unsubscribed")
    producer.send("/topic/PRICE.STOCK.NYSE.SUNW", "after", receipt="after")
    assert wait_until(
        lambda: bodies(nasdaq) == ["PRICE.STOCK.NASDAQ.IBM"] and "after" not in bodies(stocks)
    )
    synced(producer, "done")
    assert len(bodies(stocks)) == 3


def test_wildcards_are_refused_on_send(featured: Serve, raws: Callable[[int], Raw]) -> None:
    raw = raws(featured.port)
    raw.connect()
    raw.send(b"SEND\ndestination:/queue/a.*\nreceipt:w\n\nx\x00")
    error = raw.next()
    assert error.command is Command.ERROR and "only be used in SUBSCRIBE" in str(
        error.header("message")
    )


@pytest.mark.parametrize("bad", ["/queue/a$b", "/queue/a..b", "/queue/", "/bogus/x", "/queue/é"])
def test_destination_name_restrictions(
    featured: Serve, raws: Callable[[int], Raw], bad: str
) -> None:
    raw = raws(featured.port)
    raw.connect()
    raw.send(f"SEND\ndestination:{bad}\nreceipt:n\n\nx\x00".encode())
    error = raw.next()
    assert error.command is Command.ERROR and error.header("receipt-id") == "n"
    assert raw.closed_by_server()
    ok = raws(featured.port)  # URL-encoded names are fine, and the broker still serves
    ok.connect()
    ok.send(b"SUBSCRIBE\nid:1\ndestination:/queue/caf%C3%A9\n\n\x00")
    ok.send(b"SEND\ndestination:/queue/caf%C3%A9\n\nyes\x00")
    assert ok.next().body == b"yes"


def test_retained_topic_message(clients: Callable[..., Any]) -> None:
    producer = clients()
    producer.send("/topic/stock.IBM", "111.00", headers={"retain": "set"}, receipt="a")
    producer.send("/topic/stock.IBM", "112.12", headers={"retain": "set"}, receipt="b")
    synced(producer, "c")
    late = clients()
    late.subscribe("/topic/stock.IBM", id="s")
    assert wait_until(lambda: bodies(late) == ["112.12"])
    producer.send("/topic/stock.IBM", "gone", headers={"retain": "remove"}, receipt="d")
    assert wait_until(lambda: bodies(late) == ["112.12", "gone"])
    later = clients()
    later.subscribe("/topic/stock.IBM", id="s")
    synced(later, "subscribed")
    producer.send("/topic/stock.IBM", "live", receipt="e")
    assert wait_until(lambda: bodies(later) == ["live"])


@pytest.mark.parametrize("kind", ["queue", "topic"])  # /temp-topic/: a test since session 16
def test_temporary_queue_reply_to_and_owner_only(
    clients: Callable[..., Any], featured: Serve, raws: Callable[[int], Raw], kind: str
) -> None:
    requester = clients()
    requester.subscribe(f"/temp-{kind}/replies", id="r")
    synced(requester, "subscribed")
    server = clients()
    server.subscribe("/queue/PO.REQUEST", id="s")
    synced(server, "subscribed")
    requester.send("/queue/PO.REQUEST", "PO145", headers={"reply-to": f"/temp-{kind}/replies"})
    assert wait_until(lambda: len(bodies(server)) == 1)
    reply_to = recorder(server).messages[0].headers["reply-to"]
    # rewritten to the broker-wide name of the requester's temporary destination
    assert reply_to.startswith(f"/{kind}/temp.default.") and reply_to.endswith(".replies")
    server.send(reply_to, "accepted", receipt="replied")
    assert wait_until(lambda: bodies(requester) == ["accepted"])
    thief = raws(featured.port)
    thief.connect()
    thief.send(f"SUBSCRIBE\nid:1\ndestination:{reply_to}\nreceipt:t\n\n\x00".encode())
    error = thief.next()
    assert error.command is Command.ERROR and "another connection" in str(error.header("message"))
    requester.disconnect()  # its temporary queue goes with it
    assert wait_until(lambda: not requester.is_connected())
    late = clients()
    late.send(reply_to, "too late", receipt="late")
    assert wait_until(lambda: len(recorder(late).errors) == 1)
    assert "no such temporary destination" in recorder(late).errors[0].headers["message"]


def test_exclusive_subscription_gets_everything_then_fails_over(
    clients: Callable[..., Any],
) -> None:
    normal = clients()
    normal.subscribe("/queue/excl", id="n", ack="client-individual")
    first = clients()
    first.subscribe("/queue/excl", id="x", ack="client-individual", headers={"exclusive": "true"})
    second = clients()
    second.subscribe("/queue/excl", id="x", ack="client-individual", headers={"exclusive": "true"})
    for conn in (normal, first, second):
        synced(conn, "subscribed")
    producer = clients()
    for i in range(10):
        producer.send("/queue/excl", f"m{i}")
    synced(producer, "sent")
    assert wait_until(lambda: len(bodies(first)) == 10)
    assert bodies(normal) == [] and bodies(second) == []
    for frame in recorder(first).messages[:4]:
        first.ack(frame.headers["ack"])
    synced(first, "acked")
    first.disconnect()  # the 6 unacknowledged fail over to the next exclusive one, in order
    assert wait_until(lambda: len(bodies(second)) == 6), bodies(second)
    assert bodies(second) == [f"m{i}" for i in range(4, 10)]
    assert bodies(normal) == []
    producer.send("/queue/excl", "m10", receipt="m10")
    assert wait_until(lambda: bodies(second)[-1:] == ["m10"])


def test_message_groups_stick_to_one_consumer_and_rebalance(
    clients: Callable[..., Any],
) -> None:
    a = clients()
    a.subscribe("/queue/groups", id="s", ack="client-individual")
    synced(a, "subscribed")
    producer = clients()
    # rendezvous hashing over two random consumer ids: with n groups, all on one consumer
    # has odds 2**(1-n): 12 groups, 1 in 2,048 (CI stop 23 failed so once: consistent with
    # it, not proven; 160 runs here, loaded, did not repeat it); 32 groups, 1 in 2**31
    n = 32
    groups = [f"g{i}" for i in range(n)]
    for group in groups:
        producer.send("/queue/groups", group, headers={"message_group": group})
    synced(producer, "first")
    assert wait_until(lambda: len(bodies(a)) == n)
    b = clients()  # joins while every group is in flight on a
    b.subscribe("/queue/groups", id="s", ack="client-individual")
    synced(b, "subscribed")
    for group in groups:
        producer.send("/queue/groups", group, headers={"message_group": group})
    synced(producer, "second")
    # nothing moves while a still has the groups' first messages unacknowledged
    assert wait_until(lambda: len(bodies(a)) == 2 * n)
    assert bodies(b) == []
    for frame in list(recorder(a).messages):
        a.ack(frame.headers["ack"])
    synced(a, "acked")
    for group in groups:
        producer.send("/queue/groups", group, headers={"message_group": group})
    synced(producer, "third")
    # rebalanced: each group now on one consumer, and b took its share
    assert wait_until(lambda: len(bodies(a)) + len(bodies(b)) == 3 * n)
    on_a, on_b = set(bodies(a)[2 * n :]), set(bodies(b))
    placed = f"round 3: a {sorted(on_a)}, b {sorted(on_b)}"
    assert on_b and on_a and not on_a & on_b and on_a | on_b == set(groups), placed
    for frame in recorder(b).messages:
        b.ack(frame.headers["ack"])
    for group in groups:  # and they stay put
        producer.send("/queue/groups", group, headers={"message_group": group})
    synced(producer, "fourth")
    assert wait_until(lambda: len(bodies(a)) + len(bodies(b)) == 4 * n)
    assert set(bodies(b)[len(on_b) :]) == on_b


def test_user_timestamp_and_redelivery_headers(clients: Callable[..., Any]) -> None:
    producer = clients("alice")
    producer.send("/queue/hdrs", "x", headers={"JMSXUserID": "mallory"}, receipt="r")
    synced(producer, "sent")
    consumer = clients("bob")
    consumer.subscribe("/queue/hdrs", id="s", ack="client-individual")
    assert wait_until(lambda: len(bodies(consumer)) == 1)
    first = recorder(consumer).messages[0]
    assert first.headers["JMSXUserID"] == "alice"  # the broker's, not the forged one
    assert int(first.headers["timestamp"]) > 1_700_000_000_000
    assert "redeliveries" not in first.headers
    consumer.nack(first.headers["ack"])
    assert wait_until(lambda: len(bodies(consumer)) == 2)
    assert recorder(consumer).messages[1].headers["redeliveries"] == "1"
    assert "Stomp-User" not in recorder(consumer).messages[1].headers


# -- broker serve: WebSocket, TLS, usage errors ------------------------------------------


def test_stomp_over_websocket_meets_tcp(
    serve_factory: Callable[..., Serve], raws: Callable[[int], Raw]
) -> None:
    pytest.importorskip("websockets")
    from websockets.sync.client import connect

    from tests.stomp.test_websocket import WsPeer

    ws_port = free_port()
    server = serve_factory("--stomp-ws", f"ws://127.0.0.1:{ws_port}")
    tcp = raws(server.port)
    tcp.connect()
    tcp.send(b"SUBSCRIBE\nid:1\ndestination:/queue/from-browser\n\n\x00")
    tcp.send(b"SEND\ndestination:/queue/sync\nreceipt:sub\n\n\x00")
    assert tcp.next().command is Command.RECEIPT
    with connect(f"ws://127.0.0.1:{ws_port}/stomp", subprotocols=["v12.stomp"]) as ws:  # type: ignore[list-item]
        peer = WsPeer(ws)
        ws.send(b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\x00")
        assert peer.next().command is Command.CONNECTED
        ws.send(b"SEND\ndestination:/queue/from-browser\nreceipt:r\n\nhi from ws\x00")
        assert peer.next().command is Command.RECEIPT
    message = tcp.next()
    assert message.command is Command.MESSAGE and message.body == b"hi from ws"


def test_stomp_over_tls(serve_factory: Callable[..., Serve], tmp_path: Path) -> None:
    """``--stomp-tls-cert/-key`` put both ports behind TLS: a TCP client over TLS and a
    ``wss://`` one meet (``wss`` since session 16); a plain ``ws://`` client and a plain
    TCP CONNECT are not served."""
    import socket
    import ssl

    pytest.importorskip("websockets")
    from websockets.exceptions import InvalidHandshake
    from websockets.sync.client import connect

    from broker.stomp.frames import SERVER_COMMANDS, FrameParser, Version
    from tests.stomp.test_listener import self_signed
    from tests.stomp.test_websocket import WsPeer

    key, cert = self_signed(tmp_path)
    ws_port = free_port()
    server = serve_factory(
        "--stomp-ws", f"ws://127.0.0.1:{ws_port}",
        "--stomp-tls-cert", str(cert), "--stomp-tls-key", str(key),
    )  # fmt: skip
    context = ssl.create_default_context(cafile=str(cert))
    with (
        socket.create_connection(("127.0.0.1", server.port), timeout=WAIT) as plain,
        context.wrap_socket(plain, server_hostname="localhost") as tls,
    ):
        tls.sendall(b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\x00")
        tls.sendall(b"SUBSCRIBE\nid:1\ndestination:/queue/wss\nreceipt:sub\n\n\x00")
        parser = FrameParser(commands=SERVER_COMMANDS, version=Version.V1_2)
        frames: list[Frame] = []
        while len(frames) < 2:  # CONNECTED, then the subscription's RECEIPT
            data = tls.recv(4096)
            assert data
            frames.extend(parser.feed(data))
        url = f"wss://localhost:{ws_port}/stomp"
        with connect(url, ssl=context, subprotocols=["v12.stomp"]) as ws:  # type: ignore[list-item]
            peer = WsPeer(ws)
            ws.send(b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\x00")
            assert peer.next().command is Command.CONNECTED
            ws.send(b"SEND\ndestination:/queue/wss\nreceipt:r\n\nover wss\x00")
            assert peer.next().header("receipt-id") == "r"
        while len(frames) < 3:
            data = tls.recv(4096)
            assert data
            frames.extend(parser.feed(data))
    assert [f.command for f in frames] == [Command.CONNECTED, Command.RECEIPT, Command.MESSAGE]
    assert frames[2].body == b"over wss"
    with (
        pytest.raises((OSError, InvalidHandshake)),  # plain WebSocket on the TLS port
        connect(f"ws://127.0.0.1:{ws_port}/stomp", open_timeout=WAIT) as ws,
    ):
        ws.send(b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\x00")
        ws.recv(timeout=WAIT)
    cleartext = Raw(server.port)  # plain TCP on the TLS port: no CONNECTED
    try:
        cleartext.send(b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\x00")
        assert cleartext.closed_by_server()
        assert all(f.command is not Command.CONNECTED for f in cleartext.frames)
    finally:
        cleartext.close()


def test_unreadable_tls_certificate_is_one_line_exit_1(tmp_path: Path) -> None:
    import sys

    missing = str(tmp_path / "missing.pem")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "broker",
            "serve",
            "--bind",
            f"tcp://127.0.0.1:{free_port()}",
            "--stomp",
            f"tcp://127.0.0.1:{free_port()}",
            "--stomp-tls-cert",
            missing,
            "--stomp-tls-key",
            missing,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.count("\n") == 1 and "TLS certificate" in done.stderr


# -- pipelined SENDs: receipts in order, and nothing after a refused one ------------------


def test_pipelined_sends_get_receipts_in_order_then_disconnect(
    featured: Serve, raws: Callable[[int], Raw]
) -> None:
    consumer = raws(featured.port)
    consumer.connect()
    consumer.send(b"SUBSCRIBE\nid:1\ndestination:/queue/piped\nreceipt:s\n\n\x00")
    assert consumer.next().command is Command.RECEIPT
    raw = raws(featured.port)
    raw.connect()
    burst = b"".join(
        f"SEND\ndestination:/queue/piped\nreceipt:r{i}\n\nm{i}\x00".encode() for i in range(300)
    )
    raw.send(burst + b"DISCONNECT\nreceipt:bye\n\n\x00")
    receipts = [raw.next() for _ in range(301)]
    assert [f.header("receipt-id") for f in receipts] == [f"r{i}" for i in range(300)] + ["bye"]
    assert raw.closed_by_server()
    bodies_in = [consumer.next().body for _ in range(300)]
    assert bodies_in == [f"m{i}".encode() for i in range(300)]


def test_nothing_after_a_refused_pipelined_send_takes_effect(
    featured: Serve, raws: Callable[[int], Raw], clients: Callable[..., Any]
) -> None:
    raw = raws(featured.port)
    raw.connect()
    frames = [f"SEND\ndestination:/queue/half\nreceipt:r{i}\n\nm{i}\x00" for i in range(5)]
    # a reply to a temporary queue whose connection is gone: refused by the engine
    frames.append("SEND\ndestination:/queue/temp.default.999999.x\nreceipt:bad\n\nx\x00")
    frames += [f"SEND\ndestination:/queue/half\nreceipt:q{i}\n\nlate{i}\x00" for i in range(5)]
    raw.send("".join(frames).encode())
    got = [raw.next() for _ in range(6)]
    assert [f.command for f in got] == [Command.RECEIPT] * 5 + [Command.ERROR]
    assert got[5].header("receipt-id") == "bad"
    assert raw.closed_by_server() and raw.frames == []
    reader = clients()
    reader.subscribe("/queue/half", id="s")
    synced(reader, "subscribed")
    assert wait_until(lambda: len(bodies(reader)) == 5)
    synced(reader, "again")
    assert bodies(reader) == [f"m{i}" for i in range(5)]


def test_selectors_filter_topic_copies(clients: Callable[..., Any]) -> None:
    blue = clients()
    blue.subscribe("/topic/cars", id="s", headers={"selector": "color = 'blue' AND weight > 2500"})
    synced(blue, "subscribed")
    producer = clients()
    producer.send("/topic/cars", "light", headers={"color": "blue", "weight": "1000"})
    producer.send("/topic/cars", "red", headers={"color": "red", "weight": "3000"})
    producer.send("/topic/cars", "heavy", headers={"color": "blue", "weight": "3000"})
    synced(producer, "sent")
    assert wait_until(lambda: bodies(blue) == ["heavy"])
    # (queue selectors: tests/stomp/test_serve_flow.py)


# -- bad input against broker serve: one ERROR, the others keep being served ------------


@pytest.mark.parametrize(
    ("attack", "match"),
    [
        (b"\x00\xffgarbage\n\n\x00", "unknown command"),
        (
            b"SEND\ndestination:/queue/bad\nx:" + b"y" * (1024 * 1024) + b"\n\n\x00",
            "max_header_length",
        ),
        (b"SEND\ndestination:/queue/bad\n" + b"h:v\n" * 100_000 + b"\n\x00", "max_headers"),
        (
            b"SEND\ndestination:/queue/bad\ncontent-length:65537\n\n" + b"x" * 65537 + b"\x00",
            "max_body",
        ),
        (b"SEND\ndestination:/queue/bad\n\n" + b"x" * 70_000 + b"\x00", "max_body"),
    ],
    ids=["garbage", "1MiB-header", "100k-headers", "announced-body", "unannounced-body"],
)
def test_bad_input_gets_one_error_and_spares_the_others(
    featured: Serve,
    raws: Callable[[int], Raw],
    clients: Callable[..., Any],
    attack: bytes,
    match: str,
) -> None:
    calm = clients()
    calm.subscribe("/queue/calm", id="s")
    synced(calm, "subscribed")
    raw = raws(featured.port)
    raw.connect()
    # the broker may close while we are still sending: it has answered already
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        raw.send(attack)
    error = raw.next()
    assert error.command is Command.ERROR and match in str(error.header("message")), error
    assert raw.closed_by_server()
    producer = clients()
    producer.send("/queue/calm", "still here", receipt="r")
    assert wait_until(lambda: bodies(calm) == ["still here"])


def test_a_frame_split_at_every_byte_is_one_frame(
    featured: Serve, raws: Callable[[int], Raw]
) -> None:
    raw = raws(featured.port)
    raw.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for byte in b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\x00":
        raw.send(bytes([byte]))
    assert raw.next().command is Command.CONNECTED
    frames = (
        b"SUBSCRIBE\nid:1\ndestination:/queue/split\n\n\x00"
        b"SEND\ndestination:/queue/split\ncontent-length:5\nk:a\\cb\n\nx\x00y\x00z\x00"
    )
    for byte in frames:
        raw.send(bytes([byte]))
    message = raw.next()
    assert message.command is Command.MESSAGE and message.body == b"x\x00y\x00z"
    assert message.header("k") == "a:b"


# -- browsing a queue (seq4's reading by sequence) ---------------------------------------


def test_browser_reads_without_consuming_from_seq_with_include_seq(
    clients: Callable[..., Any],
) -> None:
    producer = clients()
    for i in range(1, 1201):  # more than one browse page (500)
        producer.send("/queue/browsed", f"b{i}")
    synced(producer, "sent")
    browser = clients()
    browser.subscribe("/queue/browsed", id="b", headers={"browser": "true", "include-seq": "seq"})
    assert wait_until(lambda: len(recorder(browser).messages) == 1201, timeout=30)
    frames = recorder(browser).messages
    assert [f.body for f in frames[:-1]] == [f"b{i}" for i in range(1, 1201)]
    assert [int(f.headers["seq"]) for f in frames[:-1]] == list(range(1, 1201))
    assert frames[-1].headers["browser"] == "end"
    late = clients()  # from-seq: where to start
    late.subscribe(
        "/queue/browsed",
        id="l",
        headers={"browser": "true", "from-seq": "1199", "include-seq": "s"},
    )
    assert wait_until(lambda: len(recorder(late).messages) == 3)
    assert [f.body for f in recorder(late).messages[:2]] == ["b1199", "b1200"]
    consumer = clients()  # nothing was consumed by the browsers
    consumer.subscribe("/queue/browsed", id="c")
    assert wait_until(lambda: len(bodies(consumer)) == 1200, timeout=30)


@pytest.mark.parametrize(
    ("headers", "match"),
    [
        ({"browser": "true", "from-seq": "x"}, "must be an integer"),
    ],
)
def test_browse_options_the_engine_cannot_serve_are_errors(
    featured: Serve, raws: Callable[[int], Raw], headers: dict[str, str], match: str
) -> None:
    raw = raws(featured.port)
    raw.connect()
    extra = "".join(f"{k}:{v}\n" for k, v in headers.items())
    raw.send(f"SUBSCRIBE\nid:1\ndestination:/queue/browsed2\n{extra}receipt:r\n\n\x00".encode())
    error = raw.next()
    assert error.command is Command.ERROR and match in str(error.header("message")), error


def test_sends_split_at_every_byte_then_garbage_lose_nothing(
    serve_factory: Callable[..., Serve], raws: Callable[[int], Raw]
) -> None:
    """Adversary for the SEND and parser paths (``broker serve --stomp``): a run of plain
    SENDs (control headers only, receipts) written one byte per write, then garbage: the
    garbage gets an ERROR and the close, after the RECEIPT of every SEND (since session
    14: those still unanswered when the garbage was read lost theirs); every SEND is
    delivered, once, in order; a second producer is served after it."""
    server = serve_factory()
    consumer = raws(server.port)
    consumer.connect()
    consumer.send(b"SUBSCRIBE\nid:s\ndestination:/queue/split\nreceipt:sub\n\n\x00")
    assert consumer.next().command is Command.RECEIPT
    producer = raws(server.port)
    producer.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    producer.connect()
    run = b"".join(
        b"SEND\ndestination:/queue/split\ncontent-length:3\nreceipt:r%d\n\nm%02d\x00" % (i, i)
        for i in range(12)
    )
    for i in range(len(run)):
        producer.send(run[i : i + 1])
    producer.send(b"\x16\x03\x01 not stomp\n\n\x00")
    frames = []
    while not frames or frames[-1].command is not Command.ERROR:
        frames.append(producer.next())
    assert [f.header("receipt-id") for f in frames[:-1]] == [f"r{i}" for i in range(12)]
    assert producer.closed_by_server()
    late = raws(server.port)
    late.connect()
    late.send(b"SEND\ndestination:/queue/split\nreceipt:late\ncontent-length:4\n\nlate\x00")
    assert late.next().header("receipt-id") == "late"
    got = []
    while not got or got[-1] != b"late":
        got.append(consumer.next().body)
    assert got == [b"m%02d" % i for i in range(12)] + [b"late"]
