"""The second adversary review (session 22, adv22b): receipt22's receipt streaks and a
backlog drained as AUTO deliveries when the data disk fills.

A real ``broker serve --data DIR --stomp ...`` on a 1 MiB tmpfs (``test_full_disk_stomp``'s
broker and disk).  Persistent SENDs whose heads are alike but for their last line
``receipt:NAME`` (the parser reads them as one ``SendStreak`` with its ``receipts``), several
in one write, until the store fails: a RECEIPT for each SEND known saved, in order, then
one ERROR "not saved" naming the receipt of the first SEND not known saved (a streak may be
cut there: its SENDs read and saved before are receipted; of a run whose save the failure
hit, none is, its first one named), then the close; restarted with room, every receipted
message is back, once, in order.

Then, on the failed store, a backlog of in-memory messages drains to an ``ack:auto``
consumer (the drain as AUTO: ``Dispatcher.send_run``) beside the persistent ones left
queued: each message once, in the order sent.

Mounting needs root (CAP_SYS_ADMIN): elsewhere these tests skip, saying why.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.stomp.frames import Command
from tests.filemq.test_full_disk import _grow, small_disk  # noqa: F401 (the fixture)
from tests.stomp.test_full_disk_stomp import BODY, MOST, Broker, _assert_not_saved

STREAK = 4  # persistent SENDs per write, a receipt on each
BACKLOG = 300  # in-memory SENDs queued behind the persistent ones once the store failed


@pytest.fixture
def broker(small_disk: Path, tmp_path: Path) -> Iterator[Broker]:  # noqa: F811
    server = Broker(small_disk / "data", tmp_path / "broker.log")
    yield server
    server.kill()


def _persistent(name: str) -> bytes:
    """A persistent SEND to /queue/orders whose head differs from the others' in its
    receipt only (its name), its body the name padded to ``BODY`` octets."""
    head = f"SEND\ndestination:/queue/orders\npersistent:true\ncontent-length:{BODY}\n"
    return f"{head}receipt:{name}\n\n".encode() + name.encode().ljust(BODY, b".") + b"\x00"


def _fill_with_streaks(broker: Broker) -> tuple[list[str], list[str]]:
    """Streaks of ``STREAK`` receipted SENDs, one write each, until the store fails: the
    names receipted (in order) and those of the streak the failure hit (its SENDs read
    and saved before the failing one may be receipted: the ERROR names the first not)."""
    producer = broker.client()
    receipted: list[str] = []
    for r in range(MOST):
        names = [f"m{r:03d}-{i}" for i in range(STREAK)]
        producer.send(b"".join(_persistent(n) for n in names))
        answers = []
        for _ in names:
            frame = producer.next()
            answers.append(frame)
            if frame.command is not Command.RECEIPT:
                break
        ids = [f.header("receipt-id") for f in answers if f.command is Command.RECEIPT]
        assert ids == names[: len(ids)], ids  # (in order, each once)
        receipted += ids
        if len(ids) < len(names):
            _assert_not_saved(answers[-1], names[len(ids)])
            break
    else:
        pytest.fail(f"{MOST} streaks of {BODY}-octet SENDs all receipted on a 1 MiB disk")
    assert receipted, "the disk had room for none: nothing was tested"
    assert producer.closed_by_server()  # ERROR, then close
    producer.close()
    return receipted, names


def _names(frames: list[bytes]) -> list[str]:
    return [body.split(b".", 1)[0].decode() for body in frames]


def test_a_receipt_streak_the_disk_cannot_hold_is_an_error_naming_its_first_receipt(
    broker: Broker,
    small_disk: Path,  # noqa: F811
) -> None:
    receipted, refused = _fill_with_streaks(broker)
    # a backlog of in-memory messages behind the persistent ones, then an ack:auto
    # consumer drains the queue on the failed store
    producer = broker.client()
    plain = b"".join(b"SEND\ndestination:/queue/orders\n\nb%04d\x00" % i for i in range(BACKLOG))
    producer.send(plain + b"SEND\ndestination:/queue/orders\nreceipt:plain\n\nlast\x00")
    frame = producer.next()
    assert frame.command is Command.RECEIPT and frame.header("receipt-id") == "plain", frame
    producer.close()
    consumer = broker.client()
    consumer.send(b"SUBSCRIBE\nid:s\ndestination:/queue/orders\nack:auto\n\n\x00")
    got: list[bytes] = []
    while (frame := consumer.next()).body != b"last":
        assert frame.command is Command.MESSAGE, frame
        got.append(bytes(frame.body))
    consumer.close()
    persistent = [b for b in got if len(b) == BODY]
    assert _names(persistent)[: len(receipted)] == receipted
    assert set(_names(persistent)[len(receipted) :]) <= set(refused)
    assert [b for b in got if len(b) != BODY] == [b"b%04d" % i for i in range(BACKLOG)]
    assert got[: len(persistent)] == persistent  # (queued before the backlog)
    assert broker.stop() == 0
    # restarted with room: what was receipted is there (its removals may not be: the
    # store had failed, the consumer's acknowledges were not saved), once, in order
    _grow(small_disk)
    broker.start()
    again = broker.client()
    again.send(b"SUBSCRIBE\nid:s\ndestination:/queue/orders\nreceipt:sub\n\n\x00")
    assert again.next().command is Command.RECEIPT
    again.send(b"SEND\ndestination:/queue/orders\n\nend\x00")
    held: list[bytes] = []
    while (frame := again.next()).body != b"end":
        held.append(bytes(frame.body))
    again.close()
    assert _names(held)[: len(receipted)] == receipted
    assert set(_names(held)[len(receipted) :]) <= set(refused)
    assert broker.stop() == 0
