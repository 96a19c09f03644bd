"""Virtual hosts as values (``broker.stomp.vhosts``) and as engine namespaces
(``broker.stomp.engine_mapping``): the config list's checks, and channel names worked
out by hand -- the default virtual host keeps the mapping it always had, another one's
names get its ``NAME/`` prefix, and no two destinations share a channel."""

from __future__ import annotations

import itertools

import pytest

from broker.stomp.destinations import Destination, DestinationKind, parse_destinations
from broker.stomp.engine_durable import durable_plan
from broker.stomp.engine_mapping import (
    channel_of,
    destination_of,
    in_namespace,
    wildcard_matches,
)
from broker.stomp.errors import BackendError, VirtualHostError
from broker.stomp.subscription import SubscriptionSpec
from broker.stomp.vhosts import (
    DEFAULT_VIRTUAL_HOSTS,
    VirtualHost,
    namespace_of,
    parse_virtual_hosts,
)

Q, T, D = DestinationKind.QUEUE, DestinationKind.TOPIC, DestinationKind.DSUB


def test_a_config_list_in_order() -> None:
    hosts = parse_virtual_hosts(
        [
            {"name": "shop", "host_names": ["shop.example", "127.0.0.2"]},
            {"name": "default", "host_names": ["localhost"]},
        ]
    )
    assert hosts == (
        VirtualHost("shop", ("shop.example", "127.0.0.2")),
        VirtualHost("default", ("localhost",)),
    )
    assert [h.namespace for h in hosts] == ["shop", ""]
    assert DEFAULT_VIRTUAL_HOSTS[0].namespace == "" == namespace_of("default")


@pytest.mark.parametrize(
    ("entries", "match"),
    [
        (None, "non-empty list"),
        ([], "non-empty list"),
        ("x", "non-empty list"),
        (["x"], r"virtual_hosts\[0\]: expected a table"),
        ([{"host_names": ["a"]}], "name must be"),
        ([{"name": "", "host_names": ["a"]}], "name must be"),
        ([{"name": "a.b", "host_names": ["a"]}], "name must be"),
        ([{"name": "x" * 65, "host_names": ["a"]}], "name must be"),
        ([{"name": 7, "host_names": ["a"]}], "name must be"),
        ([{"name": "x"}], "host_names must be a non-empty list"),
        ([{"name": "x", "host_names": "a"}], "host_names must be a non-empty list"),
        ([{"name": "x", "host_names": [""]}], "printable ASCII"),
        ([{"name": "x", "host_names": ["a\x00b"]}], "printable ASCII"),
        ([{"name": "x", "host_names": ["h" * 254]}], "printable ASCII"),
        ([{"name": "x", "host_names": ["a", "a"]}], "listed twice"),
        ([{"name": "x", "host_names": ["a"], "extra": 1}], r"unknown keys \['extra'\]"),
        (
            [{"name": "x", "host_names": ["a"]}, {"name": "x", "host_names": ["b"]}],
            "'x' is named twice",
        ),
        (
            [{"name": "x", "host_names": ["a"]}, {"name": "y", "host_names": ["a"]}],
            "host name 'a' of virtual host 'y' already reaches 'x'",
        ),
        (
            [{"name": "x", "host_names": ["y"]}, {"name": "y", "host_names": ["b"]}],
            "host name 'y' of virtual host 'x' already reaches 'y'",
        ),
    ],
)
def test_bad_lists_are_one_line_errors(entries: object, match: str) -> None:
    with pytest.raises(VirtualHostError, match=match) as caught:
        parse_virtual_hosts(entries)
    assert "\n" not in str(caught.value)


def test_a_host_may_list_its_own_name() -> None:
    assert parse_virtual_hosts([{"name": "x", "host_names": ["x", "x.example"]}])


@pytest.mark.parametrize(
    ("destination", "channel"),
    [
        (Destination(Q, "a.b"), "a.b"),  # the default virtual host: as it always was
        (Destination(T, "a.b"), "/topic/a.b"),
        (Destination(D, "d1"), "/dsub/d1"),
        (Destination(Q, "a.b", namespace="shop"), "shop/a.b"),
        (Destination(T, "a.b", namespace="shop"), "/topic/shop/a.b"),
        (Destination(D, "d1", namespace="shop"), "/dsub/shop/d1"),
        (Destination(Q, "temp.b.7.r", namespace="shop"), "shop/temp.b.7.r"),
    ],
)
def test_channel_names_and_back(destination: Destination, channel: str) -> None:
    assert channel_of(destination) == channel
    back = destination_of(channel)
    assert back == destination and back.namespace == destination.namespace
    assert back.stomp == destination.stomp  # what the client sees: no namespace


def test_no_two_destinations_share_a_channel() -> None:
    """Names a client may use (even ones spelled like a kind's prefix or a namespace)
    in three namespaces, every kind: all channels differ."""
    names = ["a", "topic", "dsub", "shop", "x.y", "temp.b.1.q", "queue"]
    spaces = ["", "shop", "topic", "dsub"]
    made = [
        Destination(kind, name, namespace=space)
        for kind, name, space in itertools.product((Q, T, D), names, spaces)
    ]
    channels = [channel_of(d) for d in made]
    assert len(set(channels)) == len(made)
    assert [destination_of(c) for c in channels] == made


def test_wildcards_match_their_own_virtual_host_only() -> None:
    (pattern,) = parse_destinations(
        "/queue/orders.*", broker_id="b", connection_id=1, allow_wildcards=True
    )
    (shop,) = in_namespace((pattern,), "shop")
    assert wildcard_matches(pattern, "orders.1", 1)
    assert not wildcard_matches(pattern, "shop/orders.1", 1)
    assert wildcard_matches(shop, "shop/orders.1", 1)
    assert not wildcard_matches(shop, "orders.1", 1)
    assert not wildcard_matches(shop, "other/orders.1", 1)


def _durable(destinations: str, sub_id: str, namespace: str) -> SubscriptionSpec:
    parsed = parse_destinations(destinations, broker_id="b", connection_id=1, allow_wildcards=True)
    return SubscriptionSpec(sub_id, in_namespace(parsed, namespace), persistent=True)


def test_a_durable_subscription_is_addressed_in_its_namespace() -> None:
    topics, shown = durable_plan(_durable("/dsub/d1", "d1", "shop"), "shop")
    assert topics == [] and channel_of(shown) == "/dsub/shop/d1" and shown.stomp == "/dsub/d1"
    topics, shown = durable_plan(_durable("/topic/news", "d1", "shop"), "shop")
    assert [channel_of(t) for t in topics] == ["/topic/shop/news"] and shown.stomp == "/topic/news"
    with pytest.raises(BackendError):  # another id's /dsub/: not this subscription
        durable_plan(_durable("/dsub/d2", "d1", "shop"), "shop")


def test_temporary_queues_of_an_earlier_run_go_in_every_virtual_host() -> None:
    """At start the door removes temporary queues an earlier run left (their
    connections are gone), a virtual host's (``shop/temp...``) too; other names stay."""
    from broker.engine.engine import Engine
    from broker.stomp.engine_door import EngineDoor

    engine = Engine()
    left = ["temp.default.1.inbox", "shop/temp.default.2.inbox"]
    kept = ["temperature", "shop/temperature", "shop/orders"]
    for name in left + kept:
        engine.create_channel(name)
    door = EngineDoor(engine)
    assert [n for n in left + kept if n in engine.channels] == kept
    door.close()
