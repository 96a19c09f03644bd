"""``broker.client.confirm.Confirmations``: which unanswered frames the broker read (sans-IO)."""

from __future__ import annotations

from broker.client.confirm import Confirmations


def test_a_pong_confirms_what_was_sent_before_its_ping_in_order() -> None:
    c = Confirmations()
    c.sent = 10
    c.probe()  # PING after 10
    c.sent = 25
    c.probe(queued=5)  # PING after 20: 5 still wait in the client, behind it
    c.sent = 30
    assert c.unconfirmed == 30
    c.answered()
    assert c.unconfirmed == 20
    c.answered()
    assert c.unconfirmed == 10
    c.answered()  # a PONG with no PING of ours outstanding changes nothing
    assert c.unconfirmed == 10


def test_a_doubt_counts_only_what_is_neither_confirmed_nor_kept() -> None:
    c = Confirmations()
    c.sent = 40
    c.probe()
    c.answered()  # 40 read
    c.sent = 100
    c.probe()
    c.doubt("the session was lost (silence)", kept=15)  # 15 wait in the outbox
    assert c.unconfirmed == 15  # those are sent again after the reconnect
    c.answered()  # the lost connection's PING never counts now
    assert c.unconfirmed == 15
    c.all_read()  # the goodbye answered
    assert c.unconfirmed == 0
    error = c.report()
    assert error is not None
    assert (error.count, error.reasons) == (45, ["45 when the session was lost (silence)"])
    assert c.report() is None  # reported once


def test_nothing_doubted_is_no_report() -> None:
    c = Confirmations()
    c.sent = 7
    c.all_read()
    c.doubt("the broker did not answer the goodbye")
    assert c.report() is None
