"""``Session.deliver_plain`` (the plain run sink): a run of ``ack:auto`` MESSAGEs made
from ids and bodies is what ``deliver_run`` makes of the same deliveries -- the same
bytes, the same count taken, the same refusal -- and it declines (-1, nothing written)
whenever its MESSAGEs would carry more.  Sans-IO, with a room that runs out mid-run."""

from __future__ import annotations

import pytest

from broker.stomp.backend import Delivery
from broker.stomp.errors import EncodeError
from broker.stomp.frames import Command, Version
from broker.stomp.session import SessionConfig

from .test_deliver_run import _peer

#: Ids with a character each to escape on 1.1+ (CR only on 1.2), and plain ones.
_IDS = ["m0", "back\\slash", "co:lon", "new\nline", "car\rriage", "stomp-3-17", "é-id", "m7"]


def _bodies() -> list[bytes | memoryview]:
    bodies: list[bytes | memoryview] = [b"x" * (10 + i) for i in range(len(_IDS))]
    bodies[2] = memoryview(b"\0inside\0")  # (a view, and NULs in the body)
    bodies[4] = b""
    return bodies


@pytest.mark.parametrize("version", [Version.V1_1, Version.V1_2])
@pytest.mark.parametrize("destination", ["/queue/q", "/queue/r:x\\y"])
@pytest.mark.parametrize("limit", [1, 150, 400, 100_000])
def test_a_plain_run_makes_what_the_run_sink_makes(
    version: Version, destination: str, limit: int
) -> None:
    plain_peer, plain_transport = _peer(version, "auto", limit)
    run_peer, run_transport = _peer(version, "auto", limit)
    ids, bodies = _IDS, _bodies()
    deliveries = [
        Delivery("s", 100 + i, mid, destination, (), bytes(body))
        for i, (mid, body) in enumerate(zip(ids, bodies, strict=True))
    ]
    took = plain_peer.session.deliver_plain("s", destination, ids, bodies)
    assert took == run_peer.session.deliver_run(deliveries)
    assert (limit == 100_000) == (took == len(ids))  # (the room ran out, or not)
    assert plain_transport.refusals == run_transport.refusals == (took < len(ids))
    plain_bytes = plain_peer.session.take_output(0.0)
    assert plain_bytes == run_peer.session.take_output(0.0)
    assert plain_bytes.count(b"MESSAGE\n") == took


def test_a_second_plain_run_after_a_usual_delivery_is_the_same_bytes() -> None:
    """The subscription's cached head and destination line, made by either path, give
    the same frames afterwards."""
    plain_peer, _ = _peer(Version.V1_2, "auto", 100_000)
    run_peer, _ = _peer(Version.V1_2, "auto", 100_000)
    first = Delivery("s", 1, "a", "/queue/q", (("h", "v"),), b"one")
    assert plain_peer.session.deliver_run([first]) == run_peer.session.deliver_run([first]) == 1
    assert plain_peer.session.deliver_plain("s", "/queue/q", ["b", "c"], [b"2", b"3"]) == 2
    tail = [
        Delivery("s", n, mid, "/queue/q", (), body)
        for n, mid, body in ((2, "b", b"2"), (3, "c", b"3"))
    ]
    assert run_peer.session.deliver_run(tail) == 2
    assert plain_peer.session.take_output(0.0) == run_peer.session.take_output(0.0)


@pytest.mark.parametrize(
    ("version", "ack", "config", "subscription"),
    [
        (Version.V1_0, "auto", None, "/queue/q"),  # 1.0 frames take the general path
        (Version.V1_2, "client", None, "s"),
        (Version.V1_2, "client-individual", None, "s"),
        (Version.V1_2, "auto", SessionConfig(add_user_header="who"), "s"),
        (Version.V1_2, "auto", SessionConfig(add_timestamp_header="when"), "s"),
        (Version.V1_2, "auto", SessionConfig(add_redeliveries_header="again"), "s"),
        (Version.V1_2, "auto", None, "unknown"),
    ],
)
def test_a_subscription_whose_messages_carry_more_takes_no_plain_run(
    version: Version, ack: str, config: SessionConfig | None, subscription: str
) -> None:
    peer, _ = _peer(version, ack, 100_000, config)
    assert peer.session.deliver_plain(subscription, "/queue/q", ["a"], [b"x"]) == -1
    assert peer.session.take_output(0.0) == b""


def test_an_include_seq_subscription_takes_no_plain_run() -> None:
    peer, _ = _peer(Version.V1_2, "auto", 100_000)
    headers = {"id": "seq", "destination": "/queue/z", "include-seq": "n", "receipt": "r"}
    peer.send(Command.SUBSCRIBE, headers)
    assert [f.command for f in peer.read()] == [Command.RECEIPT]
    assert peer.session.deliver_plain("seq", "/queue/z", ["a"], [b"x"]) == -1


def test_a_closed_session_takes_no_plain_run() -> None:
    peer, _ = _peer(Version.V1_2, "auto", 100_000)
    peer.send(Command.DISCONNECT)
    assert peer.session.deliver_plain("s", "/queue/q", ["a"], [b"x"]) == -1


def test_a_nul_in_an_id_is_refused_as_the_run_sink_refuses_it() -> None:
    plain_peer, _ = _peer(Version.V1_2, "auto", 100_000)
    run_peer, _ = _peer(Version.V1_2, "auto", 100_000)
    ids = ["ok", "bad\0id"]
    deliveries = [Delivery("s", i, mid, "/queue/q", (), b"x") for i, mid in enumerate(ids)]
    with pytest.raises(EncodeError):
        plain_peer.session.deliver_plain("s", "/queue/q", ids, [b"x", b"x"])
    with pytest.raises(EncodeError):
        run_peer.session.deliver_run(deliveries)
    assert plain_peer.session.take_output(0.0) == run_peer.session.take_output(0.0)
