"""The second adversary review (session 22, adv22b): a STOMP 1.0 client whose ``receipt``
value ends with CR (``receipt:r\\r\\n``: on 1.0 a CR belongs to the line, so the value
is ``r\\r``), against a real listener and engine over loopback sockets.

Writing the RECEIPT back raised ``EncodeError`` ("ends with CR"): raised in the listener's
handling of the engine's answers, it left the connection unanswered for ever (no
RECEIPT, no ERROR, no close) and dropped the answers after it in the same batch --
another client's RECEIPT too; raised while writing an ERROR that names the receipt, it
tore the connection down with no ERROR at all.  Now the value goes back as it came (a 1.0
frame is written as a 1.0 frame is read: a CR before the LF belongs to the value): a
client that reads CRLF as a line end reads what it meant, one that does not reads the
bytes it sent.  A 1.0 subscription ``id`` ending with CR alike: its MESSAGEs raised, and the
deliveries to other connections handed over with them were lost."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from broker.stomp.frames import SERVER_COMMANDS, Command, Frame, FrameParser, Version, serialize
from tests.polling import wait_until
from tests.stomp.test_listener import Raw
from tests.stomp.two_doors import Broker, Ctx


@pytest.fixture
def held(zctx: Ctx) -> Iterator[Broker]:
    """A broker whose server loop (the engine's) can be held: SENDs of two connections
    are then run in one batch, their answers handed to the listener together."""
    made = Broker(zctx, held=True)
    yield made
    made.stop()


def _connect_1_0(b: Broker) -> Raw:
    raw = Raw(b.listener.port)
    # (it reads as a 1.0 client does: a CR before the LF belongs to the line)
    raw.parser = FrameParser(commands=SERVER_COMMANDS, version=Version.V1_0)
    raw.send(b"CONNECT\naccept-version:1.0\nlogin:x\n\n\x00")
    assert raw.next().command is Command.CONNECTED
    return raw


def test_a_1_0_receipt_ending_in_cr_is_answered_and_spoils_no_other_answer(
    held: Broker,
) -> None:
    assert held.hold is not None
    hostile = _connect_1_0(held)
    other = Raw(held.listener.port)
    try:
        other.connect()
        held.hold.hold()  # (both SENDs wait, then run in one batch of the engine)
        hostile.send(b"SEND\ndestination:/queue/q\nreceipt:r\r\n\nx\x00")
        other.send(b"SEND\ndestination:/queue/q\nreceipt:fine\n\ny\x00")
        assert wait_until(lambda: held.door.pending_ops >= 2)
        held.hold.release()
        answer = other.next()
        assert (answer.command, answer.header("receipt-id")) == (Command.RECEIPT, "fine")
        answer = hostile.next()
        assert (answer.command, answer.header("receipt-id")) == (Command.RECEIPT, "r\r")
        # the connection goes on: a run of SENDs asking the same receipt, then DISCONNECT
        hostile.send(b"SEND\ndestination:/queue/q\nreceipt:s\r\n\nz\x00" * 3)
        hostile.send(b"DISCONNECT\nreceipt:bye\r\n\n\x00")
        answers = [hostile.next() for _ in range(4)]
        assert [(f.command, f.header("receipt-id")) for f in answers] == [
            *[(Command.RECEIPT, "s\r")] * 3,
            (Command.RECEIPT, "bye\r"),
        ]
        assert hostile.closed_by_server()
    finally:
        hostile.close()
        other.close()


def test_an_error_naming_a_1_0_receipt_ending_in_cr_is_written_before_the_close(
    held: Broker,
) -> None:
    hostile = _connect_1_0(held)
    try:
        hostile.send(b"SEND\ndestination:/queue/\nreceipt:bad\r\n\nx\x00")
        frame = hostile.next()
        assert (frame.command, frame.header("receipt-id")) == (Command.ERROR, "bad\r")
        assert hostile.closed_by_server()
    finally:
        hostile.close()


def test_a_1_0_frame_is_written_as_it_is_read() -> None:
    """The codec's promise behind it: a 1.0 header whose value ends with CR reads back
    the same (by :class:`FrameParser`'s 1.0 rule); on 1.1/1.2 such a value is escaped."""
    frame = Frame(Command.RECEIPT, (("receipt-id", "r\r"),))
    for version in Version:
        parser = FrameParser(commands=SERVER_COMMANDS, version=version)
        (back,) = parser.feed(serialize(frame, version))
        assert back.header("receipt-id") == "r\r", version


@pytest.mark.parametrize("ack", ["auto", "client"])
def test_a_1_0_subscription_id_ending_in_cr_gets_its_messages_and_spoils_no_other(
    held: Broker, ack: str
) -> None:
    """Its MESSAGEs carry ``subscription:s\\r``: writing them raised ``EncodeError`` in the
    listener's handling of the engine's deliveries (the messages never went out, in flight
    to it for ever), with the deliveries to other connections of that batch."""
    hostile = _connect_1_0(held)
    other = Raw(held.listener.port)
    producer = Raw(held.listener.port)
    try:
        hostile.send(
            b"SUBSCRIBE\nid:s\r\ndestination:/queue/cr\nack:%s\nreceipt:r\n\n\x00" % ack.encode()
        )
        assert hostile.next().header("receipt-id") == "r"
        other.connect()
        other.send(b"SUBSCRIBE\nid:t\ndestination:/queue/calm\nreceipt:t\n\n\x00")
        assert other.next().header("receipt-id") == "t"
        producer.connect()
        # one write, one engine batch: deliveries to both connections handed over together
        producer.send(
            b"".join(
                b"SEND\ndestination:/queue/%s\n\n%s%d\x00" % (queue, queue, i)
                for i in range(3)
                for queue in (b"cr", b"calm")
            )
        )
        got = [other.next() for _ in range(3)]
        assert [bytes(f.body) for f in got] == [b"calm0", b"calm1", b"calm2"]
        got = [hostile.next() for _ in range(3)]
        assert [bytes(f.body) for f in got] == [b"cr0", b"cr1", b"cr2"]
        assert {f.header("subscription") for f in got} == {"s\r"}
    finally:
        for raw in (hostile, other, producer):
            raw.close()
