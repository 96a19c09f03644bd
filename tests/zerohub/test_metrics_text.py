"""The hub's own Prometheus text writer (``zerohub.metrics.exposition``) against the
library's (``generate_latest``): byte for byte the same, hostile label values included; a
family it does not handle goes to the library.  And one read of the broker serves the
metrics and the console within ``status_ttl``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import zmq
from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from broker.client.blocking import Client
from zerohub.hub import Hub, HubEndpoints
from zerohub.metrics import Rows, exposition, registry

HOSTILE = ["plain", 'a"quote', "back\\slash", "new\nline", "", "ünï©ødé", '\\"\n\\n', "{}=,"]


class Fixed(Collector):
    def __init__(self, *families: Metric) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def _registry(*families: Metric) -> CollectorRegistry:
    out = CollectorRegistry(auto_describe=False)
    out.register(Fixed(*families))
    return out


def test_the_same_text_as_the_library_with_hostile_labels() -> None:
    gauge = GaugeMetricFamily("g", 'help with \\ and\nnewline "q"', labels=["channel", "queue"])
    counter = CounterMetricFamily("c", "a counter", labels=["mount"])
    for i, text in enumerate(HOSTILE):
        gauge.add_metric([text, str(i)], i * 1.5)
        counter.add_metric([text], 10**i)
    values = [0, -1, 1e21, 123456789.0, 0.1, float("inf"), float("-inf"), float("nan"), 7]
    plain = [GaugeMetricFamily(f"v{i}", "value", value=v) for i, v in enumerate(values)]
    metrics = _registry(gauge, counter, *plain, CounterMetricFamily("empty", "no samples"))
    assert exposition(metrics) == generate_latest(metrics)
    assert b'channel="a\\"quote"' in exposition(metrics)


def test_integers_and_label_sets_written_again_read_the_same() -> None:
    """The writer's quick paths (integers, label texts kept from the last scrape) write
    what the library writes: the same label sets with new values, integers near the
    float limits, a label set first seen with a bad name."""
    ints = [0, -1, 7, 999_999, 10**6, 1234567, 10**15, -(10**15) + 1, -(10**15), 2**53 + 1, True]
    for round_ in range(3):
        gauge = GaugeMetricFamily("g", "g", labels=["channel", "queue"])
        for i, value in enumerate(ints):
            gauge.add_metric([f"ch{i}", str(i % 3)], value + round_)
        # the same label values under other names: must not reuse the texts
        other = CounterMetricFamily("c", "c", labels=["queue", "channel"])
        other.add_metric(["ch1", "1"], round_)
        metrics = _registry(gauge, other)
        assert exposition(metrics) == generate_latest(metrics)


def test_row_families_read_the_same_both_ways_scrape_after_scrape() -> None:
    """The per-queue families (:class:`Rows`: written from their rows, each label set's
    text kept from the last scrape) against the library reading their samples: hostile
    values, label names not in sorted order, the same label values under other names,
    new values for the same label sets."""
    for round_ in range(3):
        gauge = Rows("depth", "d", "gauge", ("channel", "queue"))
        counter = Rows("sent", "s", "counter", ("queue", "channel"))
        single = Rows("consumers", "c", "gauge", ("channel",))
        for i, text in enumerate(HOSTILE):
            gauge.rows.append(((text, str(i)), i + round_))
            counter.rows.append(((text, str(i)), 10**i * 1.5 + round_))
            single.rows.append(((text,), float("nan") if i == 3 else -i))
        metrics = _registry(gauge, counter, single, Rows("none", "n", "counter", ("x",)))
        assert exposition(metrics) == generate_latest(metrics)
    assert b'sent_total{channel="0",queue="plain"} 3.5' in exposition(metrics)


def test_a_family_it_does_not_write_goes_to_the_library() -> None:
    histogram = HistogramMetricFamily(
        "h", "latency", buckets=[("1.0", 2), ("+Inf", 3)], sum_value=4
    )
    metrics = _registry(GaugeMetricFamily("g", "g", value=1), histogram)
    assert exposition(metrics) == generate_latest(metrics)
    timed = GaugeMetricFamily("t", "t", labels=["x"])
    timed.add_metric(["y"], 1, timestamp=1700000000)
    metrics = _registry(timed)
    assert exposition(metrics) == generate_latest(metrics)


def test_the_hubs_own_registry_reads_the_same_both_ways(
    hub: tuple[Hub, HubEndpoints, Path], zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    the_hub, endpoints, _tmp = hub
    with Client(endpoints.broker, context=zctx, timeout=10).connect() as client:
        for name in ('<b>"orders"</b>', "back\\slash", "ünï"):
            client.create_queue(name, 3, {"Status": "Pull"})
            client.push(name, 3, b"x", ack=True)
    the_hub.status_ttl = 3600.0  # one read for both writers
    metrics = registry(the_hub.files, the_hub.broker, broker_read=the_hub.broker_snapshot)
    assert exposition(metrics) == generate_latest(metrics)
    assert b'channel="<b>\\"orders\\"</b>"' in exposition(metrics)


def test_one_read_of_the_broker_serves_every_reader_within_the_ttl(
    hub: tuple[Hub, HubEndpoints, Path], zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    the_hub, endpoints, _tmp = hub
    the_hub.status_ttl = 3600.0
    first = the_hub.broker_snapshot()
    with Client(endpoints.broker, context=zctx, timeout=10).connect() as client:
        client.create_queue("later", 1, {"Status": "Pull"})
    assert the_hub.status()["broker"] is first  # the console's read: the same one
    assert first["queues"] == 0
    the_hub.status_ttl = 0.0
    assert the_hub.broker_snapshot()["queues"] == 1
