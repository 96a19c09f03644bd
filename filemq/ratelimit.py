"""Bandwidth caps: a token bucket with the clock injected, and ``--bwlimit`` values.

``TokenBucket(rate, burst, now)``: tokens are bytes; they accrue at ``rate`` per
second up to ``burst`` (the bucket starts full).  ``available(now)`` says how many
may go now, ``take(n, now)`` spends them (the balance may go below zero: a debt
that later tokens pay first), ``wait(n, now)`` says how long until ``n`` are there.
Whatever is taken through one bucket, by any time ``t`` after its start, totals at
most ``burst + rate * t`` (plus the last ``take`` beyond the balance): the bound a
capped transfer's elapsed time is checked against.

Where the caps act (no socket here; the engines and drivers use the bucket):

* a client (``sync``/``subscribe --bwlimit``) grants FILEMQ credit only as its
  bucket allows (``filemq.engine_client``): the server cannot send faster;
* a server (``serve --bwlimit``) sends chunks to all its clients together only as
  its bucket allows (``filemq.server``).

``parse_rate`` reads ``--bwlimit``: bytes per second, with an optional suffix
``K``, ``M`` or ``G`` (powers of 1024, as rsync's ``--bwlimit``; ``10M`` is
10 MiB/s); a trailing ``B`` or ``/s`` is allowed (``500KB/s``).
"""

from __future__ import annotations

import re

__all__ = ["BURST_SECONDS", "MIN_BURST", "TokenBucket", "burst_for", "parse_rate"]

#: A cap's bucket holds this many seconds of its rate: the largest burst above the cap.
BURST_SECONDS = 0.5
#: ... but never less than this many bytes (a very low cap still moves whole messages).
MIN_BURST = 16 << 10

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_RATE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([KMG]?)(?:I?B)?(?:/S)?\s*")


def parse_rate(text: str) -> int:
    """Bytes per second of a ``--bwlimit`` value (``ValueError`` when it is not one)."""
    found = _RATE.fullmatch(text.upper())
    if found is None:
        raise ValueError(f"bad rate {text!r}: expected bytes per second, e.g. 500K, 10M, 1.5G")
    rate = int(float(found.group(1)) * _UNITS[found.group(2)])
    if rate < 1:
        raise ValueError(f"bad rate {text!r}: must be at least 1 byte per second")
    return rate


def burst_for(rate: int) -> int:
    """The bucket size used for a cap of ``rate`` bytes per second."""
    return max(int(rate * BURST_SECONDS), MIN_BURST)


class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` held; starts full at ``now``."""

    def __init__(self, rate: float, burst: float, now: float) -> None:
        if rate <= 0 or burst <= 0:
            raise ValueError("rate and burst must be positive")
        self.rate = float(rate)
        self.burst = float(burst)
        self._tokens = float(burst)
        self._at = now

    def _refill(self, now: float) -> None:
        if now > self._at:
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
            self._at = now

    def available(self, now: float) -> int:
        """Whole tokens there now (0 while in debt)."""
        self._refill(now)
        return max(0, int(self._tokens))

    def take(self, n: int, now: float) -> None:
        """Spend ``n`` tokens (more than there are leaves a debt)."""
        self._refill(now)
        self._tokens -= n

    def wait(self, n: int, now: float) -> float:
        """Seconds from ``now`` until ``n`` tokens are there (0 if they are; ``n`` is
        capped at ``burst``, which is always reached)."""
        self._refill(now)
        missing = min(float(n), self.burst) - self._tokens
        return max(0.0, missing / self.rate)
