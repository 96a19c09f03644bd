"""Durable subscriptions and routers over TMQP on ``broker serve --data DIR`` (real
processes, kill -9): a durable subscription made by a TMQP client (operation 230)
collects a topic channel's messages while its consumer is away, survives kill -9 with
what it holds, is consumed by joining ``/dsub/ID`` and destroyed by operation 231; its
limits (``[limits]``) refuse, never drop; routers and bindings made on the wire come
back after a restart; queue options and statuses changed on the wire too."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq

from broker.client.blocking import Client
from broker.client.errors import RemoteError
from tests.broker.test_durable_ops import Broker
from tests.polling import wait_until

MakeBroker = Callable[..., Broker]


def serve_on_data(tmp: Path, config: str | None = None) -> Broker:
    """``broker serve --data DIR [--config FILE]``, restartable on the same directory."""
    args = ["--data", str(tmp / "data")]
    if config is not None:
        path = tmp / "broker.toml"
        path.write_text(config)
        args += ["--config", str(path)]
    return Broker(*args)


@pytest.fixture
def make(tmp_path: Path) -> Iterator[MakeBroker]:
    made: list[Broker] = []

    def build(config: str | None = None) -> Broker:
        broker = serve_on_data(tmp_path, config).start()
        made.append(broker)
        return broker

    yield build
    for broker in made:
        broker.close()


def drain(client: Client, idle: float = 1.0) -> list[str]:
    got: list[str] = []
    while (m := client.receive(timeout=idle)) is not None:
        got.append(bytes(m.payload).decode())
        client.ack(m)
    return got


def test_tmqp_durable_subscription_survives_kill_9_and_is_destroyed(
    make: MakeBroker, zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    broker = make()
    with broker.client(zctx) as admin:
        admin.create_channel("news", {"Status": "Broadcast"})
        admin.create_durable_subscription("reader", ["news"])
        for i in range(20):
            admin.push("news", 0, f"n{i}", ack=True)
    broker.kill()
    broker.start()
    with broker.client(zctx) as reader:
        listed = reader.durable_subscriptions()
        assert listed == [{"Id": "reader", "Topics": ["news"], "Messages": 20, "Consumers": 0}]
        browsed = reader.browse("/dsub/reader", 0, 0)  # consumes nothing
        assert [bytes(b.message.payload) for b in browsed] == [b"n%d" % i for i in range(20)]
        reader.join("/dsub/reader")
        assert drain(reader) == [f"n{i}" for i in range(20)]
        reader.push("news", 0, "after restart", ack=True)  # still attached to the topic
        assert drain(reader) == ["after restart"]
        reader.destroy_durable_subscription("reader")
        assert reader.durable_subscriptions() == []
        with pytest.raises(RemoteError) as err:
            reader.destroy_durable_subscription("reader")
        assert err.value.code == 404
    broker.kill()
    broker.start()
    with broker.client(zctx) as admin:
        assert admin.durable_subscriptions() == []
        assert "/dsub/reader" not in [c["Name"] for c in admin.channels()]


def test_unacknowledged_durable_messages_come_back_after_kill_9(
    make: MakeBroker, zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    broker = make()
    with broker.client(zctx) as admin:
        admin.create_durable_subscription("d", ["t"])
        for i in range(5):
            admin.push("t", 0, f"m{i}", ack=True)
        admin.join("/dsub/d")
        first = admin.receive(timeout=10)
        assert first is not None and bytes(first.payload) == b"m0"
        admin.ack(first)
        taken = admin.receive(timeout=10)  # delivered, never acknowledged
        assert taken is not None and bytes(taken.payload) == b"m1"
        admin.queue_info("/dsub/d", 0)  # a round trip: the ack of m0 reached the broker
    broker.kill()
    broker.start()
    with broker.client(zctx) as again:
        again.join("/dsub/d")
        got = drain(again)
    # every unacknowledged one is back, in order; the acknowledged m0 is gone -- unless
    # its removal had not reached the disk yet (a removal is not waited for: a late one
    # costs a redelivery, never a loss), then it comes back first
    assert got in (["m1", "m2", "m3", "m4"], ["m0", "m1", "m2", "m3", "m4"])


LIMITS = "[limits]\nmax_durable_subscriptions = 2\nmax_durable_subscription_messages = 3\n"


def test_limits_refuse_and_lose_nothing(
    make: MakeBroker, zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    """A full durable subscription refuses the topic's push (482) before any copy is made,
    so nothing the producer was told was taken is dropped; one subscription beyond the
    broker's maximum is refused (482)."""
    broker = make(LIMITS)
    with broker.client(zctx) as admin:
        admin.create_channel("t", {"Status": "Broadcast"})
        admin.create_durable_subscription("full", ["t"])
        admin.create_durable_subscription("roomy", ["t"])
        with pytest.raises(RemoteError) as err:
            admin.create_durable_subscription("third", ["t"])
        assert err.value.code == 482
        for i in range(3):
            admin.push("t", 0, f"m{i}", ack=True)
        with pytest.raises(RemoteError) as err:
            admin.push("t", 0, "refused", ack=True)
        assert err.value.code == 482
        admin.join("/dsub/roomy")  # the other subscription has no copy of it either
        assert drain(admin) == ["m0", "m1", "m2"]
        with pytest.raises(RemoteError):
            admin.push("t", 0, "still refused", ack=True)  # "full" still holds 3
    broker.kill()
    broker.start()
    with broker.client(zctx) as reader:
        reader.join("/dsub/full")
        assert drain(reader) == ["m0", "m1", "m2"]
        reader.push("t", 0, "room again", ack=True)
        assert drain(reader) == ["room again"]


@pytest.mark.parametrize(
    ("sub_id", "payload_topics", "code"),
    [
        ("bad id", ["t"], 400),  # a space: not a channel name
        ("ok", [], 400),  # no topic
        ("ok", ["/dsub/other"], 400),  # a durable subscription is not a topic
        ("", ["t"], 400),
    ],
)
def test_bad_durable_subscription_requests_are_400_and_the_broker_serves_on(
    make: MakeBroker,
    zctx: zmq.Context[zmq.Socket[bytes]],
    sub_id: str,
    payload_topics: list[str],
    code: int,
) -> None:
    broker = make()
    with broker.client(zctx) as client:
        with pytest.raises(RemoteError) as err:
            client.create_durable_subscription(sub_id, payload_topics)
        assert err.value.code == code
        assert client.durable_subscriptions() == []
        client.create_durable_subscription("fine", ["t"])
        client.push("t", 0, "x", ack=True)
        client.join("/dsub/fine")
        assert drain(client) == ["x"]


def test_routers_bindings_and_queue_status_survive_kill_9(
    make: MakeBroker, zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    broker = make()
    with broker.client(zctx) as admin:
        admin.create_queue("orders", 1, {"Status": "Push", "Tag": "t1"})
        admin.update_queue("orders", 1, {"Status": "RoundRobin"})
        admin.create_router("fan", {"Method": "RoundRobin"})
        admin.add_binding("fan", {"Name": "b1", "Target": "orders", "Queue": 1, "Priority": 5})
        admin.add_binding("fan", {"Name": "b2", "Target": "audit", "Queue": 0})
        admin.remove_binding("fan", "b2")
        admin.create_router("gone")
        admin.remove_router("gone")
    broker.kill()
    broker.start()
    with broker.client(zctx) as admin:
        routers = admin.routers()
        assert [r["Name"] for r in routers] == ["fan"]
        assert routers[0]["Method"] == "RoundRobin"
        assert [b["Name"] for b in routers[0]["Bindings"]] == ["b1"]
        assert routers[0]["Bindings"][0]["Priority"] == 5
        info = admin.queue_info("orders", 1)
        assert info["Status"] in ("RoundRobin", 2) and info["Tag"] == "t1"


PUT_BACK = {
    "MessageDeliveryHandler": "persistent",
    "RequestAcknowledge": True,
    "PutBackLimit": 1,
    "PutBackDelay": 600_000,  # ten minutes: the put-back waits, delayed, when killed
}


def test_a_put_back_is_durable_before_anyone_can_see_it_kill_9_right_after(
    make: MakeBroker, zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    """A nack's put-back (one more put-back) is written and synced before the broker
    answers anything after it: killed right after, the restarted queue still counts it,
    so the next nack passes PutBackLimit 1 and trashes the message.  (It used to reach the
    log only with the next delivery: the restart forgot it and delivered a third time.)"""
    broker = make()
    with broker.client(zctx) as client:
        client.create_queue("work", 1, PUT_BACK)
        client.push("work", 1, "job", ack=True, message_id="j1")
        client.join("work")
        first = client.receive(timeout=10)
        assert first is not None and first.id == "j1"
        client.nack(first)
        client.queue_info("work", 1)  # answered after the nack, once it is durable
    broker.kill()
    broker.start()
    with broker.client(zctx) as client:
        client.join("work")
        again = client.receive(timeout=10)
        assert again is not None and again.id == "j1"
        assert dict(again.headers).get("Delivery-Count") == "2"
        client.nack(again)  # the second put-back: past the limit of 1
        trashed = client.trash_list("work", 1)
        assert [t.message.message_id for t in trashed] == ["j1"]
        assert dict(trashed[0].message.headers)["Trash-Reason"] == "put-back-limit"
        assert client.receive(timeout=0.5) is None


TRASHING = {
    "MessageDeliveryHandler": "persistent",
    "RequestAcknowledge": True,
    "PutBackLimit": 1,
}


def test_the_trash_of_a_persistent_queue_survives_kill_9_resubmit_and_purge_after(
    make: MakeBroker, zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    broker = make()
    with broker.client(zctx) as client:
        client.create_queue("jobs", 1, TRASHING)
        for i in range(3):
            client.push("jobs", 1, f"j{i}", ack=True, message_id=f"j{i}")
        client.join("jobs")

        def all_trashed() -> bool:
            while (m := client.receive(timeout=0)) is not None:
                client.nack(m)  # twice each: past PutBackLimit 1, to the trash
            return len(client.trash_list("jobs", 1)) == 3

        assert wait_until(all_trashed)
    broker.kill()
    broker.start()
    with broker.client(zctx) as client:
        trashed = client.trash_list("jobs", 1)
        assert [t.message.message_id for t in trashed] == ["j0", "j1", "j2"]
        reasons = {dict(t.message.headers)["Trash-Reason"] for t in trashed}
        assert reasons == {"put-back-limit"}
        assert client.queue_info("jobs", 1)["Messages"] == 0  # not back in the queue
        assert client.trash_resubmit("jobs", 1, [trashed[0].sequence]) == 1
    broker.kill()  # the resubmitted message is a saved message of the queue now
    broker.start()
    with broker.client(zctx) as client:
        assert [t.message.message_id for t in client.trash_list("jobs", 1)] == ["j1", "j2"]
        client.join("jobs")
        back = client.receive(timeout=10)
        assert back is not None and bytes(back.payload) == b"j0"
        client.ack(back)
        assert client.trash_purge("jobs", 1) == 2
        client.queue_info("jobs", 1)  # a round trip: the acknowledge was taken
    broker.kill()
    broker.start()
    with broker.client(zctx) as client:
        assert client.trash_list("jobs", 1) == []
        client.join("jobs")
        assert client.receive(timeout=1.0) is None
