"""Bandwidth caps, sans-IO: ``--bwlimit`` values, the token bucket, credit granted through it.

Time is injected everywhere: no sleeps, no wall clock.
"""

from __future__ import annotations

from typing import Any

import pytest

from filemq import fmq_msg
from filemq.engine import load_wire
from filemq.engine_client import ClientSession, Send
from filemq.ratelimit import MIN_BURST, TokenBucket, burst_for, parse_rate

WIRE = load_wire("spec")


@pytest.mark.parametrize(
    ("text", "rate"),
    [
        ("100", 100),
        ("500K", 500 << 10),
        ("500k", 500 << 10),
        ("10M", 10 << 20),
        ("1.5G", 3 << 29),
        ("500KB/s", 500 << 10),
        ("10MiB", 10 << 20),
        (" 2M ", 2 << 20),
        (".5M", 1 << 19),
    ],
)
def test_parse_rate(text: str, rate: int) -> None:
    assert parse_rate(text) == rate


@pytest.mark.parametrize("text", ["", "M", "abc", "0", "0.1", "-1", "10Q", "1e6", "10 M M"])
def test_parse_rate_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="bad rate"):
        parse_rate(text)


def test_bucket_starts_full_refills_at_rate_and_caps_at_burst() -> None:
    bucket = TokenBucket(800, 400, now=10.0)  # (times in 1/8 s: exact in binary)
    assert bucket.available(10.0) == 400
    bucket.take(400, 10.0)
    assert bucket.available(10.0) == 0
    assert bucket.wait(100, 10.0) == 0.125
    assert bucket.available(10.125) == 100
    assert bucket.available(20.0) == 400  # never more than the burst
    bucket.take(600, 20.0)  # more than there is: a debt paid by later tokens
    assert bucket.available(20.125) == 0
    assert bucket.wait(100, 20.125) == 0.25  # 100 of debt left, then 100
    assert bucket.wait(10_000, 20.125) == 0.625  # capped at the burst
    assert bucket.available(19.0) == 0  # a clock going back adds nothing


def test_burst_has_a_floor() -> None:
    assert burst_for(1) == MIN_BURST
    assert burst_for(10 << 20) == 5 << 20


def _noms(actions: list[Any]) -> int:
    total = 0
    for action in actions:
        if isinstance(action, Send):
            msg = fmq_msg.decode(action.frames)
            if isinstance(msg, fmq_msg.Nom):
                total += msg.credit
    return total


@pytest.mark.parametrize("rate", [64 << 10, 1 << 20, 10 << 20])
def test_capped_client_never_grants_more_than_the_bucket(rate: int) -> None:
    """A server that spends every byte of credit at once: the client's grants, summed,
    stay within burst + rate * t at every step, and keep up with the rate."""
    s = ClientSession(WIRE, "/", {}, 0.0, window=16 << 20, rate=rate, timeout=1e9)
    s.start(0.0)
    granted = _noms(s.receive(fmq_msg.encode(fmq_msg.OhaiOk()), 0.0))
    burst = burst_for(rate)
    assert granted == min(16 << 20, burst)
    seq = 0
    used = 0
    step = 0.01
    for i in range(1, 1001):  # 10 s of simulated time
        now = i * step
        while used < granted:  # the server sends all it may, in chunks of <= 64 KiB
            size = min(64 << 10, granted - used)
            msg = fmq_msg.Cheezburger(seq, 1, f"/f{seq}", 0, 1, {}, b"x" * size)
            seq += 1
            used += size
            granted += _noms(s.receive(fmq_msg.encode(msg), now))
        granted += _noms(s.tick(now))
        assert granted <= burst + rate * now + 1
    assert granted >= rate * 10 * 0.9


def test_uncapped_client_grants_the_window_back_by_quarters() -> None:
    s = ClientSession(WIRE, "/", {}, 0.0, window=400)
    s.start(0.0)
    assert _noms(s.receive(fmq_msg.encode(fmq_msg.OhaiOk()), 0.0)) == 400
    assert s.wakeup(0.0) == float("inf")
    msg = fmq_msg.Cheezburger(0, 1, "/a", 0, 1, {}, b"x" * 100)
    assert _noms(s.receive(fmq_msg.encode(msg), 0.0)) == 100
