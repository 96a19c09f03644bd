"""A forward the far broker refuses for good is dead-lettered, never acknowledged away
(real ``broker serve`` processes): the sending queue's trash keeps it with the reason,
across a ``kill -9`` of the sender, and a resubmit once the far side allows the channel
delivers it once."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import zmq

from broker.cli import main
from broker.federation.core import REFUSED_REASON
from broker.federation.runner import BATCH_REFUSED_REASON
from tests.federation.kit import (
    Broker,
    federation_stats,
    linked_pair,
    stats_or_none,
    wait_interest,
)
from tests.federation.test_links import (  # noqa: F401 (the fixtures brokers, zctx)
    acked_into,
    brokers,
    zctx,
)
from tests.polling import wait_until

Ctx = zmq.Context[zmq.Socket[bytes]]

#: A queue that hands each message to one consumer, kept on disk: the federation client
#: is its only consumer on the sending broker, so a refused forward is nobody's message.
ONE_CONSUMER_PERSISTENT = {
    "Status": "RoundRobin",
    "MessageDeliveryHandler": "persistent",
    "RequestAcknowledge": True,
}


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    out, _err = capsys.readouterr()
    return code, out


@pytest.mark.slow  # five broker starts: ~40 s at load 20, 90-160 s at load 60
@pytest.mark.timeout(600)  # (a hang detector, not a speed bound)
def test_a_forward_refused_for_good_goes_to_the_trash_survives_kill_9_and_resubmits_once(
    brokers: list[Broker],  # noqa: F811 (the fixtures imported above)
    zctx: Ctx,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    a, b = linked_pair(brokers, tmp_path)
    sub = b.client(zctx)
    sub.create_queue("orders", 1, ONE_CONSUMER_PERSISTENT)
    sub.join("orders")
    pub = a.client(zctx)
    pub.create_queue("orders", 1, ONE_CONSUMER_PERSISTENT)
    wait_interest(pub, {"B"}, "orders")  # A's federation client took the channel for B
    b.kill()  # gone without withdrawing its interest: A keeps it
    sub.close(timeout=1.0)
    pub.push("orders", 1, "o-1", ack=True)  # acknowledged: on A's disk, held for B
    # B comes back not allowing the channel any more: the held forward is refused for good
    b.start("--link-accept", "other")
    at = ("--connect", a.endpoint)
    trash = lambda: cli(capsys, "trash", "list", *at, "orders", "1")  # noqa: E731
    assert wait_until(lambda: trash()[1] != "", 60), federation_stats(pub)
    code, listed = trash()
    # the reason: B's own for a single forward; a batch's answer has one code per message
    # (at load 60 the queue's 15 s AcknowledgeTimeout redelivered o-1 to the federation
    # client while B was away, and both deliveries went in one batch)
    single = "channel 'orders' not allowed on this link (status 401)"
    why = single if "status 401" in listed else BATCH_REFUSED_REASON
    assert (code, listed) == (0, f"1\t{REFUSED_REASON}B: {why}\to-1\n")
    stats = federation_stats(pub)
    assert stats["refused_by_peer"] >= 1 and stats["dead_lettered"] >= 1, stats
    assert stats["pending"] == 0, stats
    pub.close()

    a.kill()  # the trash is on disk: back after a kill -9
    a.start(a.link(b))
    assert trash() == (0, listed)

    b.stop()
    b.start()  # the channel allowed again; a consumer on B
    sub = b.client(zctx)
    received = acked_into(sub, "orders")
    pub = a.client(zctx)
    assert wait_until(lambda: stats_or_none(pub) is not None, 60)
    wait_interest(pub, {"B"}, "orders")
    assert cli(capsys, "trash", "resubmit", *at, "orders", "1") == (0, "1\n")
    pub.push("orders", 1, "o-2", ack=True)  # after it: once this is in, so is o-1's one copy
    got = lambda: Counter(bytes(m.payload) for m in received)  # noqa: E731
    assert wait_until(lambda: got()[b"o-2"] >= 1 and got()[b"o-1"] >= 1, 60), (
        got(),
        federation_stats(pub),
    )
    assert got() == Counter({b"o-1": 1, b"o-2": 1})
    assert trash() == (0, "")
    assert wait_until(lambda: int(pub.queue_info("orders", 1)["Acks"]) >= 2, 60)
    assert federation_stats(pub)["dead_lettered"] == 0  # (a new process: counts anew)
    pub.close()
    sub.close()
