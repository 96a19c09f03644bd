"""``broker serve --stomp``: queue subscriptions' selectors, credit windows (count and
size, transactional ACKs) and ``include-seq``, with stomp.py and raw frames over real
sockets (the engine applies them: ``broker.engine.per_message``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from broker.stomp.frames import Command, Frame
from tests.polling import wait_until
from tests.stomp.test_listener import Raw
from tests.stomp.test_serve import Serve, bodies, recorder, synced


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    serve = Serve(tmp_path_factory.mktemp("flow"))
    yield serve
    assert serve.stop() == 0


def frame(command: str, **headers: str) -> bytes:
    lines = [command] + [f"{k.replace('_', '-')}:{v}" for k, v in headers.items()]
    return ("\n".join(lines) + "\n\n\x00").encode()


def raw_synced(raw: Raw, tag: str) -> list[Frame]:
    """Everything the broker sent ``raw`` before it answered a receipt sent now (what
    the engine had posted for it by then has been written first)."""
    raw.send(frame("SEND", destination="/queue/flow-sync-sink", receipt=tag))
    got: list[Frame] = []
    while True:
        f = raw.next()
        if f.command is Command.RECEIPT and f.header("receipt-id") == tag:
            return got
        got.append(f)


def send_all(producer: Any, destination: str, items: list[tuple[str, dict[str, str]]]) -> None:
    """SEND each (body, headers) with a receipt; returns once the broker took all."""
    for i, (body, headers) in enumerate(items):
        producer.send(destination, body, headers=headers, receipt=f"{destination}-{i}")
    tags = {f"{destination}-{i}" for i in range(len(items))}
    assert wait_until(lambda: tags <= set(recorder(producer).receipts), timeout=30)


# -- selectors on queue subscriptions ---------------------------------------------------


def test_queue_selectors_split_the_queue_between_consumers(clients: Callable[[], Any]) -> None:
    red, blue = clients(), clients()
    red.subscribe("/queue/cars", id="r", headers={"selector": "color = 'red'"})
    blue.subscribe("/queue/cars", id="b", headers={"selector": "color = 'blue' AND weight > 10"})
    synced(red, "r")
    synced(blue, "b")
    producer = clients()
    cars = [(f"{c}{i}", {"color": c, "weight": "20"}) for i in range(20) for c in ("red", "blue")]
    send_all(producer, "/queue/cars", cars)
    assert wait_until(lambda: len(bodies(red)) == 20 and len(bodies(blue)) == 20)
    assert bodies(red) == [f"red{i}" for i in range(20)]  # in order, each to its selector
    assert bodies(blue) == [f"blue{i}" for i in range(20)]


def test_a_message_nobody_selects_does_not_block_the_queue(
    clients: Callable[[], Any],
) -> None:
    """The head of the queue is a message no consumer selects: the ones behind it still
    go (backlog and live pushes, with a window of one); it goes once someone selects it."""
    producer = clients()
    send_all(
        producer, "/queue/hol", [("green0", {"color": "green"}), ("blue0", {"color": "blue"})]
    )
    blue = clients()
    blue.subscribe(
        "/queue/hol",
        id="b",
        ack="client-individual",
        headers={"selector": "color = 'blue'", "credit": "1,0"},
    )
    assert wait_until(lambda: bodies(blue) == ["blue0"])
    blue.ack(recorder(blue).messages[0].headers["ack"])
    send_all(
        producer,
        "/queue/hol",
        [("green1", {"color": "green"}), ("blue1", {"color": "blue"})],
    )
    assert wait_until(lambda: bodies(blue) == ["blue0", "blue1"])
    synced(blue, "b-sync")
    assert bodies(blue) == ["blue0", "blue1"]  # never a green one
    green = clients()
    green.subscribe("/queue/hol", id="g", headers={"selector": "color IN ('green', 'gray')"})
    assert wait_until(lambda: bodies(green) == ["green0", "green1"])


def test_thousands_of_messages_nobody_selects_do_not_starve_a_selected_one(
    raws: Callable[[], Raw],
) -> None:
    """Regression (selector starvation): a drain used to look past at most 1,000
    messages nobody selects and start again at the head each time, so 1,001 of them kept
    a selected message behind them forever.  Now 2,500 (a backlog), then 1,500 more (live)
    do not; they stay, in order, for a consumer without a selector."""

    def sends(prefix: str, count: int, blue: str) -> bytes:
        head = "SEND\ndestination:/queue/starve\ncolor:"
        frames = [f"{head}green\n\n{prefix}{i}\x00" for i in range(count)]
        return "".join([*frames, f"{head}blue\n\n{blue}\x00"]).encode()

    producer = raws()
    producer.send(sends("g", 2500, "b0"))
    assert raw_synced(producer, "backlog") == []
    blue = raws()
    blue.send(
        frame(
            "SUBSCRIBE",
            id="b",
            destination="/queue/starve",
            ack="client-individual",
            selector="color = 'blue'",
            receipt="sub",
        )
    )
    assert blue.next().command is Command.RECEIPT
    got = blue.next()  # behind 2,500 nobody selects: it comes (the drains go on behind them)
    assert got.command is Command.MESSAGE and got.body == b"b0"
    blue.send(frame("ACK", id=str(got.header("ack"))))
    producer.send(sends("h", 1500, "b1"))
    got = blue.next()  # live, behind 1,500 more
    assert got.command is Command.MESSAGE and got.body == b"b1"
    blue.send(frame("ACK", id=str(got.header("ack"))))
    blue.send(frame("DISCONNECT", receipt="bye"))
    assert blue.next().command is Command.RECEIPT
    anyone = raws()
    anyone.send(frame("SUBSCRIBE", id="a", destination="/queue/starve"))
    seen = [anyone.next().body for _ in range(4000)]
    assert seen == [b"g%d" % i for i in range(2500)] + [b"h%d" % i for i in range(1500)]
    assert raw_synced(anyone, "end") == []  # nothing more: every message once


def test_a_consumer_without_a_selector_takes_what_selectors_leave(
    clients: Callable[[], Any],
) -> None:
    picky, anyone = clients(), clients()
    picky.subscribe("/queue/mixed", id="p", headers={"selector": "n > 15"})
    synced(picky, "p")
    producer = clients()
    send_all(producer, "/queue/mixed", [(str(n), {"n": str(n)}) for n in range(20)])
    assert wait_until(lambda: bodies(picky) == ["16", "17", "18", "19"])
    anyone.subscribe("/queue/mixed", id="a")
    assert wait_until(lambda: bodies(anyone) == [str(n) for n in range(16)])


def test_a_bad_queue_selector_is_an_error_and_the_queue_goes_on(
    raws: Callable[[], Raw], clients: Callable[[], Any]
) -> None:
    raw = raws()
    raw.send(frame("SUBSCRIBE", id="1", destination="/queue/badsel", selector="a = ", receipt="q"))
    error = raw.next()
    assert error.command is Command.ERROR and "selector" in str(error.header("message"))
    consumer = clients()
    consumer.subscribe("/queue/badsel", id="s")
    producer = clients()
    send_all(producer, "/queue/badsel", [("fine", {})])
    assert wait_until(lambda: bodies(consumer) == ["fine"])


# -- credit windows ----------------------------------------------------------------------


def test_the_size_window_stops_deliveries_until_acks_return_bytes(
    raws: Callable[[], Raw], clients: Callable[[], Any]
) -> None:
    """``credit:0,1000``: deliveries go while the unacknowledged payload is below 1000
    octets (the last one may cross it); each ACK gives its octets back."""
    consumer = raws()
    consumer.send(
        frame(
            "SUBSCRIBE",
            id="s",
            destination="/queue/sized",
            ack="client-individual",
            credit="0,1000",
            receipt="sub",
        )
    )
    assert consumer.next().command is Command.RECEIPT
    producer = clients()
    send_all(producer, "/queue/sized", [(f"{i:03d}" + "x" * 297, {}) for i in range(10)])
    got = raw_synced(consumer, "one")
    assert [f.body[:3] for f in got] == [b"000", b"001", b"002", b"003"]  # 1200 octets
    consumer.send(frame("ACK", id=str(got[0].header("ack"))))  # 300 back: 100 left
    got += raw_synced(consumer, "two")
    assert [f.body[:3] for f in got[4:]] == [b"004"]
    for f in got[1:]:
        consumer.send(frame("ACK", id=str(f.header("ack"))))
    got += raw_synced(consumer, "three")
    assert [f.body[:3] for f in got[5:]] == [b"005", b"006", b"007", b"008"]


def test_the_size_window_with_stomp_py(clients: Callable[[], Any]) -> None:
    producer = clients()
    send_all(producer, "/queue/sized2", [(f"m{i}" + "y" * 498, {}) for i in range(6)])
    consumer = clients()
    consumer.subscribe(
        "/queue/sized2", id="s", ack="client-individual", headers={"credit": "0,1000"}
    )
    assert wait_until(lambda: len(bodies(consumer)) == 2)
    synced(consumer, "c1")
    assert len(bodies(consumer)) == 2  # 1000 octets out: the window is closed
    first = recorder(consumer).messages[0]
    consumer.ack(first.headers["ack"])
    assert wait_until(lambda: len(bodies(consumer)) == 3)
    synced(consumer, "c2")
    assert [b[:2] for b in bodies(consumer)] == ["m0", "m1", "m2"]


def test_the_count_window_alone(raws: Callable[[], Raw], clients: Callable[[], Any]) -> None:
    consumer = raws()
    consumer.send(
        frame("SUBSCRIBE", id="s", destination="/queue/counted", ack="client", credit="2,0")
    )
    producer = clients()
    send_all(producer, "/queue/counted", [(f"c{i}", {}) for i in range(5)])
    got = raw_synced(consumer, "one")
    assert [f.body for f in got] == [b"c0", b"c1"]
    consumer.send(frame("ACK", id=str(got[1].header("ack"))))  # cumulative: both
    got += raw_synced(consumer, "two")
    assert [f.body for f in got[2:]] == [b"c2", b"c3"]


def test_a_transactional_ack_returns_credit_at_once_commit_consumes_abort_keeps(
    raws: Callable[[], Raw], clients: Callable[[], Any]
) -> None:
    """Apollo: a transactional ACK widens the window now without consuming; COMMIT
    consumes (no more credit); after ABORT the message is still unacknowledged, a later
    ACK of it consumes it but adds no credit, and what is never acked is redelivered."""
    producer = clients()
    send_all(producer, "/queue/txcredit", [(f"t{i}", {}) for i in range(6)])
    consumer = raws()
    consumer.send(
        frame(
            "SUBSCRIBE",
            id="s",
            destination="/queue/txcredit",
            ack="client-individual",
            credit="1,0",
        )
    )
    got = raw_synced(consumer, "start")
    assert [f.body for f in got] == [b"t0"]
    ack = {f.body: str(f.header("ack")) for f in got}
    consumer.send(frame("BEGIN", transaction="tx1"))
    consumer.send(frame("ACK", id=ack[b"t0"], transaction="tx1"))
    got = raw_synced(consumer, "tx-ack")
    assert [f.body for f in got] == [b"t1"]  # the credit came back before COMMIT
    ack.update({f.body: str(f.header("ack")) for f in got})
    consumer.send(frame("COMMIT", transaction="tx1"))  # t0 consumed; no credit again
    assert raw_synced(consumer, "commit") == []
    consumer.send(frame("BEGIN", transaction="tx2"))
    consumer.send(frame("ACK", id=ack[b"t1"], transaction="tx2"))
    got = raw_synced(consumer, "tx2-ack")
    assert [f.body for f in got] == [b"t2"]
    ack.update({f.body: str(f.header("ack")) for f in got})
    consumer.send(frame("ABORT", transaction="tx2"))  # t1 stays unacknowledged
    consumer.send(frame("ACK", id=ack[b"t1"]))  # consumes t1, no credit (given already)
    assert raw_synced(consumer, "after-abort") == []
    consumer.close()  # t2 never acknowledged: redelivered
    other = clients()
    other.subscribe("/queue/txcredit", id="o")
    assert wait_until(lambda: sorted(bodies(other)) == ["t2", "t3", "t4", "t5"])


# -- credit windows on topic subscriptions ----------------------------------------------


def test_the_size_window_of_a_topic_subscription_drops_copies_beyond_it(
    raws: Callable[[], Raw], clients: Callable[[], Any]
) -> None:
    """``credit:0,1000`` on a topic with client acks: copies go while the unacknowledged
    octets are below 1000 (the last may cross it); a topic keeps nothing, so the copies
    that came while the window was closed are gone for it; each ACK gives octets back.
    A subscriber without credit gets every copy meanwhile."""
    consumer = raws()
    consumer.send(
        frame(
            "SUBSCRIBE",
            id="s",
            destination="/topic/tsized",
            ack="client-individual",
            credit="0,1000",
            receipt="sub",
        )
    )
    assert consumer.next().command is Command.RECEIPT
    everyone = clients()
    everyone.subscribe("/topic/tsized", id="e")
    synced(everyone, "e")
    producer = clients()
    send_all(producer, "/topic/tsized", [(f"{i:03d}" + "x" * 297, {}) for i in range(10)])
    # (both copies of a message reach the listener together: once ``everyone`` has the
    # last one, the consumer's copies were delivered or dropped)
    assert wait_until(lambda: len(bodies(everyone)) == 10)
    # (both copies of a message reach the listener together: once ``everyone`` has the
    # last one, the consumer's copies were delivered or dropped)
    assert wait_until(lambda: len(bodies(everyone)) == 10)
    got = raw_synced(consumer, "one")
    assert [f.body[:3] for f in got] == [b"000", b"001", b"002", b"003"]  # 1200 octets
    consumer.send(frame("ACK", id=str(got[0].header("ack"))))  # 300 back: 100 left
    assert raw_synced(consumer, "acked") == []  # (the ACK is in before the next SENDs)
    send_all(producer, "/topic/tsized", [(f"{i:03d}" + "y" * 297, {}) for i in range(10, 13)])
    assert wait_until(lambda: len(bodies(everyone)) == 13)
    got += raw_synced(consumer, "two")
    assert [f.body[:3] for f in got[4:]] == [b"010"]
    for f in got[1:]:
        consumer.send(frame("ACK", id=str(f.header("ack"))))
    assert raw_synced(consumer, "acked-all") == []
    send_all(producer, "/topic/tsized", [(f"{i:03d}" + "z" * 297, {}) for i in range(13, 15)])
    assert wait_until(lambda: len(bodies(everyone)) == 15)  # nobody held back
    got += raw_synced(consumer, "three")
    assert [f.body[:3] for f in got[5:]] == [b"013", b"014"]


def test_a_topic_window_comes_back_once_for_a_transactional_ack(
    raws: Callable[[], Raw], clients: Callable[[], Any]
) -> None:
    """Adversary: a transactional ACK gives a topic copy's credit back at once; its
    COMMIT, or a second plain ACK of the same copy, gives nothing more."""
    consumer = raws()
    consumer.send(
        frame(
            "SUBSCRIBE",
            id="s",
            destination="/topic/ttx",
            ack="client-individual",
            credit="1,0",
            receipt="sub",
        )
    )
    assert consumer.next().command is Command.RECEIPT
    everyone = clients()
    everyone.subscribe("/topic/ttx", id="e")
    synced(everyone, "e")
    producer = clients()
    send_all(producer, "/topic/ttx", [("a0", {}), ("a1", {})])
    assert wait_until(lambda: len(bodies(everyone)) == 2)
    got = raw_synced(consumer, "start")
    assert [f.body for f in got] == [b"a0"]  # one message of credit
    consumer.send(frame("BEGIN", transaction="tx"))
    consumer.send(frame("ACK", id=str(got[0].header("ack")), transaction="tx"))
    consumer.send(frame("COMMIT", transaction="tx"))
    consumer.send(frame("ACK", id=str(got[0].header("ack"))))
    assert raw_synced(consumer, "acks") == []
    send_all(producer, "/topic/ttx", [("b0", {}), ("b1", {})])
    assert wait_until(lambda: len(bodies(everyone)) == 4)
    got = raw_synced(consumer, "after")
    assert [f.body for f in got] == [b"b0"]  # credit for one, not three


# -- include-seq on consuming subscriptions ----------------------------------------------


def test_include_seq_on_a_consuming_queue_subscription(
    clients: Callable[[], Any], raws: Callable[[], Raw]
) -> None:
    producer = clients()
    send_all(producer, "/queue/seqd", [(f"s{i}", {"Stomp-Seq2": "x"}) for i in range(1, 6)])
    consumer = raws()
    consumer.send(
        frame(
            "SUBSCRIBE",
            id="s",
            destination="/queue/seqd",
            ack="client-individual",
            include_seq="seq",
        )
    )
    got = raw_synced(consumer, "got")
    assert [(f.body, f.header("seq")) for f in got] == [
        (f"s{i}".encode(), str(i)) for i in range(1, 6)
    ]
    assert all(f.header("stomp-seq") is None and f.header("Stomp-Seq") is None for f in got)
    consumer.send(frame("NACK", id=str(got[2].header("ack"))))  # redelivered: same sequence
    again = raw_synced(consumer, "again")
    assert [(f.body, f.header("seq")) for f in again] == [(b"s3", "3")]
    plain = raws()  # a subscription without include-seq shows no sequence
    plain.send(frame("SUBSCRIBE", id="p", destination="/queue/seqd2"))
    send_all(producer, "/queue/seqd2", [("p", {})])
    (message,) = raw_synced(plain, "plain")
    assert message.header("seq") is None


def test_a_send_cannot_forge_the_sequence_header(raws: Callable[[], Raw]) -> None:
    raw = raws()
    raw.send(frame("SEND", destination="/queue/forged", **{"Stomp-Seq": "7"}, receipt="r"))
    error = raw.next()
    assert error.command is Command.ERROR and "reserved" in str(error.header("message"))


# -- from-seq on consuming queue subscriptions ---------------------------------------------


def test_from_seq_on_a_consuming_subscription(
    clients: Callable[[], Any], raws: Callable[[], Raw]
) -> None:
    """Only messages numbered from-seq or more; the older ones are not blocked: they go
    to a consumer without from-seq.  -1: only messages sent after it subscribed."""
    producer = clients()
    send_all(producer, "/queue/fromseq", [(f"f{i}", {}) for i in range(1, 6)])
    late = raws()
    late.send(
        frame("SUBSCRIBE", id="l", destination="/queue/fromseq", from_seq="3", include_seq="q")
    )
    got = raw_synced(late, "late")
    assert [(f.body, f.header("q")) for f in got] == [(b"f3", "3"), (b"f4", "4"), (b"f5", "5")]
    early = clients()
    early.subscribe("/queue/fromseq", id="e")
    assert wait_until(lambda: bodies(early) == ["f1", "f2"])
    send_all(producer, "/queue/fromtail", [("old1", {}), ("old2", {})])
    tail = clients()
    tail.subscribe("/queue/fromtail", id="t", headers={"from-seq": "-1"})
    synced(tail, "t")
    send_all(producer, "/queue/fromtail", [("new1", {})])
    assert wait_until(lambda: bodies(tail) == ["new1"])
    synced(tail, "t2")
    assert bodies(tail) == ["new1"]
    head = clients()
    head.subscribe("/queue/fromtail", id="h", headers={"from-seq": "0"})
    assert wait_until(lambda: bodies(head) == ["old1", "old2"])


def test_from_seq_is_refused_on_wildcards_and_composites(raws: Callable[[], Raw]) -> None:
    for destination in ("/queue/fs.*", "/queue/fs1,/queue/fs2"):
        raw = raws()
        raw.send(frame("SUBSCRIBE", id="w", destination=destination, from_seq="1"))
        error = raw.next()
        assert error.command is Command.ERROR and "from-seq" in str(error.header("message"))


def test_a_browser_sees_only_what_its_selector_selects(clients: Callable[[], Any]) -> None:
    producer = clients()
    send_all(producer, "/queue/browsel", [(f"b{i}", {"n": str(i)}) for i in range(6)])
    browser = clients()
    browser.subscribe("/queue/browsel", id="b", headers={"browser": "true", "selector": "n >= 4"})
    assert wait_until(lambda: len(recorder(browser).messages) == 3)
    frames = recorder(browser).messages
    assert [f.body for f in frames[:2]] == ["b4", "b5"]
    assert frames[2].headers["browser"] == "end"
    consumer = clients()  # nothing was consumed
    consumer.subscribe("/queue/browsel", id="c")
    assert wait_until(lambda: len(bodies(consumer)) == 6)
