"""STOMP on the broker engine: stomp.py clients and TMQP ``broker.Client`` s over real
sockets, one engine behind both doors (``broker.stomp.engine_backend``)."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import pytest
import stomp

from broker.client.blocking import Client
from broker.engine.engine import Engine
from broker.server.server import Server, ServerOptions
from broker.stomp.engine_backend import EngineDoor, listen
from broker.stomp.server import ListenerOptions
from broker.stomp.session import SessionConfig
from tests.broker.test_cli import start_serve, stop_serve
from tests.polling import wait_until
from tests.ports import free_port
from tests.stomp.two_doors import Broker, Ctx, Recorder, subscribed


def test_stomp_send_is_consumed_by_a_tmqp_client(
    broker: Broker, tmqp: Callable[[], Client], stomp_client: Any
) -> None:
    conn, rec = stomp_client()
    conn.send("/queue/x", "hello\x00there", headers={"trace": "t-1", "kind": "k"}, receipt="r1")
    assert wait_until(lambda: rec.receipts == ["r1"])
    consumer = tmqp()
    consumer.join("x")
    message = consumer.receive(timeout=10)
    assert message is not None
    assert message.payload == b"hello\x00there"
    assert ("trace", "t-1") in message.headers and ("kind", "k") in message.headers
    assert message.channel == "x" and message.queue_id == 0
    consumer.ack(message)
    assert rec.errors == []


def test_tmqp_push_acked_by_stomp_is_never_redelivered(
    broker: Broker, tmqp: Callable[[], Client], stomp_client: Any
) -> None:
    conn, rec = stomp_client()
    conn.subscribe("/queue/y", id="s1", ack="client-individual")
    assert wait_until(lambda: subscribed(broker, "y", 1))
    producer = tmqp()
    # the queue requests acknowledges: the producer hears of the STOMP client's ACK
    acked = producer.push_async("y", 0, b"from tmqp", headers={"k": "v"})
    assert wait_until(lambda: len(rec.messages) == 1)
    assert not acked.done()
    frame = rec.messages[0]
    assert frame.body == "from tmqp" and frame.headers["k"] == "v"
    assert frame.headers["destination"] == "/queue/y"
    conn.ack(frame.headers["ack"], receipt="acked")
    assert wait_until(lambda: rec.receipts == ["acked"])
    acked.result(10)
    conn.disconnect()  # nothing unacknowledged goes back
    other, rec2 = stomp_client()
    other.subscribe("/queue/y", id="s2", ack="client-individual")
    producer.push("y", 0, b"marker")
    assert wait_until(lambda: rec2.bodies() == ["marker"])
    assert rec2.bodies() == ["marker"]  # the acknowledged message never came back


def test_stomp_nack_puts_the_message_back(
    broker: Broker, tmqp: Callable[[], Client], stomp_client: Any
) -> None:
    conn, rec = stomp_client()
    conn.subscribe("/queue/n", id="s1", ack="client-individual")
    assert wait_until(lambda: subscribed(broker, "n", 1))
    producer = tmqp()
    producer.push("n", 0, b"again")
    assert wait_until(lambda: len(rec.messages) == 1)
    conn.nack(rec.messages[0].headers["ack"])
    assert wait_until(lambda: rec.bodies() == ["again", "again"])  # the only consumer
    first, second = rec.messages
    assert first.headers["message-id"] == second.headers["message-id"]
    conn.ack(second.headers["ack"], receipt="acked")
    assert wait_until(lambda: rec.receipts == ["acked"])
    conn.disconnect()
    consumer = tmqp()
    consumer.join("n")
    assert consumer.receive(timeout=0.3) is None  # acknowledged: gone for good


def test_stomp_unsubscribe_returns_unacked_to_the_next_consumer(
    broker: Broker, tmqp: Callable[[], Client], stomp_client: Any
) -> None:
    conn, rec = stomp_client()
    conn.subscribe("/queue/u", id="s1", ack="client-individual")
    assert wait_until(lambda: subscribed(broker, "u", 1))
    producer = tmqp()
    producer.push("u", 0, b"back")
    assert wait_until(lambda: len(rec.messages) == 1)
    consumer = tmqp()
    consumer.join("u")
    conn.unsubscribe("s1")
    message = consumer.receive(timeout=10)
    assert message is not None and message.payload == b"back"


def test_stomp_disconnect_without_ack_redelivers(
    broker: Broker, tmqp: Callable[[], Client], stomp_client: Any
) -> None:
    conn, rec = stomp_client()
    conn.subscribe("/queue/d", id="s1", ack="client")
    assert wait_until(lambda: subscribed(broker, "d", 1))
    producer = tmqp()
    for i in range(3):
        producer.push("d", 0, f"m{i}")
    assert wait_until(lambda: len(rec.messages) == 3)
    conn.disconnect()
    other, rec2 = stomp_client()
    other.subscribe("/queue/d", id="s2", ack="auto")
    assert wait_until(lambda: rec2.bodies() == ["m0", "m1", "m2"])  # in order


def test_topic_fans_out_to_stomp_and_tmqp_subscribers(
    broker: Broker, tmqp: Callable[[], Client], stomp_client: Any
) -> None:
    a, rec_a = stomp_client()
    b, rec_b = stomp_client()
    a.subscribe("/topic/news", id="a")
    b.subscribe("/topic/news", id="b")
    subscriber = tmqp()
    subscriber.join("/topic/news")
    assert wait_until(lambda: subscribed(broker, "/topic/news", 3))
    a.send("/topic/news", "flash", receipt="r")
    assert wait_until(lambda: rec_a.bodies() == ["flash"] and rec_b.bodies() == ["flash"])
    message = subscriber.receive(timeout=10)
    assert message is not None and message.payload == b"flash"
    subscriber.push("/topic/news", 0, b"from tmqp", ack=True)
    assert wait_until(lambda: rec_a.bodies()[-1:] == ["from tmqp"])
    assert wait_until(lambda: rec_b.bodies()[-1:] == ["from tmqp"])
    assert rec_a.messages[-1].headers["destination"] == "/topic/news"


def test_a_stomp_client_dropping_mid_stream_returns_its_unacked_messages(
    broker: Broker, tmqp: Callable[[], Client], stomp_client: Any
) -> None:
    """A raw client takes deliveries (credit 5) and vanishes without a DISCONNECT."""
    raw = socket.create_connection(("127.0.0.1", broker.listener.port), timeout=10)
    raw.sendall(b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\x00")
    raw.sendall(b"SUBSCRIBE\nid:s\ndestination:/queue/m\nack:client-individual\ncredit:5\n\n\x00")
    assert wait_until(lambda: subscribed(broker, "m", 1))
    producer = tmqp()
    for i in range(20):
        producer.push("m", 0, f"m{i:02}")
    got = b""
    while got.count(b"MESSAGE\n") < 5:
        chunk = raw.recv(65536)
        assert chunk
        got += chunk
    raw.close()
    consumer = tmqp()
    consumer.join("m")
    payloads: set[bytes] = set()
    for message in consumer.consume(timeout=10):
        payloads.add(bytes(message.payload))
        consumer.ack(message)
        if len(payloads) == 20:
            break
    assert payloads == {f"m{i:02}".encode() for i in range(20)}


def test_garbage_on_the_stomp_port_while_tmqp_traffic_flows(
    broker: Broker, tmqp: Callable[[], Client], stomp_client: Any
) -> None:
    consumer = tmqp()
    consumer.join("flow")
    producer = tmqp()
    raws = []
    for i in range(5):
        raw = socket.create_connection(("127.0.0.1", broker.listener.port), timeout=10)
        raw.sendall(b"\x16\x03\x01garbage\x00" * 10 + bytes(range(256)) * i)
        raws.append(raw)
        producer.push("flow", 0, f"p{i}")
    for raw in raws:
        data = b""
        while True:  # an ERROR frame, then the connection closes
            chunk = raw.recv(65536)
            if not chunk:
                break
            data += chunk
        assert data.startswith(b"ERROR\n")
        raw.close()
    got = []
    for message in consumer.consume(timeout=10):
        got.append(bytes(message.payload))
        consumer.ack(message)
        if len(got) == 5:
            break
    assert got == [f"p{i}".encode() for i in range(5)]
    conn, rec = stomp_client()  # the STOMP port still serves
    conn.subscribe("/queue/after", id="s")
    conn.send("/queue/after", "fine")
    assert wait_until(lambda: rec.bodies() == ["fine"])


def test_broker_serve_with_stomp_accepts_stomp_py() -> None:
    port, stomp_port = free_port(), free_port()
    proc = start_serve(
        "--bind", f"tcp://127.0.0.1:{port}", "--stomp", f"tcp://127.0.0.1:{stomp_port}"
    )
    conn = stomp.Connection12([("127.0.0.1", stomp_port)])
    code = None
    try:
        rec = Recorder()
        conn.set_listener("rec", rec)
        conn.connect("user", "pw", wait=True)
        conn.subscribe("/queue/cli", id="s", ack="client-individual")
        conn.send("/queue/cli", "via cli", receipt="r")
        assert wait_until(lambda: rec.bodies() == ["via cli"] and rec.receipts == ["r"])
        conn.ack(rec.messages[0].headers["ack"])
    finally:
        if conn.is_connected():
            conn.disconnect()
        # (a kill if SIGTERM did not stop it in time: session 22 found a `broker serve
        # --data none` left running by this test when its wait ran out)
        code = stop_serve(proc)
    assert code == 0


def raw_stomp(broker: Broker) -> socket.socket:
    raw = socket.create_connection(("127.0.0.1", broker.listener.port), timeout=10)
    raw.sendall(b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\x00")
    got = b""
    while b"\x00" not in got:
        chunk = raw.recv(65536)
        assert chunk
        got += chunk
    assert got.startswith(b"CONNECTED\n")
    return raw


def read_until_closed(raw: socket.socket) -> bytes:
    data = b""
    while chunk := raw.recv(65536):
        data += chunk
    return data


@pytest.mark.parametrize(
    ("header", "why"),
    [
        (b"na\\cme:v", b"header key"),  # a name holding ':' once unescaped
        (b"name:line\\nbreak", b"CR or LF"),  # a value holding a line break
        (b"CC:other", b"reserved"),  # the engine would copy it into channel "other"
        (b"Delivery-Count:7", b"reserved"),
    ],
)
def test_a_send_tmqp_cannot_carry_is_refused_and_nothing_is_lost(
    broker: Broker, tmqp: Callable[[], Client], header: bytes, why: bytes
) -> None:
    consumer = tmqp()
    consumer.join("h")
    raw = raw_stomp(broker)
    raw.sendall(b"SEND\ndestination:/queue/h\nreceipt:r\n" + header + b"\n\nbad\x00")
    answer = read_until_closed(raw)
    raw.close()
    assert answer.startswith(b"ERROR\n") and why in answer and b"receipt-id:r" in answer
    assert b"RECEIPT" not in answer
    raw = raw_stomp(broker)  # the next SEND goes through, and is the only one consumed
    raw.sendall(b"SEND\ndestination:/queue/h\nreceipt:r\nfine:yes\n\ngood\x00")
    message = consumer.receive(timeout=10)
    assert message is not None and message.payload == b"good"
    assert consumer.receive(timeout=0.2) is None
    assert broker.engine.channels.get("other") is None
    raw.close()


def test_a_send_the_engine_refuses_is_an_error_frame(broker: Broker, stomp_client: Any) -> None:
    raw = raw_stomp(broker)
    raw.sendall(b"SEND\ndestination:/queue/has space\nreceipt:r\n\nx\x00")
    answer = read_until_closed(raw)
    raw.close()
    assert answer.startswith(b"ERROR\n") and b"invalid channel name" in answer
    conn, rec = stomp_client()  # others keep being served
    conn.subscribe("/queue/ok", id="s")
    conn.send("/queue/ok", "still")
    assert wait_until(lambda: rec.bodies() == ["still"])


@pytest.mark.parametrize("credit", [None, "40"])
def test_a_stomp_consumer_that_never_reads_holds_at_most_its_window(
    broker: Broker, tmqp: Callable[[], Client], credit: str | None
) -> None:
    """Its deliveries stop at the engine window (credit, else the broker's prefetch); the
    rest stays queued and reaches a TMQP consumer once the STOMP client is gone."""
    window = int(credit) if credit else broker.engine.config.prefetch
    raw = raw_stomp(broker)
    header = f"credit:{credit}\n" if credit else ""
    raw.sendall(f"SUBSCRIBE\nid:s\ndestination:/queue/slow\n{header}\n\x00".encode())
    assert wait_until(lambda: subscribed(broker, "slow", 1))
    producer = tmqp()
    total = 3000
    body = b"x" * 10_000
    for i in range(total):
        producer.push("slow", 0, body, headers={"n": str(i)})
    backend = broker.listener.backend

    def held() -> int:  # deliveries waiting for room in the connection's buffer
        conn = next(iter(backend.conns.values()))  # type: ignore[attr-defined]
        return len(conn.held)

    assert wait_until(lambda: broker.listener.call(held) >= window)
    # a push answered by the engine after every earlier one: their deliveries were posted
    # to the listener before this call runs
    producer.push("slow-sync", 0, b"sync", ack=True)
    assert broker.listener.call(held) == window
    conn = next(iter(backend.conns.values()))  # type: ignore[attr-defined]
    taken = broker.listener.call(lambda: conn.next_tag - 1)  # handed over (auto: settled)
    raw.close()
    consumer = tmqp()
    consumer.join("slow")
    seen: set[str] = set()
    for message in consumer.consume(timeout=10):
        seen.add(dict(message.headers)["n"])
        consumer.ack(message)
        if len(seen) == total - taken:
            break
    # nothing lost: what the auto-ack STOMP connection took is settled, everything it
    # was never handed (the held window too) comes to the TMQP consumer
    assert len(seen) == total - taken


def test_a_tmqp_client_joining_a_temporary_queue_gets_nothing(
    broker: Broker, tmqp: Callable[[], Client], stomp_client: Any
) -> None:
    owner, rec = stomp_client()
    owner.subscribe("/temp-queue/inbox", id="t")
    owner.send("/queue/where", "x", headers={"reply-to": "/temp-queue/inbox"}, receipt="r")
    assert wait_until(lambda: rec.receipts == ["r"])
    name = next(n for n in broker.engine.channels if n.startswith("temp."))
    spy = tmqp()
    spy.join(name)  # the channel exists; the engine lets it join...
    assert wait_until(lambda: subscribed(broker, name, 2))
    sender = tmqp()
    for i in range(5):
        sender.push(name, 0, f"reply {i}".encode(), ack=False)
    assert wait_until(lambda: len(rec.bodies()) == 5)  # ...but only the owner is served
    assert spy.receive(timeout=0.5) is None
    owner.disconnect()
    assert wait_until(lambda: name not in broker.engine.channels)  # deleted with it


def test_temporary_destinations_of_an_earlier_run_are_removed() -> None:
    engine = Engine()
    engine.create_channel("temp.default.1.inbox")
    engine.create_channel("temperature")  # not a temporary name: kept
    door = EngineDoor(engine)
    assert "temp.default.1.inbox" not in engine.channels and "temperature" in engine.channels
    door.close()


def test_message_groups_span_stomp_and_tmqp_consumers(
    broker: Broker, tmqp: Callable[[], Client], stomp_client: Any
) -> None:
    """One engine, two doors: a group sticks to one consumer whichever door it uses."""
    conn, rec = stomp_client()
    conn.subscribe("/queue/mixed", id="s", ack="client-individual")
    assert wait_until(lambda: subscribed(broker, "mixed", 1))
    worker = tmqp()
    worker.join("mixed")
    assert wait_until(lambda: subscribed(broker, "mixed", 2))
    producer, _ = stomp_client()
    groups = [f"g{i}" for i in range(16)]
    for round_ in range(3):
        for group in groups:
            producer.send("/queue/mixed", f"{group}:{round_}", headers={"message_group": group})
    on_tmqp: list[str] = []
    while len(on_tmqp) + len(rec.messages) < 48:
        message = worker.receive(timeout=10)
        if message is None:
            break
        on_tmqp.append(bytes(message.payload).decode())
        worker.ack(message)
    assert wait_until(lambda: len(on_tmqp) + len(rec.messages) == 48)
    tmqp_groups = {body.split(":")[0] for body in on_tmqp}
    stomp_groups = {body.split(":")[0] for body in rec.bodies()}
    assert tmqp_groups and stomp_groups and not tmqp_groups & stomp_groups
    assert tmqp_groups | stomp_groups == set(groups)


def test_a_burst_beyond_the_send_window_is_parked_and_every_receipt_comes_in_order(
    zctx: Ctx,
) -> None:
    """3000 SENDs with receipts in one write, window 8: the listener parks what the
    window has no room for (reading paused) and resumes as answers come; every message
    reaches the queue in order and every RECEIPT comes back in order."""
    engine = Engine()
    door = EngineDoor(engine)
    server = Server(door, ServerOptions(endpoint="tcp://127.0.0.1:*"), context=zctx)
    session = SessionConfig(die_delay=0.1, heartbeat=(0, 0), max_unanswered_sends=8)
    listener = listen(door, server.add_reader, ListenerOptions(port=0, session=session))
    server.start()
    listener.start()
    count = 3000
    try:
        with socket.create_connection(("127.0.0.1", listener.port), timeout=60) as sock:
            sock.sendall(b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\0")
            burst = b"".join(
                b"SEND\ndestination:/queue/burst\nreceipt:r%d\ncontent-length:%d\n\n%d\0"
                % (i, len(str(i)), i)
                for i in range(count)
            )
            sock.sendall(burst)
            data = b""
            while data.count(b"RECEIPT") < count:
                chunk = sock.recv(65536)
                assert chunk, "the listener closed the connection"
                data += chunk
            assert b"ERROR" not in data
            receipts = [
                line.split(b":", 1)[1].decode()
                for line in data.split(b"\n")
                if line.startswith(b"receipt-id:")
            ]
            assert receipts == [f"r{i}" for i in range(count)]
            queue = engine.channels["burst"].queues[0]
            assert wait_until(lambda: queue.messages.count == count)  # a RECEIPT: taken
    finally:
        listener.stop()
        server.stop()
        door.close()


def test_a_consumer_that_never_reads_costs_its_credit_and_spares_everyone_else(
    broker: Broker, stomp_client: Callable[[], tuple[Any, Recorder]]
) -> None:
    """A client-individual consumer with ``credit:0,100000`` whose socket buffer is full
    (it never reads): the broker keeps at most its size window of deliveries for it
    (plus what its socket and the listener's ``max_outbound`` hold); a second consumer of
    the same queue and a producer with a receipt per SEND go on; when it goes, what it
    never acknowledged comes to the other consumer: nothing is lost."""
    stuck = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stuck.settimeout(10)
    stuck.connect(("127.0.0.1", broker.listener.port))
    stuck.sendall(b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\x00")
    assert stuck.recv(65536).startswith(b"CONNECTED\n")
    stuck.sendall(
        b"SUBSCRIBE\nid:s\ndestination:/queue/stuck\nack:client-individual\n"
        b"credit:0,100000\n\n\x00"
    )
    assert wait_until(lambda: subscribed(broker, "stuck", 1))
    good, good_rec = stomp_client()
    good.subscribe("/queue/stuck", id="g", ack="auto")
    assert wait_until(lambda: subscribed(broker, "stuck", 2))
    producer, produced = stomp_client()
    total, body = 400, "x" * 10_000
    for i in range(total):
        producer.send("/queue/stuck", body, headers={"n": str(i)}, receipt=str(i))
    assert wait_until(lambda: len(produced.receipts) == total, timeout=60)
    backend = broker.listener.backend
    conn_id = next(  # the stuck connection: the one with subscription "s"
        c
        for c, conn in backend.conns.items()
        if "s" in conn.subs  # type: ignore[attr-defined]
    )

    def handed() -> int:  # deliveries the broker gave the stuck connection (sent or held)
        conn = backend.conns[conn_id]  # type: ignore[attr-defined]
        return int(conn.next_tag - 1 + len(conn.held))

    window = 100_000 // 10_000 + 1  # the last one may cross the window
    assert wait_until(lambda: len(good_rec.bodies()) == total - broker.listener.call(handed))
    assert 1 <= broker.listener.call(handed) <= window
    unsent = broker.listener.call(broker.listener.outbound_bytes).get(conn_id, 0)
    assert unsent <= window * (10_000 + 500)  # its buffer holds at most its window
    stuck.close()
    assert wait_until(lambda: len(good_rec.bodies()) == total, timeout=30)
    seen = sorted(int(m.headers["n"]) for m in good_rec.messages)
    assert seen == list(range(total))


def test_a_send_reaches_tmqp_with_its_headers_then_the_stamps(
    broker: Broker, tmqp: Callable[[], Client], stomp_client: Any
) -> None:
    """The user and time stamps are appended on the engine thread (no second PublishSpec
    per SEND): the user's headers come first, in order, then Stomp-User and
    Stomp-Timestamp; a synchronous and an asynchronous SEND alike."""
    conn, rec = stomp_client()
    conn.begin("tx")  # a transactional SEND is published synchronously at COMMIT
    conn.send("/queue/st", "one", headers={"a": "1", "b": "2"}, transaction="tx")
    conn.commit("tx")
    conn.send("/queue/st", "two", headers={"a": "3", "b": "4"}, receipt="r")
    assert wait_until(lambda: rec.receipts == ["r"])
    consumer = tmqp()
    consumer.join("st")
    for body, a, b in ((b"one", "1", "2"), (b"two", "3", "4")):
        message = consumer.receive(timeout=10)
        assert message is not None and message.payload == body
        names = [k for k, _ in message.headers]
        assert names[-2:] == ["Stomp-User", "Stomp-Timestamp"], names
        assert ("a", a) in message.headers and ("b", b) in message.headers
        assert names.index("a") < names.index("b") < names.index("Stomp-User")
        assert dict(message.headers)["Stomp-User"] == "user"
        assert dict(message.headers)["Stomp-Timestamp"].isdigit()
        consumer.ack(message)
    assert rec.errors == []
