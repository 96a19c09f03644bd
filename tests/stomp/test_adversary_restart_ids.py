"""The adversary's review (session 22, adv22): the STOMP door's message ids after a
restart.  ``broker serve --data DIR --stomp`` is killed (-9) holding persistent messages;
restarted on the same store, it delivers them to an ``ack:auto`` consumer that does not
read (the listener holds what its connection has no room for: those stay in flight),
while a producer -- the new process's first connection, as the old one's was -- sends
as many new messages.  Before session 22 the door's ids were ``stomp-<conn>-<n>``,
both counting from 1 in each process: the new messages took the restored ones' ids,
went out as AUTO deliveries (``broker.engine.flow``) beside the restored ones in flight
with the same ids, and a consumer saw one ``message-id`` twice; one that went away
mid-flight left restored messages stuck in flight (the tracker's entry for an id
overwritten).  Every id must be new, and nothing may stay stuck."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from broker.client.blocking import Client
from broker.stomp.frames import Command, Frame
from tests.broker.test_cli import start_serve
from tests.polling import WAIT, wait_until
from tests.ports import free_port
from tests.stomp.test_listener import Raw

QUEUE = "restored"
RESTORED = 48  # persistent messages the killed broker holds
BIG = 128 * 1024  # octets each: more than the listener's 1 MiB and the kernel's buffers
NEW = RESTORED  # new SENDs after the restart: their ids count up to the restored ones'


class Durable:
    """``broker serve --data DIR --stomp`` with a known TMQP endpoint (for queue_info)."""

    def __init__(self, tmp: Path) -> None:
        self.data = tmp / "data"
        self.port = free_port()
        self.tmqp = free_port()
        self.proc = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        return start_serve(
            "--bind",
            f"tcp://127.0.0.1:{self.tmqp}",
            "--stomp",
            f"tcp://127.0.0.1:{self.port}",
            "--data",
            str(self.data),
        )

    def kill9(self) -> None:
        self.proc.kill()
        self.proc.wait(WAIT)
        self._close_pipes()

    def restart(self) -> None:
        self.proc = self._start()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(WAIT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(WAIT)
        self._close_pipes()

    def _close_pipes(self) -> None:
        if self.proc.stderr is not None:
            self.proc.stderr.close()


@pytest.fixture
def durable(tmp_path: Path) -> Iterator[Durable]:
    server = Durable(tmp_path)
    yield server
    server.stop()


@pytest.fixture
def admin(durable: Durable, zctx: zmq.Context[zmq.Socket[bytes]]) -> Iterator[Client]:
    client = Client(f"tcp://127.0.0.1:{durable.tmqp}", context=zctx, timeout=10.0)
    yield client
    client.close()


def _big(i: int) -> bytes:
    return b"old-%04d-" % i + b"." * (BIG - 9)


def _small(i: int) -> bytes:
    return b"new-%04d" % i


def _raws(made: list[Raw], port: int, rcvbuf: int | None = None) -> Raw:
    raw = Raw(port, rcvbuf=rcvbuf)
    made.append(raw)
    raw.connect()
    return raw


def _send_all(producer: Raw, bodies: list[bytes], persistent: bool) -> None:
    """Each body a SEND to the queue, the last one asking for a receipt (read here)."""
    flag = "persistent:true\n" if persistent else ""
    parts = []
    for i, body in enumerate(bodies):
        receipt = "receipt:sent\n" if i == len(bodies) - 1 else ""
        head = f"SEND\ndestination:/queue/{QUEUE}\n{flag}{receipt}content-length:{len(body)}\n\n"
        parts.append(head.encode() + body + b"\x00")
    producer.send(b"".join(parts))
    frame = producer.next()
    assert frame.command is Command.RECEIPT, frame
    assert frame.header("receipt-id") == "sent"


def _info(admin: Client) -> dict[str, Any]:
    info: dict[str, Any] = admin.queue_info(QUEUE, 0)
    return info


def _figures(admin: Client) -> dict[str, Any]:
    """The queue's counts a failure shows."""
    info = _info(admin)
    return {k: info[k] for k in ("Messages", "InFlight", "PendingAcknowledges", "Acks")}


def _restored_in_flight(durable: Durable, admin: Client, made: list[Raw]) -> tuple[Raw, Raw]:
    """The killed broker's ``RESTORED`` persistent messages, restarted: the new process's
    first connection (the producer, as in the old one) and an ``ack:auto`` consumer that
    does not read, every restored message handed to it and some still in flight."""
    producer = _raws(made, durable.port)
    _send_all(producer, [_big(i) for i in range(RESTORED)], persistent=True)
    producer.close()
    durable.kill9()
    durable.restart()
    admin.connect()
    producer = _raws(made, durable.port)  # connection 1 again
    consumer = _raws(made, durable.port, rcvbuf=4096)
    consumer.send(f"SUBSCRIBE\nid:s\ndestination:/queue/{QUEUE}\nack:auto\n\n\x00".encode())

    def handed() -> bool:
        info = _info(admin)
        return bool(info["Messages"] == 0 and info["Acks"] + info["InFlight"] == RESTORED)

    assert wait_until(handed), _figures(admin)
    assert _info(admin)["InFlight"] > 0, _figures(admin)  # (held by the listener: not taken)
    return producer, consumer


def _read(raw: Raw, count: int) -> list[Frame]:
    frames = [raw.next() for _ in range(count)]
    assert all(f.command is Command.MESSAGE for f in frames), frames
    return frames


def _settled(admin: Client) -> bool:
    info = _info(admin)
    return bool(
        info["Messages"] == 0 and info["InFlight"] == 0 and info["PendingAcknowledges"] == 0
    )


def test_new_ids_after_a_restart_never_repeat_restored_ones(
    durable: Durable, admin: Client
) -> None:
    """The consumer reads at last: every message once, each with its own message-id."""
    made: list[Raw] = []
    try:
        producer, consumer = _restored_in_flight(durable, admin, made)
        _send_all(producer, [_small(i) for i in range(NEW)], persistent=False)
        frames = _read(consumer, RESTORED + NEW)
        bodies = [f.body for f in frames]
        assert sorted(bodies) == sorted(
            [_big(i) for i in range(RESTORED)] + [_small(i) for i in range(NEW)]
        )
        ids = [f.header("message-id") for f in frames]
        assert len(set(ids)) == len(ids), "one message-id on two messages"
        assert wait_until(lambda: _settled(admin)), _figures(admin)
    finally:
        for raw in made:
            raw.close()


def test_a_consumer_gone_mid_flight_after_a_restart_leaves_nothing_stuck(
    durable: Durable, admin: Client
) -> None:
    """The consumer goes away without reading: what it never took goes back, once, and
    a second consumer gets it; nothing stays in flight."""
    made: list[Raw] = []
    try:
        producer, consumer = _restored_in_flight(durable, admin, made)
        _send_all(producer, [_small(i) for i in range(NEW)], persistent=False)
        taken = _info(admin)["Acks"]  # (the ack:auto consumer took these: gone)
        consumer.close()
        assert wait_until(lambda: _info(admin)["InFlight"] == 0), _figures(admin)
        second = _raws(made, durable.port)
        second.send(
            f"SUBSCRIBE\nid:t\ndestination:/queue/{QUEUE}\nack:client-individual\n\n\x00".encode()
        )
        frames = _read(second, RESTORED + NEW - taken)
        for f in frames:
            second.send(f"ACK\nid:{f.header('ack')}\n\n\x00".encode())
        bodies = [f.body for f in frames]
        assert len(set(bodies)) == len(bodies)
        assert wait_until(lambda: _settled(admin)), _figures(admin)
    finally:
        for raw in made:
            raw.close()
