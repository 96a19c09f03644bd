"""Broadcast fan-out through the broker's XPUB (``broker.engine.fanout``), real sockets.

Consumers that ask for fan-out get a broadcast queue's messages from one publish per
message, in order; a SUB without a granted token gets nothing (CURVE on and off); a
consumer that falls behind sees its gap reported, never a silent one; joins and leaves
during traffic keep every member's stream in order.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from broker.client import Client
from broker.client.errors import ClientError
from broker.engine import Engine
from broker.engine.fanout import HOLD_MAX
from broker.server import Server, ServerOptions
from tests.broker.kernel import beyond_socket_buffers
from tests.polling import wait_until
from zerohub import zmqkit
from zerohub.zmqkit import new_certificate

Ctx = zmq.Context[zmq.Socket[bytes]]
CHANNEL = "news"


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Path]:
    allow = tmp_path / "allow"
    allow.mkdir()
    server_pub, server_sec = new_certificate("server", tmp_path / "server")
    good_pub, good_sec = new_certificate("good", tmp_path / "clients")
    _bad_pub, bad_sec = new_certificate("bad", tmp_path / "clients")
    (allow / "good.key").write_bytes(good_pub.read_bytes())
    return {"server_pub": server_pub, "server_sec": server_sec, "good_sec": good_sec,
            "bad_sec": bad_sec, "allow": allow}  # fmt: skip


class Fan:
    """A broker serving fan-out and a way to make its clients (closed at the end)."""

    def __init__(self, ctx: Ctx, keys: dict[str, Path] | None, **opts: Any) -> None:
        self.ctx = ctx
        self.keys = keys
        curve: dict[str, Any] = {}
        if keys is not None:
            curve = {"curve_secret": str(keys["server_sec"]), "allow_dir": str(keys["allow"])}
        options = ServerOptions(
            endpoint="tcp://127.0.0.1:*", fanout="tcp://127.0.0.1:*", **curve, **opts
        )
        self.server = Server(Engine(), options, context=ctx)
        self.endpoint = self.server.start()
        assert self.server.sender.fanout is not None
        self.fanout = self.server.sender.fanout.endpoint
        self.clients: list[Client] = []

    def client(self, **kw: Any) -> Client:
        if self.keys is not None:
            kw.setdefault("server_key", self.keys["server_pub"])
            kw.setdefault("curve_secret", self.keys["good_sec"])
        kw.setdefault("timeout", 20.0)
        client = Client(self.endpoint, context=self.ctx, **kw).connect()
        self.clients.append(client)
        return client

    def close(self) -> None:
        for client in self.clients:
            client.close()
        self.server.stop()


@pytest.fixture(params=[False, True], ids=["plain", "curve"])
def fan(request: pytest.FixtureRequest, zctx: Ctx, keys: dict[str, Path]) -> Iterator[Fan]:
    f = Fan(zctx, keys if request.param else None)
    yield f
    f.close()


def _broadcast_queue(producer: Client) -> None:
    producer.create_queue(CHANNEL, 1, {"Status": 0})  # broadcast, no acknowledges


def _numbers(client: Client, count: int, timeout: float = 20.0) -> list[int]:
    got: list[int] = []
    while len(got) < count:
        message = client.receive(timeout=timeout)
        assert message is not None, f"{len(got)} of {count} received"
        got.append(int(message.payload))
    return got


@pytest.mark.parametrize("consumers", [1, 50])
def test_every_member_receives_every_message_in_order(fan: Fan, consumers: int) -> None:
    producer = fan.client()
    _broadcast_queue(producer)
    members = [fan.client(threaded=False) for _ in range(consumers)]
    direct = fan.client(fanout=False)  # an older client: the one-by-one path
    for c in [*members, direct]:
        c.join(CHANNEL)
    total = 300
    for i in range(total):
        producer.push(CHANNEL, 1, str(i).encode())
    for c in [*members, direct]:
        assert _numbers(c, total) == list(range(total))
        assert c.fanout_gaps == []
    counters = fan.server.counters
    assert counters["fanout_published"] == total  # once per message, not once per member
    assert counters["fanout_subscribed"] == consumers


def _spy(ctx: Ctx, fan: Fan, topics: list[bytes], secret: Path | None) -> zmq.Socket[bytes]:
    sub = ctx.socket(zmq.SUB)
    sub.linger = 0
    if fan.keys is not None:
        assert secret is not None
        zmqkit.configure_client(sub, secret, fan.keys["server_pub"])
    for topic in topics:
        sub.setsockopt(zmq.SUBSCRIBE, topic)
    sub.connect(fan.fanout)
    return sub


def test_a_subscriber_without_a_granted_token_receives_nothing(fan: Fan, zctx: Ctx) -> None:
    producer = fan.client()
    _broadcast_queue(producer)
    member = fan.client()
    member.join(CHANNEL)
    token = bytes.fromhex(_token_of(fan))
    # everything, a prefix of the real token, a guessed token, the token with one bit off
    guesses = [b"", token[:1], token[:15], bytes(16), bytes([token[0] ^ 1]) + token[1:]]
    spies = [_spy(zctx, fan, [g], fan.keys["good_sec"] if fan.keys else None) for g in guesses]
    if fan.keys is not None:  # and a key the broker does not allow, with the real token
        spies.append(_spy(zctx, fan, [token], fan.keys["bad_sec"]))
    try:
        # the broker saw and refused the allowed-key spies' subscriptions (the empty one
        # too) before anything is published
        assert wait_until(lambda: fan.server.counters["fanout_refused"] >= len(guesses))
        total = 200
        for i in range(total):
            producer.push(CHANNEL, 1, str(i).encode())
        assert _numbers(member, total) == list(range(total))
        # the member's stream ends with a marker: published after the last message, so a
        # spy that could read anything would hold the messages by now
        late = fan.client()
        late.join(CHANNEL)
        assert wait_until(lambda: fan.server.counters["fanout_markers"] >= 2)
        producer.push(CHANNEL, 1, b"-1", ack=True)
        assert _numbers(late, 1) == [-1]
        for spy in spies:
            assert spy.poll(0) == 0, "an unauthorised subscriber received a message"
    finally:
        for spy in spies:
            spy.close(linger=0)


def _token_of(fan: Fan) -> str:
    """The live stream token, as the adversary cannot read it (from the engine)."""
    engine = fan.server.engine
    channel = engine.channels[CHANNEL]  # type: ignore[attr-defined]
    assert channel.fanout is not None
    token: bytes = channel.fanout.token
    return token.hex()


def test_a_consumer_that_falls_behind_sees_its_gap_reported(zctx: Ctx) -> None:
    f = Fan(zctx, None, fanout_hwm=10)
    try:
        producer = f.client()
        _broadcast_queue(producer)
        # reads nothing while its inbox is full: its SUB and the broker's pipe fill up
        slow = f.client(max_inbox=5, hwm=10)
        slow.join(CHANNEL)
        # more than loopback's socket buffers can hold (this kernel's TCP autotuning may
        # grow a receive buffer to tcp_rmem's maximum: 32 MiB on some machines)
        payload = b"x" * 60_000
        total = beyond_socket_buffers() // len(payload) + 1
        for i in range(total):
            producer.push(CHANNEL, 1, b"%d %s" % (i, payload))
        # the tail of what it missed: the broker's markers (about one a second) tell
        received: list[int] = []

        def settled() -> bool:
            while (m := slow.receive(timeout=0)) is not None:
                received.append(int(m.payload.split(b" ")[0]))
            missed = sum(g.count for g in slow.fanout_gaps)
            return len(received) + missed == total

        assert wait_until(settled, timeout=60)
        gaps = slow.fanout_gaps
        assert gaps, "the consumer fell behind without a reported gap"
        assert received == sorted(received)
        # every stream number is either received or inside a reported gap, never both
        holes = {n for g in gaps for n in range(g.first, g.last + 1)}
        assert len(holes) == sum(g.count for g in gaps)
        stream_numbers = {n + 1 for n in received}  # stream numbers start at 1
        assert not holes & stream_numbers
        assert holes | stream_numbers == set(range(1, total + 1))
    finally:
        f.close()


def test_joins_and_leaves_during_traffic(fan: Fan) -> None:
    producer = fan.client()
    _broadcast_queue(producer)
    steady = fan.client()
    got: list[int] = []
    steady.on_message(lambda m: got.append(int(m.payload)))  # reads all along
    steady.join(CHANNEL)
    stop = threading.Event()
    sent: list[int] = []
    writer = _producing(producer, stop, sent, receipt_every=0)
    try:
        assert wait_until(lambda: len(sent) > 100)
        visitor = fan.client()
        visitor.join(CHANNEL)  # live from its marker on: what follows comes in order
        seen = _numbers(visitor, 300)
        assert seen == list(range(seen[0], seen[0] + 300))
        visitor.leave(CHANNEL)
        # Push ``mark`` may already be on the wire: the writer appends a number after its
        # push returns, so a thread switch between the two can leave it out of ``sent``
        # while the broker serves it before the leave.  Every push after ``mark`` starts
        # after the leave was answered.
        mark = len(sent)
        assert wait_until(lambda: len(sent) > mark + 500)
    finally:
        stop.set()
        writer.join(30)
    total = len(sent)
    assert wait_until(lambda: len(got) >= total, timeout=30)
    assert got == list(range(total))
    assert steady.fanout_gaps == [] and visitor.fanout_gaps == []
    # after its leave the visitor reads nothing published later
    after: list[int] = []
    while (m := visitor.receive(timeout=0)) is not None:
        after.append(int(m.payload))
    assert all(n <= mark for n in after), (mark, after[-5:])
    assert after == list(range(seen[-1] + 1, seen[-1] + 1 + len(after)))


def test_broker_serve_fanout_delivers_through_the_pub_socket(zctx: Ctx) -> None:
    from tests.broker.test_cli import start_serve
    from tests.ports import free_port

    port, pub = free_port(), free_port()
    proc = start_serve("--bind", f"tcp://127.0.0.1:{port}", "--fanout", f"tcp://127.0.0.1:{pub}")
    try:
        with Client(f"tcp://127.0.0.1:{port}", context=zctx, timeout=20) as member:
            _broadcast_queue(member)
            member.join(CHANNEL)
            for i in range(20):
                member.push(CHANNEL, 1, str(i).encode())
            assert _numbers(member, 20) == list(range(20))
            assert member._core.fanout.received == 20  # all through the SUB socket
    finally:
        proc.terminate()
        assert proc.wait(10) == 0


def test_broker_serve_refuses_a_plain_fanout_off_loopback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from broker.cli import main

    code = main(["serve", "--data", "none", "--fanout", "tcp://10.9.8.7:5681"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "10.9.8.7" in err


def _drain_numbers(client: Client, wait: float) -> list[int]:
    """What ``client`` holds or receives within ``wait`` seconds of silence."""
    got: list[int] = []
    while (m := client.receive(timeout=wait)) is not None:
        got.append(int(m.payload))
    return got


def test_a_member_that_leaves_but_keeps_its_sub_receives_nothing_more(fan: Fan) -> None:
    """The adversary: a member leaves and keeps its SUB subscribed to the stream (its
    client does not unsubscribe).  Nothing pushed after the leave reaches it; the member
    that stays loses nothing and sees no gap across the token change."""
    producer = fan.client()
    _broadcast_queue(producer)
    stays, leaver = fan.client(), fan.client()
    for c in (stays, leaver):
        c.join(CHANNEL)
    leaver._core.fanout.leave = lambda channel: None  # keeps reading what its SUB gets
    first = 100
    for i in range(first):
        producer.push(CHANNEL, 1, str(i).encode())
    assert _numbers(leaver, first) == list(range(first))
    leaver.leave(CHANNEL)
    total = 300
    for i in range(first, total):
        producer.push(CHANNEL, 1, str(i).encode())
    assert _numbers(stays, total) == list(range(total))
    # the broker's beat publishes the stream's marker after the last message: by the time
    # the one that stays heard it, a SUB that still could read would hold everything
    markers = fan.server.counters["fanout_markers"]
    assert wait_until(lambda: fan.server.counters["fanout_markers"] > markers, timeout=30)
    assert _drain_numbers(stays, 0.3) == []
    assert stays.fanout_gaps == []
    assert _drain_numbers(leaver, 0.3) == [], "the leaver read on after its leave"


def test_joining_again_a_channel_whose_stream_is_read_loses_nothing(fan: Fan) -> None:
    """A member joining its channel again (a new prefetch, say) while messages flow: the
    join completes at once, and every message comes exactly once, without a gap."""
    producer = fan.client()
    _broadcast_queue(producer)
    member = fan.client()
    member.join(CHANNEL)
    half = 150
    for i in range(half):
        producer.push(CHANNEL, 1, str(i).encode())
    member.join(CHANNEL, prefetch=50)
    total = 2 * half
    for i in range(half, total):
        producer.push(CHANNEL, 1, str(i).encode())
    assert _numbers(member, total, timeout=5) == list(range(total))
    assert member.fanout_gaps == []


def test_a_join_answer_racing_fanout_messages_and_direct_frames(fan: Fan) -> None:
    """A member joins while a producer streams: messages published once (fan-out) and
    messages asking a receipt (sent to each consumer one by one over its DEALER) follow
    the join answer in the same broker steps.  Nothing comes twice, nothing pushed after
    join() returned is missed, the published ones come in order and no gap is reported."""
    producer = fan.client()
    _broadcast_queue(producer)
    steady = fan.client()
    steady.join(CHANNEL)
    stop = threading.Event()
    sent: list[int] = []
    # every 7th push one by one (a receipt counts who received it)
    writer = _producing(producer, stop, sent, receipt_every=7)
    try:
        assert wait_until(lambda: len(sent) > 50)
        member = fan.client()
        member.join(CHANNEL)
        # pushed from here on: after join() returned (push ``len(sent)`` may be on its way)
        mark = len(sent) + 1
        assert wait_until(lambda: len(sent) > mark + 500)
    finally:
        stop.set()
        writer.join(30)
    total = len(sent)
    got: list[int] = []
    after = set(range(mark, total))

    def complete() -> bool:
        _fill(member, got)
        return after <= set(got)

    assert wait_until(complete, timeout=30), f"missing: {sorted(after - set(got))[:20]}"
    got += _drain_numbers(member, 0.5)
    assert len(got) == len(set(got)), "a message came twice"
    published = [n for n in got if n % 7]
    assert published == sorted(published)
    assert member.fanout_gaps == [] and steady.fanout_gaps == []


def _fill(client: Client, got: list[int]) -> None:
    """Take what ``client`` holds into ``got``."""
    while (m := client.receive(timeout=0)) is not None:
        got.append(int(m.payload))


def test_the_asyncio_client_reads_a_fanout_stream_across_a_token_change(zctx: Ctx) -> None:
    """AsyncClient asks for fan-out too: its task reads the SUB beside its DEALER; a
    member's leave replaces the token and the one that stays follows, losing nothing."""
    from broker.client.aio import AsyncClient
    from tests.broker.test_aioclient import run

    f = Fan(zctx, None)
    try:
        producer = f.client()
        _broadcast_queue(producer)

        async def numbers(client: AsyncClient, count: int) -> list[int]:
            got: list[int] = []
            while len(got) < count:
                message = await client.receive(timeout=20)
                assert message is not None, f"{len(got)} of {count} received"
                got.append(int(message.payload))
            return got

        async def main(ctx: Any, ep: str) -> None:
            async with AsyncClient(ep, context=ctx) as stays, AsyncClient(ep, context=ctx) as goes:
                await stays.join(CHANNEL)
                await goes.join(CHANNEL)
                assert f.server.counters["fanout_subscribed"] == 2
                for i in range(100):
                    producer.push(CHANNEL, 1, str(i).encode())
                assert await numbers(stays, 100) == list(range(100))
                assert await numbers(goes, 100) == list(range(100))
                await goes.leave(CHANNEL)
                for i in range(100, 200):
                    producer.push(CHANNEL, 1, str(i).encode())
                assert await numbers(stays, 100) == list(range(100, 200))
                assert f.server.counters["fanout_published"] == 200  # never one by one
                assert stays.fanout_gaps == [] and goes.fanout_gaps == []
                assert await goes.receive(timeout=0.2) is None

        run(f.endpoint, main)
    finally:
        f.close()


def _payloads(client: Client, count: int) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + 20
    while len(got) < count and time.monotonic() < deadline:
        got += client.receive_payloads(timeout=1.0)
    return got


@pytest.mark.parametrize("threaded", [False, True], ids=["poll-on-call", "threaded"])
def test_raw_fanout_reading_hands_payloads_and_numbers(fan: Fan, threaded: bool) -> None:
    """``raw_fanout``: the payloads (any size: the length's long form, a header block
    before them) or (number, payload) pairs, in order, without message objects; what
    does not come by fan-out (a message asking a receipt) still comes to ``receive``."""
    producer = fan.client()
    _broadcast_queue(producer)
    plain = fan.client(raw_fanout="payloads", threaded=threaded)
    numbered = fan.client(raw_fanout="numbered", threaded=threaded)
    for c in (plain, numbered):
        c.join(CHANNEL)
    # (below 64 KiB: larger frames go zero-copy, which starts pyzmq's collector thread)
    sizes = [0, 1, 100, 252, 253, 300, 65_000]
    sent = [bytes([65 + i % 26]) * n for i, n in enumerate(sizes * 3)]
    for i, payload in enumerate(sent):
        headers = {"Trace": f"t{i}"} if i % 2 else None
        producer.push(CHANNEL, 1, payload, headers=headers)
    producer.push(CHANNEL, 1, b"one by one", headers={"Receipt": "ONE"}, ack=True)
    assert _payloads(plain, len(sent)) == sent
    pairs = _payloads(numbered, len(sent))
    assert [p for _, p in pairs] == sent
    assert [n for n, _ in pairs] == list(range(1, len(sent) + 1))
    for c in (plain, numbered):
        message = c.receive(timeout=20)
        assert message is not None and message.payload == b"one by one"
        assert c.receive_payloads(timeout=0.1) == []
        assert c.fanout_gaps == []
    with pytest.raises(ClientError, match="raw_fanout"):
        producer.receive_payloads(timeout=0)
    with pytest.raises(ValueError, match="raw_fanout"):
        Client(fan.endpoint, context=fan.ctx, raw_fanout="frames")


def test_raw_fanout_reading_reports_gaps(zctx: Ctx) -> None:
    """A raw reader that falls behind sees its gaps as the message reader does."""
    f = Fan(zctx, None, fanout_hwm=10)
    try:
        producer = f.client()
        _broadcast_queue(producer)
        slow = f.client(raw_fanout="numbered", hwm=10, threaded=False)
        slow.join(CHANNEL)
        total = 3000
        payload = b"x" * 8000
        for i in range(total):
            producer.push(CHANNEL, 1, b"%d %s" % (i, payload))
        got: list[tuple[int, bytes]] = []

        def settled() -> bool:
            got.extend(slow.receive_payloads(timeout=0.05))
            return len(got) + sum(g.count for g in slow.fanout_gaps) == total

        assert wait_until(settled, timeout=60)
        assert slow.fanout_gaps, "the raw reader fell behind without a reported gap"
        numbers = [n for n, _ in got]
        holes = {n for g in slow.fanout_gaps for n in range(g.first, g.last + 1)}
        assert not holes & set(numbers) and holes | set(numbers) == set(range(1, total + 1))
        assert all(int(p.split(b" ")[0]) == n - 1 for n, p in got)
    finally:
        f.close()


def _producing(
    producer: Any, stop: threading.Event, sent: list[int], *, receipt_every: int
) -> threading.Thread:
    """A started thread pushing 0, 1, 2 ... to ``CHANNEL`` (appending each to ``sent``) until
    ``stop``; every 20th push acknowledged so the producer keeps pace with the broker, and every
    ``receipt_every``-th (if > 0) asks a receipt, which sends it one by one."""

    def produce() -> None:
        i = 0
        while not stop.is_set() and i < 50_000:
            receipt = receipt_every > 0 and i % receipt_every == 0
            headers = {"Receipt": "ONE"} if receipt else None
            producer.push(CHANNEL, 1, str(i).encode(), headers=headers, ack=i % 20 == 0)
            sent.append(i)
            i += 1

    writer = threading.Thread(target=produce)
    writer.start()
    return writer


@pytest.mark.parametrize(
    ("after", "opts"),
    [(300, {"ping_interval": 0.2, "peer_timeout": 60.0}), (HOLD_MAX + 500, {})],
    ids=["beats", "size"],
)
def test_a_member_that_never_claims_the_new_token_does_not_stall_the_others(
    zctx: Ctx, after: int, opts: dict[str, Any]
) -> None:
    """The adversary: a member that stops reading (a poll-on-call client nobody calls)
    never hears of the token change when another member leaves, so it never claims.
    The stream's hold ends without it (its beats: ``ping_interval`` 0.2 makes a beat
    0.1 s; or ``HOLD_MAX`` held messages): the members that keep reading get everything
    in order with no gap.  When the stuck one reads again it claims late: what it gets is
    in order and every number it does not get is inside a reported gap (none silent)."""
    f = Fan(zctx, None, **opts)
    try:
        producer = f.client()
        _broadcast_queue(producer)
        readers = [f.client(), f.client()]
        stuck = f.client(threaded=False)  # (called again only at the end)
        leaver = f.client()
        for c in [*readers, stuck, leaver]:
            c.join(CHANNEL)
        before = 50
        for i in range(before):
            producer.push(CHANNEL, 1, str(i).encode())
        for r in readers:
            assert _numbers(r, before) == list(range(before))
        leaver.leave(CHANNEL)  # a new token: held until the three others claim it
        total = before + after
        assert producer.push_many(CHANNEL, 1, [str(i).encode() for i in range(before, total)],
                                  ack=True, timeout=60) == []  # fmt: skip
        for r in readers:
            assert _numbers(r, after, timeout=60) == list(range(before, total))
            assert r.fanout_gaps == []
        # the stuck member reads again: it claims, reads the rest of the old token's
        # stream, then the new token's from its marker on
        tail = 20
        got: list[int] = []

        def all_accounted() -> bool:
            while (m := stuck.receive(timeout=0)) is not None:
                got.append(int(m.payload))
            missed = {n - 1 for g in stuck.fanout_gaps for n in range(g.first, g.last + 1)}
            return set(got) | missed >= set(range(total + tail))

        for i in range(total, total + tail):  # pushed once it could claim (it may miss them)
            producer.push(CHANNEL, 1, str(i).encode())
        assert wait_until(all_accounted, timeout=60), f"unaccounted: {len(got)} received"
        assert got == sorted(got) and len(got) == len(set(got))
        missed = [n - 1 for g in stuck.fanout_gaps for n in range(g.first, g.last + 1)]
        assert not set(missed) & set(got), "a message both received and reported missed"
        assert got[:before] == list(range(before))  # what its SUB held before the change
    finally:
        f.close()


@pytest.mark.parametrize("raw", ["", "payloads"])
def test_a_poll_on_call_receive_without_waiting_reads_what_arrived(fan: Fan, raw: str) -> None:
    """``receive(timeout=0)`` (and ``receive_payloads(timeout=0)``) on a poll-on-call
    client reads its sockets once: a caller looping on it gets what arrived (it got
    nothing, ever: the zero deadline ended the wait before the first poll)."""
    producer = fan.client()
    _broadcast_queue(producer)
    member = fan.client(threaded=False, **({"raw_fanout": raw} if raw else {}))
    member.join(CHANNEL)
    producer.push(CHANNEL, 1, b"published")  # by fan-out
    producer.push(CHANNEL, 1, b"one by one", headers={"Receipt": "ONE"}, ack=True)
    got: list[bytes] = []

    def arrived() -> bool:
        if raw:
            got.extend(member.receive_payloads(timeout=0))
        while (m := member.receive(timeout=0)) is not None:
            got.append(m.payload)
        return len(got) == 2

    assert wait_until(arrived, timeout=20), f"received {got}"
    assert sorted(got) == [b"one by one", b"published"]


def test_two_channels_pushed_in_turn_reach_their_members_whole(fan: Fan) -> None:
    """Deliveries of two streams interleaved in one broker drain: each run ends where the
    other stream's delivery comes (a run lost them once), every member gets all of its
    channels' messages in order, no gap."""
    producer = fan.client()
    _broadcast_queue(producer)
    producer.create_queue("sports", 1, {"Status": 0})
    both, news = fan.client(), fan.client(raw_fanout="numbered")
    both.join(CHANNEL)
    both.join("sports")
    news.join(CHANNEL)
    total = 400
    for i in range(total):  # (queued together, they leave in batches: one drain)
        producer.push(CHANNEL, 1, b"%d" % i)
        producer.push("sports", 1, b"%d" % i)
    got: dict[str, list[int]] = {CHANNEL: [], "sports": []}

    def complete() -> bool:
        while (m := both.receive(timeout=0)) is not None:
            got[m.channel].append(int(m.payload))
        return all(len(v) >= total for v in got.values())

    assert wait_until(complete, timeout=30), {k: len(v) for k, v in got.items()}
    assert got == {CHANNEL: list(range(total)), "sports": list(range(total))}
    pairs = _payloads(news, total)
    assert [int(p) for _, p in pairs] == list(range(total))
    assert both.fanout_gaps == [] and news.fanout_gaps == []


def test_a_batch_published_as_one_run_reaches_a_reader_while_a_member_stops_reading(
    fan: Fan,
) -> None:
    """``push_many`` without acknowledges into a fan-out stream (one run through
    ``broker.engine.queue.broadcast_run``), a one-by-one consumer beside the members (the
    general path for that channel) and a batch carrying a push with headers mid-way (the
    run stops there and goes on after it): a member that stops reading stalls nobody --
    the reading member gets every message of both channels in order (the one-by-one
    consumer what broadcast gives it: in order) -- and when it reads again every number
    is received, in order, or in a reported gap."""
    producer = fan.client()
    _broadcast_queue(producer)
    producer.create_queue("sports", 1, {"Status": 0})
    reader, stopped = fan.client(), fan.client(threaded=False)  # (stopped: nobody calls it)
    direct = fan.client(fanout=False)
    reader.join(CHANNEL)
    stopped.join(CHANNEL)
    reader.join("sports")
    direct.join("sports")
    total = 1500
    for channel in (CHANNEL, "sports"):
        assert producer.push_many(channel, 1, [b"%d" % i for i in range(total // 2)],
                                  ack=False) == []  # fmt: skip
        producer.push(channel, 1, b"%d" % (total // 2), headers={"x": "y"})
        assert producer.push_many(channel, 1, [b"%d" % i for i in range(total // 2 + 1, total)],
                                  ack=False) == []  # fmt: skip
    got: dict[str, list[int]] = {CHANNEL: [], "sports": []}

    def complete() -> bool:
        while (m := reader.receive(timeout=0)) is not None:
            got[m.channel].append(int(m.payload))
        return all(len(v) >= total for v in got.values())

    assert wait_until(complete, timeout=60), {k: len(v) for k, v in got.items()}
    assert got == {CHANNEL: list(range(total)), "sports": list(range(total))}
    # (one by one, broadcast gives a copy to a consumer with room: order, not all)
    seen_direct: list[int] = []

    def some_direct() -> bool:
        while (m := direct.receive(timeout=0)) is not None:
            seen_direct.append(int(m.payload))
        return bool(seen_direct)

    assert wait_until(some_direct, timeout=60)
    assert seen_direct == sorted(set(seen_direct))
    assert reader.fanout_gaps == []
    late: list[int] = []

    def accounted() -> bool:
        while (m := stopped.receive(timeout=0)) is not None:
            late.append(int(m.payload))
        missed = sum(g.count for g in stopped.fanout_gaps)
        return len(late) + missed >= total

    assert wait_until(accounted, timeout=60), f"{len(late)} received"
    assert late == sorted(late) and len(late) == len(set(late))
    missed_numbers = {n - 1 for g in stopped.fanout_gaps for n in range(g.first, g.last + 1)}
    assert not missed_numbers & set(late)
    assert missed_numbers | set(late) == set(range(total))
