"""The durability gate when the store's writer fails (a full disk): what waited for a
write that will never complete leaves at once, every positive acknowledge in it made
negative; nothing is held from then on (``broker/server/gate.py``, "A failed store").

A real log whose writer thread's fsync fails with ENOSPC once the test says so; the
engine, the gate and the frames are the broker's own.  The served twin (a real broker on
a tmpfs that fills) is ``test_full_disk_serve.py``.
"""

from __future__ import annotations

import errno
import os
import select
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.protocol import ConnectionInfo, MessageType
from broker.server.gate import OutputGate
from broker.store.durable import DurableStore
from broker.store.log import LogStore
from broker.store.log import store as store_module
from broker.tmqp import Frame
from tests.broker.test_server_gate import _orders, _push
from tests.polling import WAIT, wait_until

PRODUCERS = 4


class Disk:
    """Fails the log writer's fsyncs with ENOSPC from the moment ``fill`` is called."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.full = threading.Event()
        real = store_module.os.fsync

        def sync(fd: int) -> None:
            if self.full.is_set() and threading.current_thread().name == "store-writer":
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            real(fd)

        monkeypatch.setattr(store_module.os, "fsync", sync)
        monkeypatch.setattr(store_module.os, "fdatasync", sync)

    def fill(self) -> None:
        self.full.set()


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> Disk:
    return Disk(monkeypatch)


@pytest.fixture
def log(tmp_path: Path) -> Iterator[LogStore]:
    store = LogStore(tmp_path)
    try:
        yield store
    finally:
        store.close()


class Gated:
    """An engine saving to ``log`` (the persistent ``orders`` queue, a memory queue
    ``plain``), four producers, a gate whose output goes to ``sent``."""

    def __init__(self, log: LogStore) -> None:
        self.store = DurableStore(log)
        self.engine = engine = _orders(self.store)
        engine.create_channel("plain")
        engine.create_queue("plain", 1)
        self.producers = [engine.connect(ConnectionInfo(client_id=f"p{i}"), now=0.0)[0]
                          for i in range(PRODUCERS)]  # fmt: skip
        self.sent: list[Any] = []
        self.gate = OutputGate(self.store, self.sent.extend)

    def push(self, producer: str, frame: Frame) -> None:
        self.gate.admit(self.engine.receive(producer, frame, 0.0))

    def push_each(self) -> None:
        """One acknowledged persistent push from each producer."""
        for k, producer in enumerate(self.producers):
            self.push(producer, _push(producer, k))


def _acks(sent: list[Any]) -> dict[str, list[str | None]]:
    """Per client, the Nack-Reason of each acknowledge sent to it (None: positive)."""
    got: dict[str, list[str | None]] = {}
    for client_id, frame in sent:
        if isinstance(frame, Frame) and frame.message_type == MessageType.ACK:
            reason = dict((k.lower(), v) for k, v in frame.headers).get("nack-reason")
            got.setdefault(client_id, []).append(reason)
    return got


def _release_when_failed(gate: OutputGate, log: LogStore) -> None:
    assert wait_until(lambda: log.failed is not None), "the writer did not fail"
    ready, _, _ = select.select([gate.fileno()], [], [], WAIT)
    assert ready, "a failed writer must wake the server's poll"
    gate.release()


def test_held_acknowledges_leave_refused_and_nothing_is_held_after(
    log: LogStore, disk: Disk
) -> None:
    g = Gated(log)
    gate, sent, producers = g.gate, g.sent, g.producers
    called: list[int] = []
    disk.fill()
    g.push_each()
    gate.call(lambda: called.append(1))  # (a STOMP receipt waiting for those saves)
    gate.call(lambda: called.append(2), lambda: called.append(-2))  # (one with a failure path)
    assert gate.held == PRODUCERS + 2 and sent == []  # each waits for its fsync
    _release_when_failed(gate, log)
    assert _acks(sent) == {p: ["failed"] for p in producers}  # a refusal each, no silence
    assert called == [-2]  # a call would confirm a save that did not happen: its failure
    # path runs instead (the STOMP door's: an ERROR "not saved"), one without is dropped
    assert gate.held == 0 and gate.failed
    # from now on nothing waits: a persistent push is refused at once...
    sent.clear()
    g.push(producers[0], _push(producers[0], 9))
    assert _acks(sent) == {producers[0]: ["failed"]}
    # ...and what needs no disk is served as before
    sent.clear()
    plain = Frame(message_type=MessageType.QUEUE, content_type=1, target="plain",
                  pending_ack=True, message_id="x", source=producers[1], payload=b"x")  # fmt: skip
    g.push(producers[1], plain)
    assert _acks(sent) == {producers[1]: [None]}
    gate.call(lambda: called.append(3), lambda: called.append(-3))
    assert called == [-2, 3]


def test_a_drain_whose_held_group_the_failed_log_refuses_acknowledges_nothing(
    log: LogStore, disk: Disk
) -> None:
    """The drain's pushes were checked writable and held; the writer fails before the
    drain ends: the group is never written, and every producer hears a refusal."""
    g = Gated(log)
    g.gate.begin()
    g.push_each()
    disk.fill()
    log.append(("other", 1), b"makes the writer sync")
    assert wait_until(lambda: log.failed is not None), "the writer did not fail"
    g.gate.end()
    assert _acks(g.sent) == {p: ["failed"] for p in g.producers}
    assert g.gate.held == 0
