"""Reading by sequence against ``broker serve`` processes: sequence numbers survive kill -9
and restart with ``--data``; ``broker browse`` prints one line per message."""

from __future__ import annotations

import json

import pytest
import zmq

import broker
from broker.cli import main
from broker.client.blocking import Client
from tests.broker.test_durable_serve import Broker
from tests.polling import wait_until

Ctx = zmq.Context[zmq.Socket[bytes]]
PERSISTENT_LOG = {
    "MessageDeliveryHandler": "persistent",
    "RequestAcknowledge": True,
    "Status": "Pull",
    "AllowRelease": True,
}


def client(b: Broker, zctx: Ctx) -> Client:
    return Client(b.endpoint, context=zctx, timeout=10).connect()


def test_bounds_and_browse_survive_kill_9(served: Broker, zctx: Ctx) -> None:
    with client(served, zctx) as c:
        c.create_queue("log", 1, PERSISTENT_LOG)
        for i in range(20):
            c.push("log", 1, f"p{i}", ack=True)  # acknowledged: saved and synced
        assert c.queue_bounds("log", 1) == broker.SequenceBounds(1, 20)
        assert c.release("log", 1, 5) == 5
        assert c.queue_bounds("log", 1) == broker.SequenceBounds(6, 20)
    served.kill()
    served.start()
    with client(served, zctx) as c:
        assert c.queue_bounds("log", 1) == broker.SequenceBounds(6, 20)
        got = c.browse("log", 1, 0)
        assert [b.sequence for b in got] == list(range(6, 21))
        assert [bytes(b.message.payload) for b in got] == [f"p{i}".encode() for i in range(5, 20)]
        assert [b.sequence for b in c.browse("log", 1, 18)] == [18, 19, 20]
        # numbering goes on after the restart, gap-free
        c.push("log", 1, "p20", ack=True)
        assert c.queue_bounds("log", 1) == broker.SequenceBounds(6, 21)
        assert c.browse("log", 1, 21)[0].message.payload == b"p20"


def test_sequence_goes_on_after_a_restart_with_the_queue_emptied(
    served: Broker, zctx: Ctx
) -> None:
    with client(served, zctx) as c:
        c.create_queue("log", 2, PERSISTENT_LOG)
        for i in range(7):
            c.push("log", 2, f"e{i}", ack=True)
        assert c.release("log", 2, 7) == 7
        assert c.queue_bounds("log", 2) == broker.SequenceBounds(8, 7)
    served.kill()
    served.start()
    with client(served, zctx) as c:
        assert c.queue_bounds("log", 2) == broker.SequenceBounds(8, 7)
        c.push("log", 2, "next", ack=True)
        got = c.browse("log", 2, 0)
        assert [(b.sequence, bytes(b.message.payload)) for b in got] == [(8, b"next")]


def test_browse_cli(served: Broker, zctx: Ctx, capsys: pytest.CaptureFixture[str]) -> None:
    with client(served, zctx) as c:
        c.create_queue("cli", 1, {"Status": "Pull"})
        for payload in ("one", "two", "three\nlines", "four"):
            c.push("cli", 1, payload, ack=True)
    at = ("--connect", served.endpoint)

    def run(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    code, out, _ = run("browse", *at, "cli", "1", "--from-seq", "2", "--limit", "2")
    assert code == 0
    assert out == "2\ttwo\n3\thex:" + b"three\nlines".hex() + "\n"
    code, out, _ = run("browse", *at, "cli", "1", "--json")
    assert code == 0
    records = [json.loads(line) for line in out.splitlines()]
    assert [r["sequence"] for r in records] == [1, 2, 3, 4]
    assert records[3]["payload"] == "four"
    code, out, _ = run("browse", *at, "cli", "1", "--from-seq", "-1")
    assert code == 0 and out == ""
    # bad input: one line on stderr, documented exit codes
    code, out, err = run("browse", *at, "cli", "1", "--from-seq", "-5")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    code, out, err = run("browse", *at, "cli", "1", "--limit", "0")
    assert code == 2 and len(err.strip().splitlines()) == 1
    code, out, err = run("browse", *at, "nope", "1")
    assert code == 1 and "404" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(SystemExit) as exit_:
        main(["browse", *at, "cli", "x"])  # argparse: not a queue id
    assert exit_.value.code == 2
    capsys.readouterr()
    # the broker still serves
    with client(served, zctx) as c:
        assert len(c.browse("cli", 1, 0)) == 4


def test_numbers_of_a_queue_whose_first_messages_were_not_saved(served: Broker, zctx: Ctx) -> None:
    """The log numbers only what it saved; the engine's numbers come back all the same."""
    with client(served, zctx) as c:
        c.create_queue("mixed", 1, {"Status": "Pull"})  # memory only
        for i in range(3):
            c.push("mixed", 1, f"gone{i}", ack=True)
        c.update_queue("mixed", 1, {"MessageDeliveryHandler": "persistent"})
        for i in range(2):
            c.push("mixed", 1, f"kept{i}", ack=True)
        assert [b.sequence for b in c.browse("mixed", 1, 0)] == [1, 2, 3, 4, 5]
    served.kill()
    served.start()
    with client(served, zctx) as c:
        got = c.browse("mixed", 1, 0)
        assert [(b.sequence, bytes(b.message.payload)) for b in got] == [
            (4, b"kept0"),
            (5, b"kept1"),
        ]
        assert c.queue_bounds("mixed", 1) == broker.SequenceBounds(4, 5)


@pytest.mark.slow
def test_retained_messages_of_a_persistent_queue_survive_kill_9(served: Broker, zctx: Ctx) -> None:
    options = {**PERSISTENT_LOG, "Status": "Push", "Retain": True}
    with client(served, zctx) as producer, client(served, zctx) as consumer:
        producer.create_queue("events", 1, options)
        consumer.join("events")
        for i in range(6):
            producer.push("events", 1, f"v{i}")
        for _ in range(6):
            m = consumer.receive(timeout=10)
            assert m is not None
            consumer.ack(m)
        assert wait_until(lambda: len(producer.browse("events", 1, 0)) == 6)
        # the consumer's acknowledges are in; the retained copies are written before a
        # reply that depends on a later write (the push acknowledged below) goes out
        producer.push("events", 1, "v6", ack=False)
        m = consumer.receive(timeout=10)
        assert m is not None
        consumer.ack(m)
        assert wait_until(lambda: len(producer.browse("events", 1, 0)) == 7)
        producer.create_channel("barrier")  # a definition write: durable before its ack
    served.kill()
    served.start()
    with client(served, zctx) as c:
        got = c.browse("events", 1, 0)
        assert [(b.sequence, bytes(b.message.payload)) for b in got] == [
            (i + 1, f"v{i}".encode()) for i in range(7)
        ]
        assert c.queue_bounds("events", 1) == broker.SequenceBounds(1, 7)
        assert c.release("events", 1, 4) == 4
        c.create_channel("barrier-2")
    served.kill()
    served.start()
    with client(served, zctx) as c:
        assert [b.sequence for b in c.browse("events", 1, 0)] == [5, 6, 7]
        assert c.queue_bounds("events", 1) == broker.SequenceBounds(5, 7)
        c.update_queue("events", 1, {"RetainLimit": 2})
    served.stop()
    served.start()
    with client(served, zctx) as c:
        assert [b.sequence for b in c.browse("events", 1, 0)] == [6, 7]
