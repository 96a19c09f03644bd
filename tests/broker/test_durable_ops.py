"""``broker serve``'s data directory and durability options, what a restart keeps of a
message (priority, TTL deadline, delivery count), and kill -9 during compaction: real
broker processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from broker.cli import default_data_dir
from broker.client.blocking import Client
from tests.broker.test_cli import start_serve
from tests.ports import free_port
from tests.variants import variants

PERSISTENT = {"MessageDeliveryHandler": "persistent", "RequestAcknowledge": True}


class Broker:
    """One ``broker serve`` process with fixed arguments, restartable."""

    def __init__(self, *args: str) -> None:
        self.args = args
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Broker:
        self.proc = start_serve("--bind", self.endpoint, *self.args)
        return self

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self.proc = None

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def client(self, zctx: zmq.Context[zmq.Socket[bytes]], timeout: float = 10.0) -> Client:
        """A connected client (the caller closes it)."""
        return Client(self.endpoint, context=zctx, timeout=timeout).connect()


@pytest.fixture
def brokers() -> Iterator[list[Broker]]:
    made: list[Broker] = []
    yield made
    for b in made:
        b.close()


def _serve_fails(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "broker", "serve", "--bind", f"tcp://127.0.0.1:{free_port()}",
         *args],
        capture_output=True,
        timeout=30,
    )  # fmt: skip


# -- the data directory -------------------------------------------------------------------


def test_default_data_dir_follows_xdg_then_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_data_dir() == tmp_path / "xdg" / "zerohub" / "broker"
    monkeypatch.setenv("XDG_DATA_HOME", "relative/path")  # not absolute: ignored (XDG spec)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_data_dir() == tmp_path / "home" / ".local" / "share" / "zerohub" / "broker"
    monkeypatch.delenv("XDG_DATA_HOME")
    assert default_data_dir() == tmp_path / "home" / ".local" / "share" / "zerohub" / "broker"


def test_serve_without_data_keeps_persistent_queues_in_the_user_data_dir(
    brokers: list[Broker], zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    data = Path(os.environ["XDG_DATA_HOME"]) / "zerohub" / "broker"  # this test's own
    assert not data.exists()
    broker = Broker()  # no --data: the default directory
    brokers.append(broker)
    broker.proc = subprocess.Popen(  # start_serve would add --data none
        [sys.executable, "-m", "broker", "serve", "--bind", broker.endpoint],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
    )
    with Client(broker.endpoint, context=zctx, timeout=15).connect() as producer:
        producer.create_queue("orders", 1, PERSISTENT)
        producer.push("orders", 1, "kept", ack=True, message_id="m1")
    assert any(data.glob("*.seg"))
    broker.kill()
    broker.args = ("--data", str(data))  # the same directory, named
    broker.start()
    with Client(broker.endpoint, context=zctx, timeout=10).connect() as consumer:
        consumer.join("orders")
        m = consumer.receive(timeout=10)
        assert m is not None and m.id == "m1" and bytes(m.payload) == b"kept"
        consumer.ack(m)


def test_data_none_writes_nothing(
    brokers: list[Broker], zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    broker = Broker("--data", "none").start()
    brokers.append(broker)
    with Client(broker.endpoint, context=zctx, timeout=10).connect() as producer:
        producer.create_queue("orders", 1, PERSISTENT)
        producer.push("orders", 1, "lost", ack=True)
        assert "orders" in str(producer.channels())
    broker.kill()
    assert not Path(os.environ["XDG_DATA_HOME"]).exists()
    broker.start()
    with Client(broker.endpoint, context=zctx, timeout=10).connect() as consumer:
        assert "orders" not in str(consumer.channels())


@pytest.mark.parametrize("mode", ["batch", "os"])
def test_durability_modes_from_the_cli_keep_acked_messages_over_kill_9(
    brokers: list[Broker], zctx: zmq.Context[zmq.Socket[bytes]], tmp_path: Path, mode: str
) -> None:
    """A killed process loses nothing in any mode (the kernel has what was written)."""
    broker = Broker("--data", str(tmp_path / "d"), "--durability", mode, "--batch-interval", "5")
    brokers.append(broker.start())
    with Client(broker.endpoint, context=zctx, timeout=10).connect() as producer:
        producer.create_queue("orders", 1, PERSISTENT)
        push = producer.push_async
        futures = [push("orders", 1, f"p{i}", message_id=f"m{i}") for i in range(50)]
        for f in futures:
            f.result(10)
    broker.kill()
    broker.start()
    got = []
    with Client(broker.endpoint, context=zctx, timeout=10).connect() as consumer:
        consumer.join("orders")
        while len(got) < 50 and (m := consumer.receive(timeout=10)) is not None:
            got.append(m.id)
            consumer.ack(m)
    assert got == [f"m{i}" for i in range(50)]


@pytest.mark.parametrize(
    "args",
    [
        ("--durability", "never"),
        ("--data", "{tmp}", "--batch-interval", "0"),
        ("--data", "{tmp}", "--batch-interval", "nan"),
        ("--data", "{tmp}", "--segment-size", "100"),
    ],
)
def test_bad_durability_options_are_one_line_exit_2(tmp_path: Path, args: tuple[str, ...]) -> None:
    done = _serve_fails(*(a.replace("{tmp}", str(tmp_path / "d")) for a in args))
    assert done.returncode == 2
    lines = done.stderr.decode().strip().splitlines()
    assert len(lines) == 1, lines
    assert not (tmp_path / "d").exists()


# -- what a restart keeps of a message ----------------------------------------------------


def _take(
    endpoint: str, zctx: zmq.Context[zmq.Socket[bytes]], channel: str, n: int, ack: bool = True
) -> list[tuple[str, str | None]]:
    """Join ``channel``, take up to ``n`` messages: (id, Delivery-Count header)."""
    got: list[tuple[str, str | None]] = []
    with Client(endpoint, context=zctx, timeout=10).connect() as consumer:
        consumer.join(channel)
        while len(got) < n and (m := consumer.receive(timeout=3)) is not None:
            got.append((m.id, m.header("Delivery-Count")))
            if ack:
                consumer.ack(m)
    return got


def test_restart_keeps_priority_and_delivery_count(
    brokers: list[Broker], zctx: zmq.Context[zmq.Socket[bytes]], tmp_path: Path
) -> None:
    broker = Broker("--data", str(tmp_path / "d"))
    brokers.append(broker.start())
    with Client(broker.endpoint, context=zctx, timeout=10).connect() as producer:
        producer.create_queue("orders", 1, {**PERSISTENT, "Prefetch": 1})
        producer.push("orders", 1, "first", ack=True, message_id="seen")
        with Client(broker.endpoint, context=zctx, timeout=10).connect() as consumer:
            consumer.join("orders")
            m = consumer.receive(timeout=10)  # delivered once, never acknowledged
            assert m is not None and m.id == "seen" and m.header("Delivery-Count") is None
            for mid in ("low-1", "low-2"):
                producer.push("orders", 1, mid, ack=True, message_id=mid)
            producer.push("orders", 1, "urgent", ack=True, message_id="high", high_priority=True)
            broker.kill()  # (the acks above: everything before them is on disk)
    broker.start()
    got = _take(broker.endpoint, zctx, "orders", 4)
    assert got == [("high", None), ("seen", "2"), ("low-1", None), ("low-2", None)]


@pytest.mark.slow
def test_restart_keeps_the_ttl_clock_running(
    brokers: list[Broker], zctx: zmq.Context[zmq.Socket[bytes]], tmp_path: Path
) -> None:
    """MessageTimeout is an absolute deadline: time spent down counts."""
    import time

    broker = Broker("--data", str(tmp_path / "d"))
    brokers.append(broker.start())
    with Client(broker.endpoint, context=zctx, timeout=10).connect() as producer:
        producer.create_queue("short", 1, {**PERSISTENT, "MessageTimeout": 3000})
        producer.create_queue("long", 1, {**PERSISTENT, "MessageTimeout": 600_000})
        pushed = time.monotonic()
        producer.push("short", 1, "x", ack=True, message_id="expires")
        producer.push("long", 1, "x", ack=True, message_id="stays")
    broker.kill()
    time.sleep(max(0.0, pushed + 3.5 - time.monotonic()))  # the scenario: down past it
    broker.start()
    assert _take(broker.endpoint, zctx, "long", 1) == [("stays", None)]
    assert _take(broker.endpoint, zctx, "short", 1) == []
    with Client(broker.endpoint, context=zctx, timeout=10).connect() as admin:
        info = admin.queue_info("short", 1)
    assert info["Messages"] == 0


# -- kill -9 during compaction --------------------------------------------------------------


def _segments(data: Path) -> list[int]:
    return sorted(int(p.stem) for p in data.glob("*.seg"))


ZEROS = {0: "zeros-off", 4 << 20: "zeros-ahead"}
#: seeds x zeros ahead; a CI run takes two (one of each setting), ZH_ALL_VARIANTS=1 all six
COMPACTION_KILLS = variants(
    chosen=[(0, 0), (1, 4 << 20)], every=[(seed, z) for z in ZEROS for seed in range(3)]
)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("seed", "preallocate"), COMPACTION_KILLS, ids=[f"{s}-{ZEROS[z]}" for s, z in COMPACTION_KILLS]
)
def test_kill_9_during_compaction_loses_nothing_acked(
    brokers: list[Broker],
    zctx: zmq.Context[zmq.Socket[bytes]],
    tmp_path: Path,
    seed: int,
    preallocate: int,
) -> None:
    """Small segments, two queues pushed in turn (queue A's messages 3x larger); a consumer
    empties A while B is pushed on, so finished segments fall under the compaction ratio
    and B's records are copied forward.  The broker is killed once compaction has deleted
    a segment (the next one is being compacted), at a random moment after that.  After
    the restart: every acknowledged B message once and in order, every acknowledged A
    message not consumed before the kill, nothing invented, nothing twice -- and no A
    message whose consumption was durable before the kill: every 20 acks the consumer
    pushes to a third persistent queue and waits for its acknowledge (given once the push
    is fsync'ed, and with it every removal the broker wrote before it: the acks went
    first on the same connection).  With and without zeros ahead of the log's head."""
    import random
    import threading
    import time

    rng = random.Random(seed)
    data = tmp_path / "d"
    broker = Broker(
        "--data", str(data), "--segment-size", "32768", "--preallocate", str(preallocate)
    )
    brokers.append(broker.start())
    acked: dict[str, list[str]] = {"A": [], "B": []}
    consumed: set[str] = set()
    durably_consumed: set[str] = set()
    stop = threading.Event()

    def produce() -> None:
        with Client(broker.endpoint, context=zctx, timeout=5, reconnect=False).connect() as c:
            c.create_queue("A", 1, PERSISTENT)
            c.create_queue("B", 1, PERSISTENT)
            try:
                for i in range(100_000):
                    if stop.is_set():
                        break
                    fa = c.push_async("A", 1, b"a" * 300, message_id=f"a{i:06d}")
                    fb = c.push_async("B", 1, b"b" * 100, message_id=f"b{i:06d}")
                    fa.result(5)
                    acked["A"].append(f"a{i:06d}")
                    fb.result(5)
                    acked["B"].append(f"b{i:06d}")
            except Exception:
                pass  # the broker died under us

    def consume_a() -> None:
        try:
            with Client(broker.endpoint, context=zctx, timeout=5, reconnect=False).connect() as c:
                while not stop.is_set() and len(acked["A"]) < 400:
                    time.sleep(0.01)  # (let A fill a few segments first)
                c.create_queue("C", 1, PERSISTENT)
                c.join("A")
                since_barrier: list[str] = []
                while not stop.is_set():
                    m = c.receive(timeout=0.2)
                    if m is not None:
                        c.ack(m)
                        consumed.add(m.id)  # (its removal may not be durable: may return)
                        since_barrier.append(m.id)
                    if len(since_barrier) >= 20:
                        c.push("C", 1, b"barrier", ack=True, timeout=5)
                        durably_consumed.update(since_barrier)  # must never return
                        since_barrier.clear()
        except Exception:
            pass

    threads = [threading.Thread(target=produce), threading.Thread(target=consume_a)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (_segments(data) and _segments(data)[0] > 1):
            time.sleep(0.02)  # polling for the first compacted (deleted) segment
        assert _segments(data)[0] > 1, "no segment was compacted"
        time.sleep(rng.uniform(0.0, 0.5))  # a random point of the compactions going on
        broker.kill()
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    broker.start()
    got_b = [mid for mid, _ in _take(broker.endpoint, zctx, "B", 10**6)]
    got_a = [mid for mid, _ in _take(broker.endpoint, zctx, "A", 10**6)]
    assert len(got_b) == len(set(got_b)) and len(got_a) == len(set(got_a))
    assert got_b == sorted(got_b) and set(acked["B"]) <= set(got_b)
    assert set(acked["A"]) - consumed <= set(got_a)
    assert durably_consumed, "no consumption was made durable before the kill"
    assert not durably_consumed & set(got_a), "a durably acknowledged message came back"
    assert all(m.startswith("b") for m in got_b) and all(m.startswith("a") for m in got_a)
    pushed = max(len(acked["A"]), len(acked["B"]))  # at most one push in flight each
    assert all(int(m[1:]) <= pushed for m in got_a + got_b)
