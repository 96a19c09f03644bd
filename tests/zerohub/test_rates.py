"""Per-queue rates: computed from the queues' counters at each status read (a clock under
test control, values worked out by hand), shown in the console's JSON and exported as
Prometheus counters after real broker traffic."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import zmq

from broker.client.blocking import Client
from tests.polling import wait_until
from tests.zerohub.test_watch import get, scrape, value
from zerohub.hub import Hub, HubEndpoints
from zerohub.rates import QueueRates


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def entry(received: int, sent: int, channel: str = "c", queue: int = 1) -> dict[str, Any]:
    return {"channel": channel, "queue": queue, "received": received, "sent": sent}


def test_rates_are_counter_differences_over_time() -> None:
    clock = Clock()
    rates = QueueRates(history=3, min_interval=0.5, clock=clock)
    first = [entry(100, 40)]
    rates.update(first)
    assert (first[0]["in_rate"], first[0]["out_rate"], first[0]["history"]) == (0.0, 0.0, [])

    clock.now += 2.0
    second = [entry(300, 50)]
    rates.update(second)
    assert (second[0]["in_rate"], second[0]["out_rate"]) == (100.0, 5.0)  # 200/2 s, 10/2 s

    clock.now += 0.1  # a second reader soon after: the last rates, no new sample
    third = [entry(310, 50)]
    rates.update(third)
    assert (third[0]["in_rate"], third[0]["history"]) == (100.0, [[100.0, 5.0]])

    for step in range(3):
        clock.now += 1.0
        later = [entry(310 + 10 * (step + 1), 50)]
        rates.update(later)
    # from the last sample (300): 320 over 1.1 s (none was taken at +0.1 s), then 10/s twice
    assert later[0]["history"] == [[18.18, 0.0], [10.0, 0.0], [10.0, 0.0]]  # 3 kept


def test_a_recreated_queue_starts_again_and_a_gone_one_is_forgotten() -> None:
    clock = Clock()
    rates = QueueRates(clock=clock)
    rates.update([entry(50, 50), entry(7, 0, queue=2)])
    clock.now += 1.0
    rates.update([entry(60, 55), entry(9, 0, queue=2)])
    clock.now += 1.0
    again = [entry(3, 0)]  # queue 1 deleted and created again; queue 2 gone
    rates.update(again)
    assert (again[0]["in_rate"], again[0]["out_rate"], again[0]["history"]) == (0.0, 0.0, [])
    clock.now += 1.0
    back = [entry(9, 0, queue=2)]
    rates.update(back)
    assert back[0]["history"] == []  # forgotten: a first sample again


def test_histories_for_the_first_queues_listed_only() -> None:
    clock = Clock()
    rates = QueueRates(charts=2, clock=clock)
    rates.update([entry(0, 0, queue=q) for q in range(4)])
    clock.now += 1.0
    listed = [entry(q, 0, queue=q) for q in range(4)]
    rates.update(listed)
    assert [q["in_rate"] for q in listed] == [0.0, 1.0, 2.0, 3.0]
    assert [q["history"] for q in listed] == [[[0.0, 0.0]], [[1.0, 0.0]], [], []]


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError):
        QueueRates(history=0)
    with pytest.raises(ValueError):
        QueueRates(min_interval=0)
    with pytest.raises(ValueError):
        QueueRates(charts=-1)


def test_rates_in_the_console_and_counters_in_prometheus(
    hub: tuple[Hub, HubEndpoints, Path], zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    the_hub, endpoints, _tmp = hub
    clock = Clock()
    the_hub.rates.clock = clock  # the hub's sampling clock, under the test's control
    the_hub.status_ttl = 0.0  # every read reads the engine again
    console = endpoints.http["console"]

    def queue_entry() -> dict[str, Any]:
        data = json.loads(get(console + "/api/status")[2])
        (found,) = [q for q in data["broker"]["queue_list"] if q["channel"] == "flow"]
        return dict(found)

    with Client(endpoints.broker, context=zctx, timeout=10).connect() as client:
        client.create_queue("flow", 1, {"Status": "Pull"})
        client.join("flow")
        assert queue_entry()["in_rate"] == 0.0
        for i in range(30):
            client.push("flow", 1, b"m%d" % i, ack=True)
        pulled = client.pull("flow", 1, count=10)
        assert len(pulled) == 10
        clock.now += 2.0
        seen = queue_entry()
        assert (seen["received"], seen["sent"]) == (30, 10)
        assert (seen["in_rate"], seen["out_rate"]) == (15.0, 5.0)  # 30 and 10 over 2 s
        assert seen["history"] == [[15.0, 5.0]]

        samples = scrape(endpoints.http["metrics"])
        labels = {"channel": "flow", "queue": "1"}
        assert value(samples, "zerohub_broker_queue_published_total", **labels) == 30
        assert value(samples, "zerohub_broker_queue_delivered_total", **labels) == 10
        assert wait_until(lambda: queue_entry()["sent"] == 10)
