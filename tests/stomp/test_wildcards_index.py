"""The STOMP door's wildcard index (``broker.stomp.wildcards``) against trying every
wildcard subscription on every channel created, as the door did before session 18:
kinds, virtual hosts, composites, another connection's temporary queue, subscriptions
added, replaced, dropped and connections gone."""

from __future__ import annotations

import dataclasses
import random

from broker.stomp.destinations import Destination, DestinationKind, parse_destinations, temp_name
from broker.stomp.engine_mapping import channel_of
from broker.stomp.wildcards import Key, Wild, Wildcards

WORDS = ["a", "b", "ab"]
HEADERS = [
    "/queue/a.*", "/queue/**", "/topic/a.>", "/topic/*.b", "/queue/{a|b}.**", "/topic/**",
    "/queue/a.*,/topic/b.*", "/queue/ab.{[ab]+}", "/queue/*", "/topic/a.b.*",
]  # fmt: skip


def _wild(conn: int, header: str, namespace: str) -> Wild:
    parsed = parse_destinations(header, broker_id="B", connection_id=conn, allow_wildcards=True)
    patterns = tuple(dataclasses.replace(d, namespace=namespace) for d in parsed if d.wildcard)
    return Wild(conn, patterns, None, False)


def _channel(rng: random.Random) -> str:
    name = ".".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3)))
    if rng.random() < 0.15:
        name = temp_name("B", rng.randint(1, 4), name)
    kind = rng.choice([DestinationKind.QUEUE, DestinationKind.TOPIC])
    return channel_of(Destination(kind, name, namespace=rng.choice(["", "", "v1"])))


def test_the_index_matches_what_trying_every_wildcard_matches_in_the_same_order() -> None:
    rng = random.Random(18)
    index = Wildcards()
    brute: dict[Key, Wild] = {}
    for step in range(800):
        conn = rng.randint(1, 4)
        key = (conn, f"s{rng.randint(1, 3)}")
        roll = rng.random()
        if roll < 0.5:
            header = rng.choice([h for h in HEADERS if ">" not in h])
            wild = _wild(conn, header, rng.choice(["", "v1"]))
            index.add(key, wild)
            brute.pop(key, None)
            brute[key] = wild
        elif roll < 0.85:
            assert index.pop(key) is brute.pop(key, None)
        else:
            index.drop_connection(conn)
            for k in [k for k in brute if k[0] == conn]:
                del brute[k]
        assert len(index) == len(brute)
        channel = _channel(rng)
        want = [w for w in brute.values() if w.matches(channel)]
        assert list(index.matching(channel)) == want, (step, channel)


def test_another_connections_temporary_queue_is_never_matched() -> None:
    index = Wildcards()
    mine, other = _wild(1, "/queue/**", ""), _wild(2, "/queue/**", "")
    index.add((1, "s"), mine)
    index.add((2, "s"), other)
    temp = channel_of(Destination(DestinationKind.QUEUE, temp_name("B", 1, "q")))
    assert list(index.matching(temp)) == [mine]
    assert list(index.matching("plain")) == [mine, other]
