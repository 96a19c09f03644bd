"""The federation core, sans-IO: interest, Hops/Depth, seen-window, acked forwarding."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.federation.core import (
    GIVE_BACK_DELAY,
    MAX_REASON,
    REFUSED_REASON,
    AckLocal,
    Action,
    Confirm,
    FederationCore,
    Forward,
    Join,
    Leave,
    NackLocal,
    Policy,
    PushLocal,
    Refuse,
    Remember,
    TrashLocal,
)
from broker.federation.errors import BadPeerMessage, ConfigError
from broker.federation.settings import FederationSettings, LinkMode, parse_link
from broker.federation.wire import (
    Envelope,
    decode_interest,
    encode_interest,
    local_headers,
    message_headers,
    parse_message,
)

BOTH = Policy()


def core(me: str = "A", **options: object) -> FederationCore:
    return FederationCore(FederationSettings(broker_id=me, **options), boot="t")  # type: ignore[arg-type]


def deliver(c: FederationCore, ref: object, headers=(), channel: str = "news", needs_ack=True,
            now: float = 0.0, mid: str = "m1") -> list[Action]:  # fmt: skip
    return c.local_delivery(channel, 0, mid, "pub", tuple(headers), b"body", False, needs_ack,
                            ref, now)  # fmt: skip


def forwards(actions: list[Action]) -> list[Forward]:
    return [a for a in actions if isinstance(a, Forward)]


def env(hops: tuple[str, ...], fed_id: str = "X/p/1", depth: int = -1) -> Envelope:
    return Envelope("news", 0, fed_id, hops, depth, (), b"body")


def test_interest_joins_and_leaves_the_local_channel() -> None:
    c = core()
    assert c.interest_heard("B", BOTH, {"news": ("B",)}, 0.0) == [Join("news")]
    assert c.interest_heard("B", BOTH, {}, 0.5) == [Leave("news")]


def test_no_interest_no_forward_and_the_delivery_is_acked() -> None:
    c = core()
    c.interest_heard("B", BOTH, {"other": ("B",)}, 0.0)
    assert deliver(c, "r1") == [AckLocal("r1")]
    assert c.counters.local_kept == 1


def test_forward_adds_this_broker_to_hops_and_spends_depth() -> None:
    c = core()
    c.interest_heard("B", BOTH, {"news": ("B",)}, 0.0)
    [fwd] = forwards(deliver(c, "r", headers=[("Depth", "2"), ("Hops", "X"), ("Fed-Id", "X/1")]))
    assert fwd.peer == "B"
    assert fwd.envelope.hops == ("X", "A")
    assert fwd.envelope.depth == 1
    assert fwd.envelope.fed_id == "X/1"
    [fwd] = forwards(deliver(c, "r2", mid="m2"))  # no headers: default depth -1, new id
    assert fwd.envelope.depth == -1 and fwd.envelope.hops == ("A",)
    assert fwd.envelope.fed_id == "A/pub/m2"


def test_depth_zero_and_hops_stop_forwarding() -> None:
    c = core()
    c.interest_heard("B", BOTH, {"news": ("B",)}, 0.0)
    c.interest_heard("C", BOTH, {"news": ("C",)}, 0.0)
    assert deliver(c, "r", headers=[("Depth", "0")]) == [AckLocal("r")]
    only_c = forwards(deliver(c, "r2", headers=[("Hops", "B")]))
    assert [f.peer for f in only_c] == ["C"]
    assert deliver(c, "r3", headers=[("Hops", "B,C")]) == [AckLocal("r3")]


def test_bad_local_depth_is_not_forwarded() -> None:
    c = core()
    c.interest_heard("B", BOTH, {"news": ("B",)}, 0.0)
    assert deliver(c, "r", headers=[("Depth", "lots")]) == [AckLocal("r")]
    assert c.counters.invalid == 1


def test_local_ack_only_after_every_peer_confirmed() -> None:
    c = core()
    c.interest_heard("B", BOTH, {"news": ("B",)}, 0.0)
    c.interest_heard("C", BOTH, {"news": ("C",)}, 0.0)
    fwds = forwards(deliver(c, "r"))
    assert {f.peer for f in fwds} == {"B", "C"}
    token = fwds[0].token
    assert c.forward_done(token, "B", True, 1.0) == []
    assert c.forward_done(token, "C", False, 1.0) == []  # failed: sent again later
    assert c.pending == 1
    assert forwards(c.poll(1.1)) == []  # backing off
    resent = forwards(c.poll(1.5))
    assert [f.peer for f in resent] == ["C"]
    assert c.forward_done(token, "C", True, 1.5) == [AckLocal("r")]
    assert c.pending == 0


def test_a_permanent_refusal_dead_letters_the_delivery_not_acknowledges_it() -> None:
    """Refused for good: not sent again, and its queue's trash gets it with the peer's
    reason (an acknowledge would drop a message nobody got)."""
    c = core()
    c.interest_heard("B", BOTH, {"news": ("B",)}, 0.0)
    [fwd] = forwards(deliver(c, "r"))
    why = "channel 'news' not allowed on this link (status 401)"
    done = c.forward_done(fwd.token, "B", False, 0.0, permanent=True, reason=why)
    assert done == [TrashLocal("r", f"{REFUSED_REASON}B: {why}")]
    assert (c.counters.refused_by_peer, c.counters.dead_lettered, c.pending) == (1, 1, 0)
    assert forwards(c.poll(100.0)) == []  # never sent again


def test_a_delivery_refused_by_one_peer_is_dead_lettered_once_every_peer_answered() -> None:
    def answer(c: FederationCore, token: int, peer: str) -> list[Action]:
        if peer == "B":  # B confirms, C refuses for good
            return c.forward_done(token, "B", True, 1.0)
        return c.forward_done(token, "C", False, 1.0, permanent=True, reason="no")

    for first, last in (("B", "C"), ("C", "B")):
        c = core()
        c.interest_heard("B", BOTH, {"news": ("B",)}, 0.0)
        c.interest_heard("C", BOTH, {"news": ("C",)}, 0.0)
        [token] = {f.token for f in forwards(deliver(c, "r"))}
        assert answer(c, token, first) == []
        assert answer(c, token, last) == [TrashLocal("r", f"{REFUSED_REASON}C: no")]
        assert (c.counters.confirmed, c.counters.dead_lettered) == (1, 1)


def test_a_refused_delivery_that_needs_no_acknowledge_is_counted_only() -> None:
    """It left its queue when it was delivered: nothing to give back or trash."""
    c = core()
    c.interest_heard("B", BOTH, {"news": ("B",)}, 0.0)
    [fwd] = forwards(deliver(c, "r", needs_ack=False))
    assert c.forward_done(fwd.token, "B", False, 0.0, True, "no") == [AckLocal("r")]
    assert (c.counters.refused_by_peer, c.counters.dead_lettered) == (1, 0)


def test_a_dead_letter_reason_is_bounded() -> None:
    c = core()
    c.interest_heard("B", BOTH, {"news": ("B",)}, 0.0)
    [fwd] = forwards(deliver(c, "r"))
    [trash] = c.forward_done(fwd.token, "B", False, 0.0, True, "x" * 5000)
    assert isinstance(trash, TrashLocal) and len(trash.reason) == MAX_REASON
    assert trash.reason.startswith(f"{REFUSED_REASON}B: xxx")


def test_a_down_peer_keeps_its_interest_and_gets_what_waited_when_back() -> None:
    c = core(peer_timeout=5.0)
    c.interest_heard("B", BOTH, {"news": ("B",)}, 0.0)
    c.poll(10.0)  # silent for 10 s: down
    assert not c.peers["B"].up
    assert forwards(deliver(c, "r", now=10.0)) == []  # held, not acked, not dropped
    assert c.pending == 1
    back = forwards(c.interest_heard("B", BOTH, {"news": ("B",)}, 11.0))
    assert [f.peer for f in back] == ["B"]
    assert c.forward_done(back[0].token, "B", True, 11.0) == [AckLocal("r")]


def test_window_bounds_forwards_in_flight() -> None:
    c = core(window=2)
    c.interest_heard("B", BOTH, {"news": ("B",)}, 0.0)
    sent = [f for i in range(5) for f in forwards(deliver(c, i, mid=f"m{i}"))]
    assert len(sent) == 2
    more = forwards(c.forward_done(sent[0].token, "B", True, 0.0))
    assert len(more) == 1 and c.peers["B"].in_flight == 2


def test_max_pending_drops_only_what_needs_no_ack() -> None:
    c = core(max_pending=1, peer_timeout=5.0)
    c.interest_heard("B", BOTH, {"news": ("B",)}, 0.0)
    c.peer_down("B")
    assert deliver(c, "r1", needs_ack=False) == []
    assert deliver(c, "r2", needs_ack=False, mid="m2") == [AckLocal("r2")]
    assert c.counters.dropped == 1
    assert deliver(c, "r3", needs_ack=True, mid="m3") == []  # held: its queue keeps it
    assert c.pending == 2


def test_remote_message_is_pushed_once_and_a_second_copy_is_dropped() -> None:
    c = core()
    c.interest_heard("B", BOTH, {}, 0.0)
    c.interest_heard("C", BOTH, {}, 0.0)
    [push] = c.remote_message("B", env(("X", "B")), "ref-b")
    assert isinstance(push, PushLocal) and push.envelope.hops == ("X", "B")
    assert c.remote_message("C", env(("X", "C")), "ref-c") == []  # waits for the first push
    # the id is remembered (kept durably by the driver) before the confirms go
    assert c.local_done(push.token, True) == [
        Remember("X/p/1"),
        Confirm("ref-b"),
        Confirm("ref-c"),
    ]
    assert c.remote_message("C", env(("X", "C")), "ref-c2") == [Confirm("ref-c2")]
    assert c.counters.duplicates == 2 and c.counters.received == 1


def test_a_failed_local_push_is_refused_not_remembered() -> None:
    c = core()
    c.interest_heard("B", BOTH, {}, 0.0)
    [push] = c.remote_message("B", env(("B",)), "r")
    assert c.local_done(push.token, False, "full") == [Refuse("r", "full", False)]
    [again] = c.remote_message("B", env(("B",)), "r2")  # the resend is pushed again
    assert isinstance(again, PushLocal)


def test_seen_window_is_bounded() -> None:
    c = core(seen_window=2)
    c.interest_heard("B", BOTH, {}, 0.0)
    for i in range(3):
        [push] = c.remote_message("B", env(("B",), fed_id=f"id{i}"), i)
        c.local_done(push.token, True)
    # id0 was forgotten (oldest), id2 is remembered
    assert isinstance(c.remote_message("B", env(("B",), fed_id="id0"), "x")[0], PushLocal)
    assert c.remote_message("B", env(("B",), fed_id="id2"), "y") == [Confirm("y")]


def test_loop_back_to_this_broker_is_dropped() -> None:
    c = core()
    c.interest_heard("B", BOTH, {}, 0.0)
    assert c.remote_message("B", env(("A", "B")), "r") == [Confirm("r")]
    assert c.counters.loops == 1


def test_unknown_peer_and_disallowed_channel_are_refused() -> None:
    c = core()
    [refused] = c.remote_message("Z", env(("Z",)), "r")
    assert isinstance(refused, Refuse) and not refused.permanent
    c.interest_heard("B", Policy(LinkMode.BOTH, ("logs.*",)), {}, 0.0)
    [refused] = c.remote_message("B", env(("B",)), "r")
    assert isinstance(refused, Refuse) and refused.permanent


def test_one_way_link_neither_forwards_in_nor_asks() -> None:
    c = core()
    out_only = Policy(LinkMode.OUT)
    c.interest_heard("M", out_only, {"news": ("M",)}, 0.0)
    c.local_interest({"news"})
    assert c.advert_for("M") == {}  # it never asks the master for messages
    assert [f.peer for f in forwards(deliver(c, "r"))] == ["M"]
    in_only = core()
    in_only.interest_heard("M", Policy(LinkMode.IN), {"news": ("M",)}, 0.0)
    assert deliver(in_only, "r") == [AckLocal("r")]


def test_interest_split_horizon_on_paths() -> None:
    c = core()
    c.local_interest({"mine"})
    c.interest_heard("B", BOTH, {"news": ("B",), "far": ("B", "C")}, 0.0)
    c.interest_heard("C", BOTH, {"far": ("C",)}, 0.0)
    to_c = c.advert_for("C")
    assert to_c["mine"] == ("A",)
    assert to_c["news"] == ("A", "B")
    assert "far" not in to_c  # C is on both paths: never offered back to it
    assert c.advert_for("B")["far"] == ("A", "C")
    # interest whose path passed here already is ignored
    c.interest_heard("B", BOTH, {"loop": ("B", "A")}, 1.0)
    assert "loop" not in c.peers["B"].interest


def test_wire_round_trip_and_garbage() -> None:
    e = Envelope("news", 7, "A/p/1", ("X", "A"), 3, (("k", "v"),), b"\x00body", True)
    sender, back = parse_message(message_headers(e, "A"), e.payload)
    assert sender == "A" and back == e
    assert dict(local_headers(e))["Hops"] == "X,A"
    assert decode_interest(encode_interest("A", {"c": ("A", "B")})) == ("A", {"c": ("A", "B")})
    for bad in (b"", b"[]", b'{"broker": "A"}', b'{"broker": "A", "interest": {"c": []}}',
                b'{"broker": "A b", "interest": {}}', b"[" * 5000):  # fmt: skip
        with pytest.raises(BadPeerMessage):
            decode_interest(bad)
    headers = message_headers(e, "A")
    for name, value in (("Hops", "X,Y"), ("Depth", "-2"), ("Fed-Queue", "70000"),
                        ("Fed-Id", ""), ("Fed-Channel", "a\nb")):  # fmt: skip
        changed = tuple((k, value if k == name else v) for k, v in headers)
        with pytest.raises(BadPeerMessage):
            parse_message(changed, b"")


def test_link_specs() -> None:
    spec = parse_link("tcp://127.0.0.1:5555?mode=out&channels=a.*,b&key=/k/s.key")
    assert spec.mode is LinkMode.OUT and spec.channels == ("a.*", "b")
    assert spec.server_key == "/k/s.key" and spec.endpoint == "tcp://127.0.0.1:5555"
    for bad in ("udp://h:1", "tcp://h", "tcp://h:1?mode=sideways", "tcp://h:1?x=1",
                "tcp://h:1?channels="):  # fmt: skip
        with pytest.raises(ConfigError):
            parse_link(bad)
    with pytest.raises(ConfigError):
        FederationSettings(broker_id="no spaces")
    with pytest.raises(ConfigError):
        FederationSettings(broker_id="A", default_depth=-2)


def test_forwards_in_flight_when_a_peer_went_away_are_sent_again_when_it_is_back() -> None:
    c = core(peer_timeout=5.0)
    c.interest_heard("B", BOTH, {"news": ("B",)}, 0.0)
    [fwd] = forwards(deliver(c, "r"))
    c.poll(10.0)  # silent: down, its forward still in flight
    again = forwards(c.interest_heard("B", BOTH, {"news": ("B",)}, 11.0))
    assert [f.token for f in again] == [fwd.token]
    assert c.peers["B"].in_flight == 1
    assert c.forward_done(fwd.token, "B", True, 11.0) == [AckLocal("r")]
    assert c.peers["B"].in_flight == 0


def test_peers_are_bounded() -> None:
    c = core(max_peers=2)
    c.interest_heard("B", BOTH, {}, 0.0)
    c.interest_heard("C", BOTH, {}, 0.0)
    assert c.accepts_peer("B") and not c.accepts_peer("D")


def one(c: FederationCore, ref: object, headers=(), mid: str = "m1", needs_ack: bool = True,
        redelivered: bool = False, now: float = 0.0) -> list[Action]:  # fmt: skip
    """A delivery from a local queue that hands each message to one consumer."""
    return c.local_delivery("news", 0, mid, "pub", tuple(headers), b"body", False, needs_ack,
                            ref, now, one_consumer=True, redelivered=redelivered)  # fmt: skip


def test_one_consumer_delivery_goes_to_one_peer_the_least_loaded() -> None:
    c = core()
    c.interest_heard("B", BOTH, {"news": ("B",)}, 0.0)
    c.interest_heard("C", BOTH, {"news": ("C",)}, 0.0)
    first = forwards(one(c, "r1"))
    second = forwards(one(c, "r2", mid="m2"))
    assert len(first) == 1 and len(second) == 1  # never a copy to two brokers
    assert {first[0].peer, second[0].peer} == {"B", "C"}
    assert len(forwards(deliver(c, "r3", mid="m3"))) == 2  # a copying queue: both


def test_one_consumer_delivery_no_peer_can_take_is_given_back() -> None:
    c = core()
    c.local_interest({"news"})  # a local consumer can take it
    c.interest_heard("B", BOTH, {"news": ("B",)}, 0.0)
    # the only interested peer is in Hops, or Depth is spent: back to the queue, not acked
    assert one(c, "r1", headers=[("Hops", "B")]) == [NackLocal("r1", 0.0)]
    assert one(c, "r2", headers=[("Depth", "0")], mid="m2") == [NackLocal("r2", 0.0)]
    # given back before: after a pause (it may come straight back here)
    assert one(c, "r3", headers=[("Hops", "B")], mid="m3", redelivered=True) == [
        NackLocal("r3", GIVE_BACK_DELAY)
    ]
    assert c.counters.given_back == 3 and c.counters.local_kept == 0 and c.pending == 0


def test_one_consumer_delivery_waits_only_for_a_peer_with_room() -> None:
    c = core(window=1)
    c.local_interest({"news"})
    c.interest_heard("B", BOTH, {"news": ("B",)}, 0.0)
    assert len(forwards(one(c, "r1"))) == 1
    assert one(c, "r2", mid="m2") == [NackLocal("r2", 0.0)]  # B's window is full
    c.peer_down("B")
    assert one(c, "r3", mid="m3") == [NackLocal("r3", 0.0)]  # B is down


def test_one_consumer_delivery_without_local_consumer_waits_for_the_peer() -> None:
    c = core()
    c.interest_heard("B", BOTH, {"news": ("B",)}, 0.0)
    c.peer_down("B")
    assert one(c, "r1") == []  # nothing local could take it: held for B
    [fwd] = forwards(c.interest_heard("B", BOTH, {"news": ("B",)}, 1.0))
    assert c.forward_done(fwd.token, "B", True, 1.0) == [AckLocal("r1")]
    # no peer at all (all in Hops) and no local consumer: given back after a pause
    assert one(c, "r2", headers=[("Hops", "B")], mid="m2") == [NackLocal("r2", GIVE_BACK_DELAY)]


def test_peer_down_gives_back_what_waits_for_it_on_a_channel_with_local_consumers() -> None:
    c = core(window=1, peer_timeout=5.0)
    c.interest_heard("B", BOTH, {"news": ("B",)}, 0.0)
    sent = forwards(one(c, "r1"))  # in flight
    assert one(c, "r2", mid="m2") == []  # no local consumer yet: waits for B
    c.local_interest({"news"})
    assert c.peer_down("B") == [NackLocal("r2")]  # waiting: back to the queue
    assert c.pending == 1  # the one in flight waits (B may have it): sent again later
    [again] = forwards(c.interest_heard("B", BOTH, {"news": ("B",)}, 1.0))
    assert again.envelope == sent[0].envelope
    assert c.poll(20.0) == []  # silent too long: down, nothing waiting to give back


def test_one_consumer_delivery_without_acknowledge_goes_to_one_peer() -> None:
    c = core()
    c.interest_heard("B", BOTH, {"news": ("B",)}, 0.0)
    c.interest_heard("C", BOTH, {"news": ("C",)}, 0.0)
    assert len(forwards(one(c, "r1", needs_ack=False))) == 1


def test_seen_window_seeded_after_a_restart_drops_a_resent_copy() -> None:
    """A new core (a restarted broker) seeded with the ids kept on disk drops a copy a
    peer sends again; without the seed it would push it a second time."""
    first = core()
    first.interest_heard("B", BOTH, {}, 0.0)
    [push] = first.remote_message("B", env(("B",), fed_id="k1"), "r1")
    assert first.local_done(push.token, True)[0] == Remember("k1")
    again = core()
    again.interest_heard("B", BOTH, {}, 0.0)
    assert isinstance(again.remote_message("B", env(("B",), fed_id="k1"), "x")[0], PushLocal)
    seeded = core(seen_window=2)
    seeded.remember(["old", "k0", "k1"])  # past the window: the oldest is forgotten
    seeded.interest_heard("B", BOTH, {}, 0.0)
    assert seeded.remote_message("B", env(("B",), fed_id="k1"), "y") == [Confirm("y")]
    assert seeded.seen_ids() == ["k0", "k1"]


def test_seen_journal_survives_reopen_torn_tail_and_rewrite(tmp_path: Path) -> None:
    from broker.federation.seen import SeenJournal

    path = tmp_path / "federation-seen"
    journal = SeenJournal(path, window=3)
    assert journal.load() == []
    for i in range(4):
        journal.add(f"id{i}")
    journal.sync()
    journal.close()
    with path.open("ab") as f:
        f.write(b"torn-without-newline")  # kill -9 mid-write: not confirmed
    journal = SeenJournal(path, window=3)
    assert journal.load() == ["id1", "id2", "id3"]
    assert path.read_bytes().endswith(b"id3\n")  # the torn tail is gone
    for i in range(4, 9):
        journal.add(f"id{i}")
    assert journal.due_for_rewrite
    journal.sync([f"id{i}" for i in range(9)])
    assert path.read_bytes() == b"id6\nid7\nid8\n"
    journal.add("id9")
    journal.close()
    assert SeenJournal(path, window=3).load() == ["id7", "id8", "id9"]


def test_a_peer_flooding_past_its_window_is_refused_busy_others_unaffected() -> None:
    c = core(peer_in_flight=2)
    c.interest_heard("B", BOTH, {}, 0.0)
    c.interest_heard("C", BOTH, {}, 0.0)
    [p1] = c.remote_message("B", env(("B",), fed_id="b1"), "r1")
    assert c.remote_message("B", env(("B",), fed_id="b1"), "r1-copy") == []  # counts too
    [refused] = c.remote_message("B", env(("B",), fed_id="b2"), "r2")
    assert isinstance(refused, Refuse) and not refused.permanent  # busy: sent again later
    assert c.counters.flooded == 1
    [other] = c.remote_message("C", env(("C",), fed_id="c1"), "rc")  # C is not slowed
    assert isinstance(other, PushLocal)
    assert c.local_done(p1.token, True) == [Remember("b1"), Confirm("r1"), Confirm("r1-copy")]
    [again] = c.remote_message("B", env(("B",), fed_id="b2"), "r2-again")  # room again
    assert isinstance(again, PushLocal)


def test_batch_wire_round_trip_and_garbage() -> None:
    from broker.federation.wire import MAX_BATCH, decode_batch, encode_batch

    items = [((("Fed-Broker", "B"), ("Hops", "B")), b"one"), ((("X", "a:b"),), b"")]
    assert decode_batch(encode_batch(items)) == items
    good = encode_batch(items)
    for bad in (b"", good[:-1], b"\x05\x00\x00\x00ab", b"\x03\x00\x00\x00abc"):
        with pytest.raises(BadPeerMessage):
            decode_batch(bad)
    with pytest.raises(BadPeerMessage):
        decode_batch(encode_batch([((), b"x")] * (MAX_BATCH + 1)))
