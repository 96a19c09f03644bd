"""The server's durability gate: engine output leaves only once its store writes are durable."""

from __future__ import annotations

import select
from pathlib import Path
from typing import Any

from broker.engine.delivery import PersistentDeliveryHandler
from broker.engine.engine import Engine
from broker.engine.options import ChannelQueueOptions
from broker.message import Message
from broker.protocol import ConnectionInfo
from broker.server.gate import OutputGate
from broker.store.durable import DurableStore
from broker.store.log import LogStore


class Tickets:
    """A store whose completion the test decides (the gate's logic alone)."""

    def __init__(self) -> None:
        self.appended = 0
        self.completed = 0
        self.flushed = 0

    def fileno(self) -> int:
        return -1

    def drain(self) -> int:
        return self.completed

    def flush(self) -> None:
        self.flushed += 1
        self.completed = self.appended


def test_output_waits_for_its_ticket_and_nothing_overtakes_it() -> None:
    store = Tickets()
    sent: list[list[Any]] = []
    gate = OutputGate(store, sent.append)
    gate.admit(["before"])  # nothing pending: sent at once
    assert sent == [["before"]]
    store.appended = 3
    gate.admit(["ack 3"])
    gate.admit(["reply"])  # no write of its own, but after the held one
    assert sent == [["before"]] and gate.held == 2
    store.completed = 2
    gate.release()
    assert sent == [["before"]]
    store.completed = 3
    gate.release()
    assert sent == [["before"], ["ack 3"], ["reply"]] and gate.held == 0
    store.appended = 4
    gate.admit(["ack 4"])
    gate.release_all()  # the server stops: flush, then send
    assert store.flushed == 1 and sent[-1] == ["ack 4"]


def test_a_gone_client_gets_nothing_held_for_it() -> None:
    store = Tickets()
    sent: list[list[Any]] = []
    gate = OutputGate(store, sent.append)
    store.appended = 1
    gate.admit([("old", "delivery"), ("other", "ack")])
    gate.admit([("old", "reply")])
    gate.forget("old")  # its session ended; a new one may take the id
    store.completed = 1
    gate.release()
    assert sent == [[("other", "ack")], []]


def test_completed_before_the_next_output_needs_no_poll() -> None:
    store = Tickets()
    sent: list[list[Any]] = []
    gate = OutputGate(store, sent.append)
    store.appended = 1
    gate.admit(["a"])
    store.completed = 1  # completed, but the loop has not seen the fd yet
    gate.admit(["b"])
    assert sent == [["a"], ["b"]] and gate.held == 0


def test_producer_ack_leaves_only_after_fsync(tmp_path: Path) -> None:
    """A real log in fsync mode: the acknowledge is in the same engine output as the save
    (so the gate is needed), and the gate sends it only once the ticket completed."""
    with LogStore(tmp_path) as log:
        store = DurableStore(log)
        engine = Engine(store=store, handlers={"persistent": PersistentDeliveryHandler()})
        engine.create_channel("orders")
        engine.create_queue(
            "orders", 1, ChannelQueueOptions(message_delivery_handler="persistent")
        )
        producer, _ = engine.connect(ConnectionInfo(client_id="p"), now=0.0)
        sent_when: list[tuple[int, int]] = []
        ticket_of: dict[int, int] = {}  # id of an output -> the ticket of its save

        def send(outs: list[Any]) -> None:
            sent_when.append((ticket_of[id(outs)], log.completed))

        gate = OutputGate(store, send)
        for i in range(20):
            m = Message(target="orders", content_type=1, message_id=f"m{i}", wants_ack=True)
            outs = engine.publish(producer, m, now=0.0)
            assert any(o.client_id == producer for o in outs)  # the ack, at once
            ticket_of[id(outs)] = store.appended
            gate.admit(outs)
        while gate.held:
            select.select([gate.fileno()], [], [], 5.0)
            gate.release()
        assert len(sent_when) == 20
        assert all(done >= ticket for ticket, done in sent_when)


def test_a_call_runs_in_order_once_its_writes_are_durable() -> None:
    """``call`` (another door's receipt or delivery) waits like output does, in order."""
    store = Tickets()
    sent: list[Any] = []
    gate = OutputGate(store, sent.append)
    gate.call(lambda: sent.append("at once"))  # nothing pending
    assert sent == ["at once"]
    store.appended = 2
    gate.admit(["ack 2"])
    gate.call(lambda: sent.append("receipt"))
    gate.forget("anyone")  # calls are not a client's output: kept
    assert sent == ["at once"] and gate.held == 2
    store.completed = 2
    gate.release()
    assert sent == ["at once", ["ack 2"], "receipt"] and gate.held == 0
