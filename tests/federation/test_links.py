"""Federation between real ``broker serve`` processes (``--link``)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq

from broker.client.blocking import Client, Message
from tests.federation.kit import (
    Broker,
    consumers,
    federation_stats,
    linked_pair,
    stats_or_none,
    wait_interest,
    wait_joined,
)
from tests.polling import wait_until

BROADCAST = {"Status": "Broadcast"}
PERSISTENT = {"MessageDeliveryHandler": "persistent", "RequestAcknowledge": True}

Ctx = zmq.Context[zmq.Socket[bytes]]


@pytest.fixture
def zctx() -> Iterator[Ctx]:
    ctx: Ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


@pytest.fixture
def brokers() -> Iterator[list[Broker]]:
    made: list[Broker] = []
    yield made
    for b in made:
        b.kill()


def collect(client: Client, into: list[Message]) -> None:
    client.on_message(into.append)


def acked_into(sub: Client, channel: str) -> list[Message]:
    """Join ``channel`` with ``sub`` acknowledging each message; the list they go into."""
    received: list[Message] = []

    def take(m: Message) -> None:
        received.append(m)
        sub.ack(m)

    sub.on_message(take)
    sub.join(channel)
    return received


def payloads(got: list[Message]) -> Counter[bytes]:
    return Counter(bytes(m.payload) for m in got)


@pytest.mark.slow
def test_triangle_unlimited_depth_delivers_each_message_once(
    brokers: list[Broker], zctx: Ctx
) -> None:
    a, b, c = Broker("A"), Broker("B"), Broker("C")
    brokers += [a, b, c]
    a.start(a.link(b))
    b.start(b.link(c))
    c.start(c.link(a))
    subs = [x.client(zctx) for x in (a, b, c)]
    got: list[list[Message]] = [[], [], []]
    for sub, into in zip(subs, got, strict=True):
        sub.create_queue("news", 0, BROADCAST)
        collect(sub, into)
        sub.join("news")
    wait_joined(subs, "news")
    for me, sub in zip("ABC", subs, strict=True):
        wait_interest(sub, set("ABC") - {me}, "news")  # both its peers asked for it
    n = 20
    expected = Counter(f"{x}-{i}".encode() for x in "ABC" for i in range(n))
    for name, pub in zip("ABC", subs, strict=True):
        for i in range(n):
            pub.push("news", 0, f"{name}-{i}", ack=True)
    for into in got:
        done = wait_until(lambda into=into: sum(payloads(into).values()) >= len(expected), 20)
        assert done, (
            [sorted(set(expected) - set(payloads(x))) for x in got],
            [federation_stats(s) for s in subs],
        )
    # a loop or a duplicate would bring more copies: give them time to come
    time.sleep(1.5)
    for into in got:
        assert payloads(into) == expected
    for m in got[1]:  # a message's Hops: where it came from, never this broker (B)
        if m.payload.startswith(b"A-"):
            assert m.header("Hops") in ("A", "A,C")
        if m.payload.startswith(b"B-"):
            assert m.header("Hops") is None
    for sub in subs:
        sub.close()


def test_depth_zero_stays_local_and_depth_one_goes_one_hop(
    brokers: list[Broker], zctx: Ctx
) -> None:
    a, b, c = Broker("A"), Broker("B"), Broker("C")
    brokers += [a, b, c]
    c.start()
    b.start(b.link(c))
    a.start(a.link(b))  # a line: A - B - C
    subs = [x.client(zctx) for x in (a, b, c)]
    got: list[list[Message]] = [[], [], []]
    for sub, into in zip(subs, got, strict=True):
        sub.create_queue("news", 0, BROADCAST)
        collect(sub, into)
        sub.join("news")
    wait_joined(subs, "news")
    wait_interest(subs[0], {"B"}, "news")
    wait_interest(subs[1], {"A", "C"}, "news")
    pub = subs[0]
    pub.push("news", 0, "depth-0", ack=True, headers={"Depth": "0"})
    pub.push("news", 0, "depth-1", ack=True, headers={"Depth": "1"})
    pub.push("news", 0, "depth-default", ack=True)  # -1: unlimited
    for into in got:
        assert wait_until(lambda into=into: b"depth-default" in payloads(into), 20)
    time.sleep(1.0)
    assert payloads(got[0]) == Counter([b"depth-0", b"depth-1", b"depth-default"])
    assert payloads(got[1]) == Counter([b"depth-1", b"depth-default"])
    assert payloads(got[2]) == Counter([b"depth-default"])
    on_b = {bytes(m.payload): m for m in got[1]}
    assert on_b[b"depth-1"].header("Depth") == "0"
    assert on_b[b"depth-1"].header("Hops") == "A"
    for sub in subs:
        sub.close()


def test_no_interest_no_forwarding(brokers: list[Broker], zctx: Ctx) -> None:
    """A channel nobody on B subscribes to is not joined (nor forwarded) by A."""
    a, b = Broker("A"), Broker("B")
    brokers += [a, b]
    b.start()
    a.start(a.link(b))
    sub_b = b.client(zctx)
    sub_b.create_queue("wanted", 0, BROADCAST)
    sub_b.join("wanted")
    pub = a.client(zctx)
    pub.create_queue("wanted", 0, BROADCAST)
    pub.create_queue("unwanted", 0, BROADCAST)
    wait_joined([pub], "wanted", 1)  # A's federation client joined what B wants
    assert consumers(pub, "unwanted") == 0
    pub.close()
    sub_b.close()


def test_persistent_queue_survives_link_drop_and_restart(
    brokers: list[Broker], zctx: Ctx, tmp_path: Path
) -> None:
    a, b = linked_pair(brokers, tmp_path)
    sub = b.client(zctx)
    sub.create_queue("orders", 1, PERSISTENT)
    received = acked_into(sub, "orders")
    pub = a.client(zctx)
    pub.create_queue("orders", 1, PERSISTENT)
    wait_joined([pub], "orders", 1)
    n = 100
    for i in range(n // 2):
        pub.push("orders", 1, f"o-{i}", ack=True)
    b.kill()  # mid-stream: some forwards in flight, some not yet sent
    for i in range(n // 2, n):
        pub.push("orders", 1, f"o-{i}", ack=True)  # A keeps them (persistent, unconfirmed)
    b.start()
    want = {f"o-{i}".encode() for i in range(n)}
    assert wait_until(lambda: want <= set(payloads(received)), 30), (
        f"missing {sorted(want - set(payloads(received)))[:10]}"
    )
    # and A's queue let go of them once B confirmed: all acknowledged, none left ("Messages"
    # leaves out deliveries waiting for B's confirm: the acknowledges may come after)
    assert wait_until(lambda: _queue_empty(pub, "orders", 1), 20)
    acks = lambda: int(pub.queue_info("orders", 1)["Acks"])  # noqa: E731
    assert wait_until(lambda: acks() >= n, 20), acks()
    pub.close()
    sub.close()


def _queue_empty(client: Client, channel: str, queue_id: int) -> bool:
    info = client.queue_info(channel, queue_id)
    return int(info["Messages"]) == 0 and int(info["PriorityMessages"]) == 0


def test_unauthorised_link_is_refused(brokers: list[Broker], zctx: Ctx, tmp_path: Path) -> None:
    from zerohub.zmqkit import new_certificate

    server_pub, server_sec = new_certificate("server", tmp_path / "server")
    new_certificate("good", tmp_path / "allow")
    good = tmp_path / "allow" / "good.key_secret"
    _bad_pub, bad = new_certificate("bad", tmp_path / "other")
    a = Broker("A", "--curve-secret", str(server_sec), "--allow", str(tmp_path / "allow"),
               "--link-secret", str(good))  # fmt: skip
    b, c = Broker("B"), Broker("C")
    brokers += [a, b, c]
    a.start()
    b.start(b.link(a, f"?key={server_pub}"), "--link-secret", str(bad))
    c.start(c.link(a, f"?key={server_pub}"), "--link-secret", str(good))
    sub = a.client(zctx, server_key=server_pub, curve_secret=good)
    got: list[Message] = []
    sub.create_queue("news", 0, BROADCAST)
    collect(sub, got)
    sub.join("news")
    pub_b, pub_c = b.client(zctx), c.client(zctx)
    for pub in (pub_b, pub_c):
        pub.create_queue("news", 0, BROADCAST)
    wait_joined([pub_c], "news", 1)  # C's link is up: its federation client took the channel
    pub_b.push("news", 0, "from-B", ack=True)
    pub_c.push("news", 0, "from-C", ack=True)
    assert wait_until(lambda: b"from-C" in payloads(got), 20)
    time.sleep(1.0)
    assert payloads(got) == Counter([b"from-C"])
    assert consumers(pub_b, "news") == 0  # B never heard A's interest
    assert a.alive() and b.alive()
    for client in (sub, pub_b, pub_c):
        client.close()


def test_garbage_and_impostors_from_link_peers_do_not_hurt(
    brokers: list[Broker], zctx: Ctx
) -> None:
    from broker.client.blocking import RemoteError
    from broker.federation.wire import FEDERATION_CLIENT, INTEREST, MESSAGE

    a, b = Broker("A"), Broker("B")
    brokers += [a, b]
    a.start()
    b.start(b.link(a))
    sub = a.client(zctx)
    got: list[Message] = []
    sub.create_queue("news", 0, BROADCAST)
    collect(sub, got)
    sub.join("news")
    pub = b.client(zctx)
    pub.create_queue("news", 0, BROADCAST)
    wait_joined([pub], "news", 1)
    evil = a.client(zctx, client_type="zerohub-link")
    forged = {"Fed-Broker": "B", "Fed-Channel": "news", "Fed-Queue": "0", "Fed-Id": "x/1",
              "Hops": "B", "Depth": "-1"}  # fmt: skip
    attempts: list[tuple[int, bytes, dict[str, str] | None]] = [
        (INTEREST, b"not json", None),
        (INTEREST, b'{"broker": "B", "interest": {"news": ["B"]}}', None),  # B's id, live
        (INTEREST, b'{"broker": "../x", "interest": {}}', None),
        (INTEREST, b'{"broker": "E", "interest": {"news": ["A"]}}', None),  # path not E's
        (INTEREST, b"[" * 5_000, None),  # nested past the JSON parser's recursion
        # claims to be B from another connection: busy, never accepted (a refusal for good
        # would make an honest peer reconnected under a new connection drop its message)
        (MESSAGE, b"impostor", forged),
        (MESSAGE, b"x", {**forged, "Hops": ",".join(["h"] * 1000)}),
        (MESSAGE, b"x", {**forged, "Depth": "many"}),
        (MESSAGE, b"x", {"Fed-Broker": "B"}),
        (99, b"x", None),
    ]
    for content_type, payload, headers in attempts:
        with pytest.raises(RemoteError) as refused:
            evil.request(FEDERATION_CLIENT, payload, content_type=content_type,
                         headers=headers, timeout=10)  # fmt: skip
        codes = (503,) if payload == b"impostor" else (400, 401)
        assert refused.value.code in codes, (payload[:40], refused.value)
    # raw garbage on the broker's port
    raw = zctx.socket(zmq.DEALER)
    raw.linger = 0
    raw.connect(a.endpoint)
    for junk in (b"\x00", b"\xff" * 300, b"TMQP garbage"):
        raw.send(junk)
    raw.close()
    pub.push("news", 0, "real", ack=True)  # the real link still works
    assert wait_until(lambda: b"real" in payloads(got), 20)
    time.sleep(0.5)
    assert payloads(got) == Counter([b"real"])
    assert a.alive() and b.alive()
    for client in (sub, pub, evil):
        client.close()


def test_a_forward_before_the_interest_exchange_is_refused_busy_not_for_good(
    brokers: list[Broker], zctx: Ctx, tmp_path: Path
) -> None:
    """After B's restart, A's link client sends what it queued while B was down as soon as
    its session is up: before the interest exchange that links A again.  B answers those
    forwards busy (A sends them again), never "for good": A gives up a message refused
    for good and acknowledges it locally, so an acknowledged persistent push was lost
    (stop 23's CI; 2 of 20 stress runs of the kill -9 test above).  The same message and
    batch sent once linked are taken."""
    from broker.client.blocking import RemoteError
    from broker.federation.wire import (
        BATCH,
        BATCH_OK,
        BATCH_RETRY,
        FEDERATION_CLIENT,
        INTEREST,
        MESSAGE,
        encode_batch,
    )

    b = Broker("B", data=tmp_path / "b")
    brokers.append(b)
    b.start()
    owner = b.client(zctx)
    owner.create_queue("orders", 1, PERSISTENT)
    received = acked_into(owner, "orders")
    peer = b.client(zctx, client_type="zerohub-link")
    assert wait_until(lambda: stats_or_none(peer) is not None, 20)  # federation is up

    def headers(fed_id: str) -> dict[str, str]:
        return {"Fed-Broker": "P", "Fed-Channel": "orders", "Fed-Queue": "1",
                "Fed-Id": fed_id, "Hops": "P", "Depth": "-1"}  # fmt: skip

    def send(fed_id: str, payload: bytes) -> None:
        peer.request(FEDERATION_CLIENT, payload, content_type=MESSAGE,
                     headers=headers(fed_id), timeout=10)  # fmt: skip

    def send_batch(fed_id: str, payload: bytes) -> bytes:
        batch = encode_batch([(tuple(headers(fed_id).items()), payload)])
        answer = peer.request(FEDERATION_CLIENT, batch, content_type=BATCH, timeout=10)
        return bytes(answer.payload)

    with pytest.raises(RemoteError) as refused:  # not linked yet: busy, sent again later
        send("P/1", b"m1")
    assert refused.value.code == 503, refused.value
    assert send_batch("P/2", b"m2") == bytes([BATCH_RETRY])
    assert federation_stats(owner)["unlinked"] == 2
    offer = b'{"broker": "P", "interest": {}}'
    peer.request(FEDERATION_CLIENT, offer, content_type=INTEREST, timeout=10)
    send("P/1", b"m1")  # linked now: both taken
    assert send_batch("P/2", b"m2") == bytes([BATCH_OK])
    assert wait_until(lambda: payloads(received) == Counter([b"m1", b"m2"]), 20), received
    peer.close()
    owner.close()


def test_link_to_a_broker_that_starts_later(brokers: list[Broker], zctx: Ctx) -> None:
    """The first connect attempts fail; the link keeps trying and comes up."""
    a, b = Broker("A"), Broker("B")
    brokers += [a, b]
    a.start(a.link(b))
    pub = a.client(zctx)

    def failures() -> int:
        stats = stats_or_none(pub)
        return 0 if stats is None else int(stats["links"][b.endpoint]["connect_failures"])

    assert wait_until(lambda: failures() >= 2, 30)
    b.start()
    sub = b.client(zctx)
    sub.create_queue("news", 0, BROADCAST)
    sub.join("news")
    wait_interest(pub, {"B"}, "news")
    got: list[Message] = []
    collect(sub, got)
    pub.push("news", 0, "late", ack=True)
    assert wait_until(lambda: b"late" in payloads(got), 20)
    pub.close()
    sub.close()


def test_a_fast_broadcast_burst_crosses_the_link_whole(brokers: list[Broker], zctx: Ctx) -> None:
    """Fire-and-forget pushes faster than the link forwards: the federation client's
    prefetch holds them (with a window of 100, copies to it were dropped by the engine)."""
    a, b = Broker("A"), Broker("B")
    brokers += [a, b]
    b.start()
    a.start(a.link(b))
    sub = b.client(zctx)
    sub.create_queue("burst", 0, BROADCAST)
    got: list[Message] = []
    collect(sub, got)
    sub.join("burst")
    pub = a.client(zctx)
    pub.create_queue("burst", 0, BROADCAST)
    wait_interest(pub, {"B"}, "burst")
    n = 2000
    for i in range(n - 1):
        pub.push("burst", 0, f"b{i}")
    pub.push("burst", 0, f"b{n - 1}", ack=True)
    assert wait_until(lambda: len(got) >= n, 60), federation_stats(pub)
    assert len(payloads(got)) == n
    # what was ready at once went as BATCH requests, each message exactly once
    assert federation_stats(pub)["batches"] >= 1
    assert len(got) == n
    pub.close()
    sub.close()


@pytest.mark.slow
def test_persistent_queue_survives_a_restart_of_the_source(
    brokers: list[Broker], zctx: Ctx, tmp_path: Path
) -> None:
    """kill -9 of the forwarding broker with messages not yet forwarded (its link peer
    was away): after its restart the recovered messages still reach the remote."""
    a, b = linked_pair(brokers, tmp_path)
    sub = b.client(zctx)
    sub.create_queue("orders", 1, PERSISTENT)
    received = acked_into(sub, "orders")
    pub = a.client(zctx)
    pub.create_queue("orders", 1, PERSISTENT)
    wait_joined([pub], "orders", 1)
    pub.close()
    b.stop()  # B away: A keeps what it takes for B unacknowledged
    pub = a.client(zctx)
    n = 40
    for i in range(n):
        pub.push("orders", 1, f"o-{i}", ack=True)  # durable on A
    pub.close()
    a.kill()  # the source dies with all of them unforwarded
    b.start()
    a.start(a.link(b))
    want = {f"o-{i}".encode() for i in range(n)}
    assert wait_until(lambda: want <= set(payloads(received)), 40), (
        f"missing {sorted(want - set(payloads(received)))[:10]}"
    )
    sub.close()


ROUND_ROBIN = {"Status": "RoundRobin", "RequestAcknowledge": True}


def test_round_robin_queue_consumed_exactly_once_across_brokers(
    brokers: list[Broker], zctx: Ctx
) -> None:
    """A queue that hands each message to one consumer, with consumers on three linked
    brokers: every message pushed on A is consumed exactly once in the federation, none
    lost (a message a federation client takes and cannot place goes back to its queue),
    none copied to two brokers."""
    a, b, c = Broker("A"), Broker("B"), Broker("C")
    brokers += [a, b, c]
    a.start(a.link(b))
    b.start(b.link(c))
    c.start(c.link(a))
    subs = [x.client(zctx) for x in (a, b, c)]
    got: list[Message] = []
    lock = threading.Lock()

    takers: Counter[str] = Counter()  # which broker's consumer took each message

    def taker(sub: Client) -> Callable[[Message], None]:
        def take(m: Message) -> None:
            with lock:
                got.append(m)
                takers[sub.endpoint] += 1
            sub.ack(m)

        return take

    for sub in subs:
        sub.create_queue("jobs", 0, ROUND_ROBIN)
        sub.on_message(taker(sub))
    # A's own consumer has a window of 1: the federation client (a low-priority
    # consumer) gets a message only while it is full
    for sub, prefetch in zip(subs, (1, None, None), strict=True):
        sub.join("jobs", prefetch=prefetch)
    wait_joined(subs, "jobs")
    for me, sub in zip("ABC", subs, strict=True):
        wait_interest(sub, set("ABC") - {me}, "jobs")
    n = 300
    expected = Counter(f"j-{i}".encode() for i in range(n))
    for i in range(n):
        subs[0].push("jobs", 0, f"j-{i}")

    def all_in() -> bool:
        with lock:
            return set(payloads(got)) >= set(expected)

    done = wait_until(all_in, 30)
    with lock:
        missing = sorted(set(expected) - set(payloads(got)))
    assert done, (f"{len(missing)} lost: {missing[:10]}", [federation_stats(s) for s in subs])
    time.sleep(1.5)  # a copy sent to two brokers would arrive meanwhile
    with lock:
        counts = payloads(got)
    assert counts == expected, sorted(p for p, k in counts.items() if k > 1)[:10]
    assert len(takers) > 1, takers  # the remote consumers took part
    for sub in subs:
        sub.close()


@pytest.mark.slow
def test_round_robin_queue_peer_killed_local_consumer_gets_the_rest(
    brokers: list[Broker], zctx: Ctx
) -> None:
    """kill -9 of the remote broker of a RoundRobin queue: what A's federation client
    takes for it from then on goes back to A's queue, so A's own consumer gets every
    message pushed after the kill (none waits for the dead broker)."""
    a, b = Broker("A"), Broker("B")
    brokers += [a, b]
    b.start()
    a.start(a.link(b))
    sub_a, sub_b = a.client(zctx), b.client(zctx)
    got: dict[str, list[Message]] = {"A": [], "B": []}
    lock = threading.Lock()

    def taker(name: str, sub: Client) -> Callable[[Message], None]:
        def take(m: Message) -> None:
            with lock:
                got[name].append(m)
            sub.ack(m)

        return take

    for name, sub in (("A", sub_a), ("B", sub_b)):
        sub.create_queue("jobs", 0, ROUND_ROBIN)
        sub.on_message(taker(name, sub))
        # A's consumer has a window of 1: the federation client (low priority) takes
        # a message only while it is full
        sub.join("jobs", prefetch=1 if name == "A" else None)
    wait_joined([sub_a, sub_b], "jobs")
    wait_interest(sub_a, {"B"}, "jobs")
    for i in range(50):
        sub_a.push("jobs", 0, f"warm-{i}")
    warm = {f"warm-{i}".encode() for i in range(50)}

    def warmed() -> bool:
        with lock:
            return warm <= set(payloads(got["A"] + got["B"]))

    assert wait_until(warmed, 30), federation_stats(sub_a)
    with lock:
        assert got["B"], "B's consumer took none: the link was not used"
    b.kill()
    n = 100
    for i in range(n):
        sub_a.push("jobs", 0, f"late-{i}")
    late = {f"late-{i}".encode() for i in range(n)}

    def all_on_a() -> bool:
        with lock:
            return late <= set(payloads(got["A"]))

    done = wait_until(all_on_a, 40)
    with lock:
        missing = sorted(late - set(payloads(got["A"])))
    assert done, (f"{len(missing)} never reached A: {missing[:10]}", federation_stats(sub_a))
    sub_a.close()
    sub_b.close()


def test_a_copy_resent_after_kill_9_is_not_delivered_twice(
    brokers: list[Broker], zctx: Ctx, tmp_path: Path
) -> None:
    """A peer whose confirm was lost sends a message again after the receiving broker was
    killed (-9) and restarted: the seen window, kept under --data, drops the copy."""
    from broker.client.blocking import RemoteError
    from broker.federation.wire import FEDERATION_CLIENT, INTEREST, MESSAGE

    b = Broker("B", data=tmp_path / "b")
    brokers.append(b)

    def subscriber(into: list[Message]) -> Client:
        sub = b.client(zctx)
        assert wait_until(lambda: stats_or_none(sub) is not None, 20)
        with contextlib.suppress(RemoteError):  # kept from before the restart
            sub.create_queue("orders", 0, {"Status": "Push"})
        collect(sub, into)
        sub.join("orders")
        return sub

    def send(peer: Client, fed_id: str, payload: bytes) -> None:
        headers = {"Fed-Broker": "P", "Fed-Channel": "orders", "Fed-Queue": "0",
                   "Fed-Id": fed_id, "Hops": "P", "Depth": "-1"}  # fmt: skip
        peer.request(FEDERATION_CLIENT, payload, content_type=MESSAGE, headers=headers,
                     timeout=10)  # fmt: skip

    def link_peer() -> Client:
        """A linked broker "P" (its link's client on B, as the federation runner has)."""
        peer = b.client(zctx, client_type="zerohub-link")
        offer = b'{"broker": "P", "interest": {}}'
        peer.request(FEDERATION_CLIENT, offer, content_type=INTEREST, timeout=10)
        return peer

    b.start()
    before: list[Message] = []
    sub = subscriber(before)
    peer = link_peer()
    send(peer, "P/1", b"m1")  # confirmed: B has it, and its id is on disk
    assert wait_until(lambda: payloads(before) == Counter([b"m1"]), 20)
    peer.close()
    sub.close()
    b.kill()
    b.start()
    after: list[Message] = []
    sub = subscriber(after)
    peer = link_peer()
    send(peer, "P/1", b"m1")  # the confirm was lost: P sends it again
    send(peer, "P/2", b"m2")
    assert wait_until(lambda: b"m2" in payloads(after), 20)
    assert payloads(after) == Counter([b"m2"])  # m1 was not delivered a second time
    assert federation_stats(sub)["duplicates"] == 1
    peer.close()
    sub.close()


@pytest.mark.slow
def test_kill_9_between_the_local_push_and_the_seen_journal_delivers_once(
    brokers: list[Broker], zctx: Ctx, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The receiving broker is killed (-9) right after its local push of a federated
    message into a persistent queue was answered, before the id reached the federation's
    seen journal; the peer got no confirm and sends the message again after the restart:
    the consumer gets it once (the engine wrote the id with the message,
    ``broker.engine.federated``; before, the recovered copy and the resent one both)."""
    from broker.client.blocking import ClientError
    from broker.federation.runner import KILL_AFTER_PUSH_ENV
    from broker.federation.wire import FEDERATION_CLIENT, INTEREST, MESSAGE

    b = Broker("B", data=tmp_path / "b")
    brokers.append(b)

    def link_peer() -> Client:
        peer = b.client(zctx, client_type="zerohub-link")
        assert wait_until(lambda: stats_or_none(peer) is not None, 20)  # federation is up
        offer = b'{"broker": "P", "interest": {}}'
        peer.request(FEDERATION_CLIENT, offer, content_type=INTEREST, timeout=10)
        return peer

    def send(peer: Client, fed_id: str, payload: bytes, timeout: float = 10) -> None:
        headers = {"Fed-Broker": "P", "Fed-Channel": "orders", "Fed-Queue": "1",
                   "Fed-Id": fed_id, "Hops": "P", "Depth": "-1"}  # fmt: skip
        peer.request(FEDERATION_CLIENT, payload, content_type=MESSAGE, headers=headers,
                     timeout=timeout)  # fmt: skip

    monkeypatch.setenv(KILL_AFTER_PUSH_ENV, "1")
    b.start()
    monkeypatch.delenv(KILL_AFTER_PUSH_ENV)
    owner = b.client(zctx)
    owner.create_queue("orders", 1, PERSISTENT)
    peer = link_peer()
    with pytest.raises(ClientError):  # B dies before it confirms
        send(peer, "P/1", b"m1", timeout=5)
    assert b.proc is not None and b.proc.wait(20) == -9
    b.proc = None
    peer.close(timeout=1)
    owner.close(timeout=1)
    b.start()
    peer = link_peer()
    send(peer, "P/1", b"m1")  # no confirm came: P sends it again
    send(peer, "P/2", b"m2")
    sub = b.client(zctx)
    received = acked_into(sub, "orders")
    # one consumer of a FIFO queue: a second m1 would come before m2
    assert wait_until(lambda: b"m2" in payloads(received), 20)
    assert payloads(received) == Counter([b"m1", b"m2"])
    assert wait_until(lambda: _queue_empty(sub, "orders", 1), 20)
    peer.close()
    sub.close()


def test_a_peer_refusing_batch_gets_single_messages_and_loses_none(
    brokers: list[Broker], zctx: Ctx
) -> None:
    """The linked broker B is a zerohub from before BATCH: its federation client refuses
    content type 250 as "not a federation message" (401, what that code answered).  A
    burst ready at once goes to it as a BATCH first; A then sends it single MESSAGEs:
    every message arrives, once."""
    from broker.engine.engine import Engine
    from broker.federation.wire import BATCH, FEDERATION_CLIENT, INTEREST, MESSAGE
    from broker.protocol import Header
    from broker.server.server import Server, ServerOptions
    from tests.ports import free_port

    a = Broker("A")
    brokers.append(a)
    b_endpoint = f"tcp://127.0.0.1:{free_port()}"  # (not A's: A binds later)
    # B: no federation of its own; the scripted one below has the federation's secret
    secret = {Header.FEDERATION_SECRET: "old-peer"}
    b_server = Server(Engine(), ServerOptions(endpoint=b_endpoint, federation_secret="old-peer"),
                      context=zctx)  # fmt: skip
    b_server.start()
    old = Client(b_endpoint, context=zctx, timeout=10, client_id=FEDERATION_CLIENT,
                 properties=secret).connect()  # fmt: skip
    got: list[bytes] = []
    refused: list[int] = []
    stop = threading.Event()

    def serve_old_peer() -> None:
        """Answer as a pre-BATCH federation client does."""
        while not stop.is_set():
            m = old.receive(timeout=0.05)
            if m is None or not m.needs_response:
                continue
            if m.content_type == INTEREST:
                old.respond(m, b'{"broker": "B", "interest": {"burst": ["B"]}}')
            elif m.content_type == MESSAGE:
                got.append(bytes(m.payload))
                old.respond(m, b"")
            else:
                refused.append(m.content_type)
                old.respond(m, b"", code=401, headers=(("Reason", "not a federation message"),))

    server = threading.Thread(target=serve_old_peer, daemon=True)
    server.start()
    try:
        a.start(f"--link={b_endpoint}")
        pub = a.client(zctx)
        pub.create_queue("burst", 0, BROADCAST)
        wait_interest(pub, {"B"}, "burst")
        n = 60
        for i in range(n - 1):
            pub.push("burst", 0, f"b{i}")
        pub.push("burst", 0, f"b{n - 1}", ack=True)
        assert wait_until(lambda: len(got) >= n, 60), (len(got), federation_stats(pub))
        assert sorted(got) == sorted(f"b{i}".encode() for i in range(n))  # each once
        assert BATCH in refused  # a batch was tried first, and refused
        pub.close()
    finally:
        stop.set()
        server.join(5)
        old.close(timeout=1)
        b_server.stop()


def test_interest_is_pushed_a_new_subscriber_gets_messages_at_once(
    brokers: list[Broker], zctx: Ctx, tmp_path: Path
) -> None:
    """Both ways across a link: a subscriber that joins on one broker gets what is
    published on the other right after, with the periodic exchange set to 60 s (so only
    the pushed interest can carry it within the bounded wait)."""
    config = tmp_path / "slow-exchange.toml"
    config.write_text("[federation]\nexchange_interval = 60\npeer_timeout = 300\n")
    a = Broker("A", "--config", str(config))
    b = Broker("B", "--config", str(config))
    brokers += [a, b]
    a.start()
    b.start(b.link(a))
    ca, cb = a.client(zctx), b.client(zctx)
    for c in (ca, cb):
        c.create_queue("news", 0, BROADCAST)
    # the link is up (the first exchange runs when it connects)
    assert wait_until(lambda: "B" in (stats_or_none(ca) or {}).get("peers", {}), 20)
    assert wait_until(lambda: "A" in (stats_or_none(cb) or {}).get("peers", {}), 20)
    for publisher, subscriber_at in ((cb, a), (ca, b)):  # B -> A (accepting side), A -> B
        sub = subscriber_at.client(zctx)
        got: list[Message] = []
        collect(sub, got)
        sub.join("news")
        sent = 0

        def arrived(publisher: Client = publisher) -> bool:
            nonlocal sent
            publisher.push("news", 0, f"n{sent}", ack=True)
            sent += 1
            return bool(got)  # noqa: B023 (read in this iteration only)

        assert wait_until(arrived, 20), federation_stats(publisher)
        sub.close()
    assert federation_stats(ca)["interest_pushes"] >= 1
    assert federation_stats(cb)["interest_pushes"] >= 1
    ca.close()
    cb.close()


def test_a_link_peer_flooding_past_its_window_is_refused_and_others_lose_nothing(
    brokers: list[Broker], zctx: Ctx, tmp_path: Path
) -> None:
    """A hostile link client fires 300 forwards without waiting for answers, past
    ``peer_in_flight`` (20 here): the excess is refused busy, what was accepted is
    delivered once, and a real linked broker's messages all still arrive."""
    from broker.client.blocking import RemoteError
    from broker.federation.wire import FEDERATION_CLIENT, INTEREST, MESSAGE

    config = tmp_path / "tight.toml"
    config.write_text("[federation]\npeer_in_flight = 20\n")
    a = Broker("A", "--config", str(config))
    b = Broker("B")
    brokers += [a, b]
    a.start()
    b.start(b.link(a))
    sub = a.client(zctx)
    sub.create_queue("news", 0, BROADCAST)
    got: list[Message] = []
    collect(sub, got)
    sub.join("news")
    pub = b.client(zctx)
    pub.create_queue("news", 0, BROADCAST)
    wait_joined([pub], "news", 1)
    evil = a.client(zctx, client_type="zerohub-link")
    evil.request(FEDERATION_CLIENT, b'{"broker": "P", "interest": {}}',
                 content_type=INTEREST, timeout=10)  # fmt: skip
    futures = []
    for i in range(300):
        headers = {"Fed-Broker": "P", "Fed-Channel": "news", "Fed-Queue": "0",
                   "Fed-Id": f"P/{i}", "Hops": "P", "Depth": "-1"}  # fmt: skip
        futures.append(evil.request_async(FEDERATION_CLIENT, f"flood{i}".encode(),
                                          content_type=MESSAGE, headers=headers,
                                          timeout=30))  # fmt: skip
    accepted, busy = set(), 0
    for i, future in enumerate(futures):
        try:
            future.result(60)
            accepted.add(f"flood{i}".encode())
        except RemoteError as exc:
            assert exc.code == 503, exc
            busy += 1
    assert busy > 0 and accepted
    for i in range(50):
        pub.push("news", 0, f"real{i}", ack=True)
    real = {f"real{i}".encode() for i in range(50)}
    assert wait_until(lambda: real <= set(payloads(got)), 30)
    flood = Counter(p for p in payloads(got).elements() if p.startswith(b"flood"))
    assert set(flood) == accepted and max(flood.values()) == 1  # each accepted one once
    # every busy refusal the flooder saw is counted; the counter is the broker's, so B's
    # real link may add its own when its forwards come faster than A answers them (a
    # loaded machine: 276 and 294 counted against 267 and 260 seen); B sends those again
    assert federation_stats(sub)["flooded"] >= busy
    assert a.alive()
    for client in (sub, pub, evil):
        client.close()


def test_federation_client_yields_to_local_consumers_with_room(
    brokers: list[Broker], zctx: Ctx
) -> None:
    """On a round-robin queue the federation client is a low-priority consumer: while the
    local consumer has room every message stays local; once its window is full (it stops
    acknowledging) the rest go to the linked broker's consumer, none lost."""
    a, b = Broker("A"), Broker("B")
    brokers += [a, b]
    b.start()
    a.start(a.link(b))
    local, remote = a.client(zctx), b.client(zctx)
    got_local: list[Message] = []
    got_remote: list[Message] = []

    def ack_local(m: Message) -> None:
        got_local.append(m)
        local.ack(m)

    def ack_remote(m: Message) -> None:
        got_remote.append(m)
        remote.ack(m)

    for client, take in ((local, ack_local), (remote, ack_remote)):
        client.create_queue("jobs", 0, ROUND_ROBIN)
        client.on_message(take)
        client.join("jobs")
    wait_joined([local], "jobs")  # its consumer and the federation client
    wait_interest(local, {"B"}, "jobs")
    for i in range(100):
        local.push("jobs", 0, f"first-{i}", ack=True)
    assert wait_until(lambda: len(got_local) == 100, 20)
    assert got_remote == []  # (before: about half went to B)
    local.close()
    stuck = a.client(zctx)  # joins with a window of 5 and never acknowledges
    held: list[Message] = []
    stuck.on_message(held.append)
    stuck.join("jobs", prefetch=5)
    assert wait_until(lambda: consumers(stuck, "jobs") >= 2, 20)
    for i in range(50):
        stuck.push("jobs", 0, f"then-{i}")  # (an acknowledged push waits for its consumer)
    want = {f"then-{i}".encode() for i in range(50)}
    assert wait_until(lambda: set(payloads(held)) | set(payloads(got_remote)) == want, 30)
    assert len(held) == 5 and len(got_remote) == 45
    stuck.close()
    remote.close()
