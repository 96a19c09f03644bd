"""The server's durability gate: engine output leaves only once its store writes are durable."""

from __future__ import annotations

import select
from pathlib import Path
from typing import Any

from broker.engine.delivery import PersistentDeliveryHandler
from broker.engine.engine import Engine
from broker.engine.options import ChannelQueueOptions
from broker.message import Message
from broker.protocol import ConnectionInfo, MessageType
from broker.server.gate import OutputGate
from broker.store.durable import DurableStore
from broker.store.log import LogStore
from broker.tmqp import Frame


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

    # a drain's held appends (``Store.hold``): the test says how many are kept back
    def hold(self) -> None:
        self.holds += 1

    def release(self) -> None:
        self.holds -= 1
        if not self.holds and self.unwritten:
            self.appended += 1  # the held appends go to the log as one group
            self.unwritten = 0

    holds = 0
    unwritten = 0
    failed = False


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


def test_a_drain_tags_what_waited_for_its_held_appends_with_their_ticket() -> None:
    """Outputs admitted after an append the store holds back cannot know their ticket:
    they wait (and everything after them) for the drain's end, which tags them with the
    group's; before that, nothing held back, outputs go as usual."""
    store = Tickets()
    sent: list[Any] = []
    gate = OutputGate(store, sent.append)
    gate.begin()
    assert store.holds == 1
    gate.admit(["pong-like"])  # nothing held back: at once
    store.unwritten = 2  # two saves held back
    gate.admit([("p1", "ack 1")])
    store.unwritten = 0  # (another store call wrote them: the order still holds)
    gate.admit([("p2", "plain")])
    gate.call(lambda: sent.append("receipt"))
    gate.forget("p2")
    assert sent == [["pong-like"]] and gate.held == 3
    store.unwritten = 1
    gate.end()
    assert store.holds == 0 and store.appended == 1
    assert sent == [["pong-like"]] and gate.held == 3  # the group's ticket is pending
    store.completed = 1
    gate.release()
    assert sent == [["pong-like"], [("p1", "ack 1")], [], "receipt"] and gate.held == 0
    gate.begin()
    gate.admit(["nothing held"])
    gate.end()
    assert sent[-1] == ["nothing held"]


def _push(producer: str, k: int) -> Frame:
    return Frame(message_type=MessageType.QUEUE, content_type=1, target="orders",
                 pending_ack=True, message_id=f"m{k}", source=producer,
                 payload=b"%04d" % k)  # fmt: skip


def _orders(store: DurableStore) -> Engine:
    engine = Engine(store=store, handlers={"persistent": PersistentDeliveryHandler()})
    engine.create_channel("orders")
    engine.create_queue("orders", 1, ChannelQueueOptions(message_delivery_handler="persistent"))
    return engine


def test_single_pushes_of_one_drain_share_one_write_and_acks_leave_after_it(
    tmp_path: Path,
) -> None:
    """Eight producers' single acknowledged pushes in one drain (real log, fsync): one
    group, one ticket; no acknowledge before that ticket completed; all saved in order."""
    with LogStore(tmp_path) as log:
        store = DurableStore(log)
        engine = _orders(store)
        producers = [engine.connect(ConnectionInfo(client_id=f"p{i}"), now=0.0)[0]
                     for i in range(8)]  # fmt: skip
        engine.receive("p0", _push("p0", 0), 0.0)  # (the queue's first record)
        log.flush()
        sent: list[tuple[int, Any]] = []
        gate = OutputGate(store, lambda outs: sent.extend((log.completed, o) for o in outs))
        before = store.appended
        gate.begin()
        for k, producer in enumerate(producers * 2, start=1):
            gate.admit(engine.receive(producer, _push(producer, k), 0.0))
        assert sent == [] and store.appended == before  # held back, nothing out yet
        gate.end()
        assert store.appended == before + 1  # the drain's 16 saves: one write, one ticket
        while gate.held:
            select.select([gate.fileno()], [], [], 5.0)
            gate.release()
        acks = sorted(out.frame.message_id for _, out in sent if not out.frame.headers)
        assert acks == sorted(f"m{k}" for k in range(1, 17)) and len(sent) == 16
        assert all(done >= before + 1 for done, _ in sent)
        kept = [s.message.payload for s in store.iterate(("orders", 1))]
        assert kept == [b"%04d" % k for k in range(17)]


def test_a_log_that_fails_under_a_drain_acknowledges_nothing_unsaved(tmp_path: Path) -> None:
    """The log takes the drain's first pushes (checked, held), then closes (a writer that
    failed): the later pushes are refused at once, and the held ones' acknowledges never
    leave -- nor anything after them; a restart finds none of them."""
    log = LogStore(tmp_path)
    store = DurableStore(log)
    engine = _orders(store)
    producers = [engine.connect(ConnectionInfo(client_id=f"p{i}"), now=0.0)[0]
                 for i in range(4)]  # fmt: skip
    sent: list[Any] = []
    gate = OutputGate(store, sent.extend)
    gate.begin()
    for k, producer in enumerate(producers):
        gate.admit(engine.receive(producer, _push(producer, k), 0.0))
    log.close()
    for k, producer in enumerate(producers, start=4):
        gate.admit(engine.receive(producer, _push(producer, k), 0.0))
    gate.end()
    # never: the held group was not written, and the refusals wait behind it
    assert store.appended > store.completed and sent == [] and gate.held == 8
    with LogStore(tmp_path) as again:
        assert list(DurableStore(again).iterate(("orders", 1))) == []
