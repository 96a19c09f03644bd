"""The engine raising on a producer's run of pushes (``Server._run_failed``): logged,
counted (``engine_errors``), each push of the run with an id answered FAILED (a batch of
plain pushes: the batch), nothing of it delivered, and the server goes on serving the
frames after it -- the same drain's and the next.

Against a live Server + Engine over inproc, the loop held while the producer sends
(``test_push_runs.Hold``: one drain reads it all, deterministically); the fault is put on
the engine object itself (its ``receive_pushes`` raises on its first call), not on a
stub server.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from broker import tmqp
from broker.client.blocking import Client
from broker.client.frames import join_frame
from broker.engine.engine import Engine
from broker.protocol import Header, MessageType, Outgoing, ResultCode, header
from broker.server.server import Server, ServerOptions
from tests.broker.held_server import Hold
from tests.broker.test_batch import Raw
from tests.broker.test_push_runs import LOADED, PING, QUEUES, _batch_of, push

Ctx = zmq.Context[zmq.Socket[bytes]]

#: What the producer sends after its first frame (a drain's first message goes straight
#: through, the others gather into runs), and the ids that must be answered FAILED.
RUNS = {
    "plain": ([push(f"p{i}", 1, b"x") for i in range(3)], ["p0", "p1", "p2"]),
    "acknowledged": ([push(f"a{i}", 1, b"x", ack=True) for i in range(3)], ["a0", "a1", "a2"]),
    "mixed": (
        [push("p0", 1, b"x"), push("a1", 1, b"x", ack=True), push("p2", 1, b"x"),
         push("a3", 1, b"x", ack=True)],
        ["p0", "a1", "p2", "a3"],
    ),
    "batch of plain pushes": (
        [_batch_of("b", [push(f"e{i}", 1, b"x") for i in range(4)], ack=True)], ["b"],
    ),
}  # fmt: skip


class Served:
    """A server whose engine's ``receive_pushes`` raises on its first call."""

    def __init__(self, zctx: Ctx, monkeypatch: pytest.MonkeyPatch) -> None:
        engine = Engine()
        real = engine.receive_pushes
        #: The message ids of each call that raised.
        self.failed: list[list[str]] = []

        def receive_pushes(
            client_id: str, messages: Any, now: float, refused: Any = None
        ) -> list[Outgoing]:
            if not self.failed:
                self.failed.append([m.message_id for m in messages])
                raise RuntimeError("injected: the engine failed on a run")
            return real(client_id, messages, now, refused)

        monkeypatch.setattr(engine, "receive_pushes", receive_pushes)
        self.server = Server(engine, ServerOptions(endpoint="inproc://run-failed"), context=zctx)
        self.hold = Hold(zctx, self.server)
        self.endpoint = self.server.start()

    def close(self) -> None:
        self.hold.release()
        self.server.stop()
        self.hold.close()


@pytest.fixture
def served(zctx: Ctx, monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    s = Served(zctx, monkeypatch)
    yield s
    s.close()


def peers(zctx: Ctx, endpoint: str) -> tuple[Client, Raw, Raw]:
    """An admin client that made queue ``d`` 1 (push), a raw consumer joined to ``d``
    and a raw producer, their waits as long as a loaded machine needs."""
    admin = Client(endpoint, context=zctx, timeout=LOADED).connect()
    consumer = Raw(zctx, endpoint)
    producer = Raw(zctx, endpoint)
    for peer in (consumer, producer):
        peer.sock.rcvtimeo = int(LOADED * 1000)
    admin.create_queue("d", 1, QUEUES[1])
    consumer.send(tmqp.encode(join_frame("j", "d"))[0])
    assert consumer.frame().message_id == "j"
    return admin, consumer, producer


def _seen(msg: tmqp.Message) -> tuple[str, str, object]:
    """A reply as (kind, message id, result code or Nack-Reason)."""
    if type(msg) is not tmqp.Frame:
        return type(msg).__name__, "", None
    if msg.message_type == MessageType.ACK:
        return "ack", msg.message_id, header(msg, Header.NACK_REASON)
    assert msg.message_type == MessageType.RESPONSE, msg
    return "response", msg.message_id, msg.content_type


@pytest.mark.parametrize("kind", list(RUNS))
def test_the_engine_raising_on_a_run_answers_it_failed_and_serving_goes_on(
    served: Served, zctx: Ctx, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    frames, answered = RUNS[kind]
    admin, consumer, producer = peers(zctx, served.endpoint)
    try:
        served.hold.hold()
        producer.send(PING)  # (the drain's first message: straight through)
        for data in frames:
            producer.send(data)
        producer.send(PING)  # served after the run: the loop goes on
        served.hold.release()
        replies = [_seen(tmqp.decode((producer.sock.recv(),))) for _ in range(len(answered) + 2)]
        failed = [("response", mid, ResultCode.FAILED) for mid in answered]
        assert replies == [("Pong", "", None), *failed, ("Pong", "", None)]
        assert len(served.failed) == 1  # (one engine call: the run)
        if kind != "batch of plain pushes":
            assert served.failed[0] == answered
        # the next drain: served as ever, nothing of the failed run was queued
        producer.send(push("after", 1, b"x", ack=True))
        assert _seen(tmqp.decode((producer.sock.recv(),))) == ("ack", "after", None)
        assert consumer.frame().message_id == "after"
        assert admin.stats()["server"]["engine_errors"] == 1
        logged = [r for r in caplog.records if r.name == "broker.server.server"]
        assert [r.getMessage() for r in logged] == [
            f"engine failed on a run of pushes from {producer.client_id}"
        ]
        assert logged[0].levelno == logging.ERROR and logged[0].exc_info is not None
    finally:
        admin.close()
        consumer.close()
        producer.close()
