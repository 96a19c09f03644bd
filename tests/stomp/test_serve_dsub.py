"""Durable subscriptions over STOMP on ``broker serve --stomp --data DIR`` (real process,
raw frames): created by ``SUBSCRIBE persistent:true`` with an ``id``, collecting while
no one reads, surviving kill -9, consumed and browsed as ``/dsub/ID``, destroyed by
``UNSUBSCRIBE persistent:true``; the adversary's frames get an ERROR and change nothing."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from broker.stomp.frames import Command, Frame
from tests.stomp.test_listener import Raw
from tests.stomp.test_serve import Serve


@pytest.fixture
def serve_factory(tmp_path: Path) -> Iterator[Callable[..., Serve]]:
    made: list[Serve] = []

    def make(*extra: str) -> Serve:
        made.append(Serve(tmp_path, *extra))
        return made[-1]

    yield make
    for server in made:
        server.stop()


@pytest.fixture
def raws() -> Iterator[Callable[[int], Raw]]:
    made: list[Raw] = []

    def make(port: int) -> Raw:
        made.append(Raw(port))
        return made[-1]

    yield make
    for raw in made:
        raw.close()


def frame(command: str, body: str = "", **headers: str) -> bytes:
    lines = [command] + [f"{k.replace('_', '-')}:{v}" for k, v in headers.items()]
    return ("\n".join(lines) + "\n\n" + body + "\x00").encode()


def connected(make: Callable[[int], Raw], port: int) -> Raw:
    raw = make(port)
    raw.connect()
    return raw


def expect(raw: Raw, command: Command) -> Frame:
    got = raw.next()
    assert got.command is command, (got.command, got.headers, got.body)
    return got


def receipt(raw: Raw, data: bytes, rid: str) -> None:
    raw.send(data)
    got = expect(raw, Command.RECEIPT)
    assert got.header("receipt-id") == rid


def publish(raw: Raw, destination: str, bodies: list[str]) -> None:
    for i, body in enumerate(bodies):
        receipt(raw, frame("SEND", body, destination=destination, receipt=f"p{i}"), f"p{i}")


def messages(raw: Raw, n: int) -> list[Frame]:
    return [expect(raw, Command.MESSAGE) for _ in range(n)]


def test_durable_subscription_collects_while_away_and_survives_kill_9(
    serve_factory: Callable[..., Serve], raws: Callable[[int], Raw], tmp_path: Path
) -> None:
    server = serve_factory("--data", str(tmp_path / "data"))
    first = connected(raws, server.port)
    sub = frame("SUBSCRIBE", id="mysub", persistent="true", destination="/topic/news", receipt="1")
    receipt(first, sub, "1")
    first.close()  # away: the subscription keeps collecting

    producer = connected(raws, server.port)
    publish(producer, "/topic/news", [f"n{i}" for i in range(5)])
    server.kill9()
    server.restart()

    # browsing does not consume
    browser = connected(raws, server.port)
    browser.send(frame("SUBSCRIBE", id="b", browser="true", destination="/dsub/mysub"))
    seen = messages(browser, 5)
    assert [m.body for m in seen] == [f"n{i}".encode() for i in range(5)]
    end = expect(browser, Command.MESSAGE)
    assert end.header("browser") == "end"

    back = connected(raws, server.port)
    back.send(frame("SUBSCRIBE", id="0", destination="/dsub/mysub", ack="client-individual"))
    got = messages(back, 5)
    assert [m.body for m in got] == [f"n{i}".encode() for i in range(5)]
    assert {m.header("destination") for m in got} == {"/dsub/mysub"}
    for m in got:
        back.send(frame("ACK", id=m.header("ack") or ""))
    # still attached to the topic after the restart: a new message is collected
    producer = connected(raws, server.port)
    publish(producer, "/topic/news", ["late"])
    (late,) = messages(back, 1)
    assert late.body == b"late"
    receipt(back, frame("ACK", id=late.header("ack") or "", receipt="a"), "a")


def test_unsubscribe_persistent_destroys_it_across_a_restart(
    serve_factory: Callable[..., Serve], raws: Callable[[int], Raw], tmp_path: Path
) -> None:
    server = serve_factory("--data", str(tmp_path / "data"))
    owner = connected(raws, server.port)
    receipt(
        owner,
        frame("SUBSCRIBE", id="gone", persistent="true", destination="/topic/t", receipt="s"),
        "s",
    )
    publish(connected(raws, server.port), "/topic/t", ["a", "b"])
    assert [m.body for m in messages(owner, 2)] == [b"a", b"b"]
    receipt(owner, frame("UNSUBSCRIBE", id="gone", persistent="true", receipt="u"), "u")
    server.kill9()
    server.restart()
    late = connected(raws, server.port)
    late.send(frame("SUBSCRIBE", id="x", destination="/dsub/gone"))
    error = expect(late, Command.ERROR)
    assert "no durable subscription" in (error.header("message") or "")
    # a topic message now reaches no durable subscription (nothing left to collect it)
    other = connected(raws, server.port)
    receipt(
        other,
        frame("SUBSCRIBE", id="gone", persistent="true", destination="/topic/t", receipt="s2"),
        "s2",
    )
    publish(connected(raws, server.port), "/topic/t", ["fresh"])
    assert [m.body for m in messages(other, 1)] == [b"fresh"]  # not a nor b


def test_two_connections_share_one_durable_subscription(
    serve_factory: Callable[..., Serve], raws: Callable[[int], Raw], tmp_path: Path
) -> None:
    """Apollo: ids are global; consumers of one durable subscription share its messages."""
    server = serve_factory("--data", str(tmp_path / "data"))
    a = connected(raws, server.port)
    receipt(
        a, frame("SUBSCRIBE", id="shared", persistent="true", destination="/topic/s", receipt="a"),
        "a",
    )  # fmt: skip
    b = connected(raws, server.port)
    receipt(b, frame("SUBSCRIBE", id="1", destination="/dsub/shared", receipt="b"), "b")
    publish(connected(raws, server.port), "/topic/s", [str(i) for i in range(10)])
    got: list[bytes] = []
    for raw in (a, b):
        raw.sock.settimeout(0.5)
        try:
            while True:
                got.append(expect(raw, Command.MESSAGE).body)
        except TimeoutError:
            pass
    assert sorted(got) == sorted(str(i).encode() for i in range(10))  # each once


def test_send_to_a_durable_subscription_and_bad_requests(
    serve_factory: Callable[..., Serve], raws: Callable[[int], Raw], tmp_path: Path
) -> None:
    server = serve_factory("--data", str(tmp_path / "data"))
    owner = connected(raws, server.port)
    receipt(
        owner, frame("SUBSCRIBE", id="d", persistent="true", destination="/topic/x", receipt="s"),
        "s",
    )  # fmt: skip
    # SEND to /dsub/ID goes to that subscription only (Apollo)
    publish(connected(raws, server.port), "/dsub/d", ["direct"])
    assert [m.body for m in messages(owner, 1)] == [b"direct"]
    bad_requests = [
        frame("SEND", "x", destination="/dsub/nope", receipt="r"),
        frame("SUBSCRIBE", id="q", persistent="true", destination="/queue/q"),
        frame("UNSUBSCRIBE", id="never-made", persistent="true"),
        frame("SUBSCRIBE", id="w", persistent="true", destination="/topic/a.*"),
    ]
    for data in bad_requests:
        bad = connected(raws, server.port)
        bad.send(data)
        expect(bad, Command.ERROR)
        assert bad.closed_by_server()
    # the broker keeps serving the subscription
    publish(connected(raws, server.port), "/topic/x", ["still"])
    assert [m.body for m in messages(owner, 1)] == [b"still"]


def test_only_a_client_allowed_to_may_create_or_destroy_one(
    raws: Callable[[int], Raw], tmp_path: Path
) -> None:
    """The broker's authorizer: anonymous clients may consume (``join``) but neither
    create a durable subscription (``channel-create`` on ``/dsub/ID``) nor destroy
    another's (``channel-remove``); the owner's subscription goes on collecting."""
    config = 'anonymous = ["join"]\n[tokens]\ns3cret = "all"\n'
    server = Serve(tmp_path, "--data", str(tmp_path / "data"), config=config)
    try:
        owner, writer = raws(server.port), raws(server.port)
        for raw in (owner, writer):
            raw.send(b"CONNECT\naccept-version:1.2\nhost:localhost\npasscode:s3cret\n\n\x00")
            expect(raw, Command.CONNECTED)
        sub = frame("SUBSCRIBE", id="mine", persistent="true", destination="/topic/x", receipt="s")
        receipt(owner, sub, "s")
        attempts = [
            frame("SUBSCRIBE", id="theirs", persistent="true", destination="/topic/x"),
            frame("UNSUBSCRIBE", id="mine", persistent="true"),
        ]
        for data in attempts:
            anon = connected(raws, server.port)
            anon.send(data)
            error = expect(anon, Command.ERROR)
            assert "not authorized" in (error.header("message") or "")
        publish(writer, "/topic/x", ["kept"])
        assert [m.body for m in messages(owner, 1)] == [b"kept"]
    finally:
        server.stop()


def test_subscribing_again_with_another_topic_moves_the_subscription(
    serve_factory: Callable[..., Serve], raws: Callable[[int], Raw], tmp_path: Path
) -> None:
    """Apollo: the same id with another destination updates the durable subscription."""
    server = serve_factory("--data", str(tmp_path / "data"))
    owner = connected(raws, server.port)
    sub = frame("SUBSCRIBE", id="u", persistent="true", destination="/topic/a", receipt="1")
    receipt(owner, sub, "1")
    receipt(owner, frame("UNSUBSCRIBE", id="u", receipt="2"), "2")  # not destroyed
    moved = frame("SUBSCRIBE", id="u", persistent="true", destination="/topic/b", receipt="3")
    receipt(owner, moved, "3")
    writer = connected(raws, server.port)
    publish(writer, "/topic/a", ["old topic"])
    publish(writer, "/topic/b", ["new topic"])
    assert [m.body for m in messages(owner, 1)] == [b"new topic"]
    owner.sock.settimeout(0.5)
    try:
        extra = owner.next()
    except TimeoutError:
        extra = None
    assert extra is None  # nothing of /topic/a
