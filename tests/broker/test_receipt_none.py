"""Issue 10's receipts, the third value: ``Receipt: NONE`` (and the older draft's ``no``,
and no header at all) makes no receipt -- not when a consumer acknowledges, not when the
message expires unconsumed, not at the receipt's timeout.  ONE, ALL and "X/Y" are in
``test_engine_receipts_dsubs.py`` and ``test_receipts_serve.py``; the same flow with
``ONE`` is the control that shows a receipt would be seen here."""

from __future__ import annotations

import pytest

from broker.protocol import RECEIPT_CONTENT_TYPE, MessageType, QueueStatus, header
from tests.broker.engine_kit import Kit

TIMEOUT_MS = 1_000  # the queue's MessageTimeout


def _receipts(value: str | None) -> list[str | None]:
    """One message consumed, one left to expire, the clock past every timeout: the
    ``Receipt-Status`` of each receipt its producer got."""
    kit = Kit()
    producer, consumer = kit.connect("p"), kit.connect("c")
    kit.queue(producer, "work", 1, status=QueueStatus.ROUND_ROBIN, request_acknowledge=True,
              message_timeout=TIMEOUT_MS)  # fmt: skip
    kit.join(consumer, "work")
    asked = () if value is None else (("Receipt", value), ("Receipt-Timeout", "500"))
    kit.push(producer, "work", 1, mid="taken", headers=asked)
    (delivered,) = [f for f in kit.take(consumer) if f.message_type == MessageType.QUEUE]
    kit.ack(consumer, delivered)
    kit.disconnect(consumer)
    kit.push(producer, "work", 1, mid="expires", headers=asked)  # nobody to take it
    kit.advance(5.0)  # past the receipt timeout and the message timeout
    assert len(kit.engine.receipts) == 0  # none pending either
    return [
        header(f, "Receipt-Status")
        for f in kit.take(producer)
        if f.message_type == MessageType.DIRECT and f.content_type == RECEIPT_CONTENT_TYPE
    ]


@pytest.mark.parametrize("value", ["NONE", "none", "no", None])
def test_no_receipt_is_ever_sent_for_none(value: str | None) -> None:
    assert _receipts(value) == []


def test_the_same_flow_with_one_gets_both_receipts() -> None:
    assert _receipts("ONE") == ["complete", "incomplete"]
