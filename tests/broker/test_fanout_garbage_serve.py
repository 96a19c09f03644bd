"""Garbage between plain pushes into a fan-out broadcast queue's run, on a real
``broker serve --fanout`` process.

A raw producer (a DEALER speaking TMQP by hand) sends plain pushes into a broadcast queue
whose only consumers are fan-out members, and between them: bytes that start like a QUEUE
frame but run past their end, bytes that are no frame at all, an empty message, a push
split over two messages, pushes too big for the queue (plain: dropped; acknowledged:
refused), a duplicate id, an acknowledged push, one with a header and a PING.  The broker
is stopped (SIGSTOP) while all of it is sent, so that the pushes reach it together and
are served as runs (its ``run_pushes``), and one more member, a separate process, is
killed (-9) meanwhile: it leaves in the middle of the runs.  Then: every frame that is not
a push is answered "bad request" in its place, the others as a push alone would be; every
good push reaches every member (raw payloads, numbered payloads, messages; threaded and
poll-on-call) once, in order, without a gap; and the broker goes on serving.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import zmq

from broker import tmqp
from broker.client import Client
from broker.protocol import Header, MessageType, ResultCode, header
from tests.broker.test_batch import Raw
from tests.broker.test_cli import start_serve
from tests.broker.test_push_runs import push as push_to_d
from tests.polling import WAIT
from tests.ports import free_port
from tests.zerohub.support import stop_process

Ctx = zmq.Context[zmq.Socket[bytes]]
CHANNEL = "d"  # (the channel test_push_runs.push addresses)
QUEUE_ID = 1
SIZE_LIMIT = 100
#: A broadcast queue (Status 0) that refuses pushes over SIZE_LIMIT octets and drops a
#: message id it has seen (so that both checks of a run's pushes are met mid-run).
OPTIONS = {"Status": 0, "MessageSizeLimit": SIZE_LIMIT, "UseMessageId": True,
           "DuplicateWindow": 10_000}  # fmt: skip
PING = tmqp.encode(tmqp.Ping())[0]
#: Hostile frames, each with the answer it must get (None: none).
KINDS = ("queue-like garbage", "junk", "empty", "split push", "too big", "too big acked",
         "duplicate", "acked", "header", "ping")  # fmt: skip


def push(mid: str, body: bytes, *, ack: bool = False, headers: tuple[Any, ...] = ()) -> bytes:
    """A QUEUE frame to the broadcast queue (``test_push_runs.push``)."""
    return push_to_d(mid, QUEUE_ID, body, ack=ack, headers=headers)


@dataclass
class Script:
    """The producer's messages, the payloads every member must get (in order) and the
    answers the producer must get (in order), worked out by hand."""

    sent: list[bytes] = field(default_factory=list)
    delivered: list[bytes] = field(default_factory=list)
    answers: list[tuple[str, str]] = field(default_factory=list)

    def plain(self, mid: str) -> None:
        body = mid.encode()
        self.sent.append(push(mid, body))
        self.delivered.append(body)

    def hostile(self, kind: str, mid: str, seen: str) -> None:
        body = mid.encode()
        if kind == "queue-like garbage":
            self.sent.append(b"\x11\x00\xff\xff\xff")  # a QUEUE frame's lengths past its end
            self.answers.append(("bad request", ""))
        elif kind == "junk":
            self.sent.append(b"\x00\xff no frame at all")
            self.answers.append(("bad request", ""))
        elif kind == "empty":
            self.sent.append(b"")
            self.answers.append(("bad request", ""))
        elif kind == "split push":
            whole = push(mid, body)
            self.sent += [whole[:9], whole[9:]]  # two messages: two pieces of garbage
            self.answers += [("bad request", ""), ("bad request", "")]
        elif kind == "too big":
            self.sent.append(push(mid, b"b" * (SIZE_LIMIT + 1)))  # plain: dropped
        elif kind == "too big acked":
            self.sent.append(push(mid, b"b" * (SIZE_LIMIT + 1), ack=True))
            self.answers.append(("nack", mid))
        elif kind == "duplicate":
            self.sent.append(push(seen, b"again"))  # plain, an id already taken: dropped
        elif kind == "acked":
            self.sent.append(push(mid, body, ack=True))
            self.delivered.append(body)
            self.answers.append(("ack", mid))
        elif kind == "header":
            self.sent.append(push(mid, body, headers=(("X-Note", "n"),)))
            self.delivered.append(body)
        else:
            assert kind == "ping"
            self.sent.append(PING)
            self.answers.append(("pong", ""))


def script(seed: int, rounds: int = 6) -> Script:
    """Plain pushes with every hostile kind between them, in an order the seed shuffles;
    the last, an acknowledged push, marks the end."""
    rng = random.Random(seed)
    out = Script()
    n = 0
    for r in range(rounds):
        kinds = list(KINDS)
        rng.shuffle(kinds)
        for kind in kinds:
            for _ in range(rng.randint(1, 12)):
                out.plain(f"p{n}")
                n += 1
            out.hostile(kind, f"h{r}-{kind}", "p0")
    for _ in range(20):
        out.plain(f"p{n}")
        n += 1
    out.sent.append(push("end", b"end", ack=True))
    out.delivered.append(b"end")
    out.answers.append(("ack", "end"))
    return out


def answer(msg: tmqp.Message) -> tuple[str, str]:
    if isinstance(msg, tmqp.Pong):
        return ("pong", "")
    assert isinstance(msg, tmqp.Frame), msg
    if msg.message_type == MessageType.ACK:
        return ("nack" if header(msg, Header.NACK_REASON) else "ack", msg.message_id)
    assert msg.message_type == MessageType.RESPONSE, msg
    assert msg.content_type == ResultCode.BAD_REQUEST, msg
    return ("bad request", msg.message_id)


def answers_until(producer: Raw, mid: str) -> list[tuple[str, str]]:
    """What ``producer`` is answered up to the acknowledge of ``mid``."""
    got: list[tuple[str, str]] = []
    while not got or got[-1] != ("ack", mid):
        got.append(answer(tmqp.decode((producer.sock.recv(),))))
    return got


# A member in its own process: joins the channel by fan-out, says so, then waits to be
# killed (it reads nothing more).
_MEMBER = """
import sys, time
from broker.client import Client
client = Client(sys.argv[1], timeout=30).connect()
client.join(sys.argv[2])
print("joined", flush=True)
sys.stdin.read()
"""


class Served:
    """One ``broker serve --fanout`` process (memory store), killed at the end."""

    def __init__(self) -> None:
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        fanout = f"tcp://127.0.0.1:{free_port()}"
        self.proc = start_serve("--data", "none", "--bind", self.endpoint, "--fanout", fanout)

    def close(self) -> None:
        self.proc.send_signal(signal.SIGCONT)  # (if a failed test left it stopped)
        self.proc.kill()
        self.proc.wait(WAIT)


@pytest.fixture
def served() -> Iterator[Served]:
    s = Served()
    yield s
    s.close()


def payloads_of(member: Client, kind: str, count: int) -> list[bytes]:
    """``count`` deliveries as ``member`` reads them (``kind``: raw payloads, numbered
    payloads -- the numbers checked to run on without a gap -- or messages)."""
    got: list[bytes] = []
    numbers: list[int] = []
    while len(got) < count:
        if kind == "messages":
            message = member.receive(timeout=WAIT * 3)
            assert message is not None, f"{len(got)} of {count}"
            got.append(bytes(message.payload))
            continue
        batch = member.receive_payloads(timeout=WAIT * 3)
        assert batch, f"{len(got)} of {count}"
        if kind == "numbered":
            numbers += [n for n, _ in batch]
            batch = [p for _, p in batch]
        got += [bytes(p) for p in batch]
    if numbers:
        assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))
    return got


@pytest.mark.parametrize("seed", [1, 2])
def test_garbage_between_plain_pushes_into_a_fanout_run(
    served: Served, zctx: Ctx, seed: int
) -> None:
    s = script(seed)
    admin = Client(served.endpoint, context=zctx, timeout=WAIT * 3).connect()
    members: dict[str, Client] = {}
    doomed: subprocess.Popen[str] | None = None
    producer: Raw | None = None
    try:
        admin.create_queue(CHANNEL, QUEUE_ID, OPTIONS)
        readers = [("payloads", True), ("numbered", False), ("messages", True),
                   ("messages", False)]  # fmt: skip
        for kind, threaded in readers:
            raw = "" if kind == "messages" else kind
            member = Client(served.endpoint, context=zctx, timeout=WAIT * 3, raw_fanout=raw,
                            threaded=threaded).connect()  # fmt: skip
            member.join(CHANNEL)
            members[f"{kind}-{'threaded' if threaded else 'poll'}"] = member
        doomed = subprocess.Popen(
            [sys.executable, "-c", _MEMBER, served.endpoint, CHANNEL],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert doomed.stdout is not None and doomed.stdout.readline() == "joined\n"
        producer = Raw(zctx, served.endpoint)
        before = int(admin.stats()["server"]["run_pushes"])

        stop_process(served.proc)  # what follows reaches it together
        for data in s.sent:
            producer.send(data)
        doomed.kill()  # a member gone in the middle of the runs
        doomed.wait(WAIT)
        served.proc.send_signal(signal.SIGCONT)

        producer.sock.rcvtimeo = int(WAIT * 3 * 1000)
        assert answers_until(producer, "end") == s.answers
        for name, member in members.items():
            kind = name.split("-")[0]
            assert payloads_of(member, kind, len(s.delivered)) == s.delivered, name
            assert member.fanout_gaps == [], name
        assert int(admin.stats()["server"]["run_pushes"]) > before  # (served as runs)

        # it goes on serving: the same producer, and everyone gets the next push
        producer.send(push("after", b"after", ack=True))
        assert answers_until(producer, "after") == [("ack", "after")]
        for name, member in members.items():
            assert payloads_of(member, name.split("-")[0], 1) == [b"after"], name
        assert served.proc.poll() is None
    finally:
        served.proc.send_signal(signal.SIGCONT)
        if doomed is not None and doomed.poll() is None:
            doomed.kill()
            doomed.wait(WAIT)
        if doomed is not None:
            for pipe in (doomed.stdin, doomed.stdout):
                if pipe is not None:
                    pipe.close()
        if producer is not None:
            producer.close()
        for member in members.values():
            member.close()
        admin.close()
