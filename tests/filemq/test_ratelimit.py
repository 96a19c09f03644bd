"""Bandwidth caps: ``--bwlimit`` values, the token bucket and credit granted through it
(sans-IO, time injected), then real transfers capped by a client and by a server."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zmq

from filemq import fmq_msg
from filemq.client import SyncClient, SyncResult
from filemq.engine import load_wire
from filemq.engine_client import ClientSession, Send
from filemq.ratelimit import MIN_BURST, TokenBucket, burst_for, parse_rate
from filemq.server import FileServer

from .conftest import write_tree

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


# -- end to end: real sockets; only a lower bound on time (deterministic) ------------------


def test_capped_sync_takes_at_least_what_the_cap_allows(
    tmp_path: Path, serve: Callable[..., FileServer], sync_once: Callable[..., SyncResult]
) -> None:
    """bytes <= burst + rate * elapsed, whatever the machine's speed: a lower bound on
    the elapsed time (an upper bound would depend on the machine's load)."""
    size, rate = 6 << 20, 4 << 20
    write_tree(tmp_path / "src", {"a.bin": os.urandom(size // 2), "b.bin": os.urandom(size // 2)})
    server = serve(tmp_path / "src", chunk_size=64 << 10)
    started = time.monotonic()
    result = sync_once(server.endpoint, tmp_path / "dest", bwlimit=rate)
    elapsed = time.monotonic() - started
    assert result.synced and result.bytes == size
    assert elapsed >= (size - burst_for(rate)) / rate  # 1.0 s
    assert (size - burst_for(rate)) / elapsed <= rate  # the average, past the burst


def test_capped_server_shares_its_cap_between_clients(
    tmp_path: Path, serve: Callable[..., FileServer], zctx: zmq.Context[Any]
) -> None:
    size, rate = 3 << 20, 4 << 20
    write_tree(tmp_path / "src", {"a.bin": os.urandom(size)})
    chunk = 64 << 10
    server = serve(tmp_path / "src", chunk_size=chunk, bwlimit=rate)
    clients = [
        SyncClient(zctx, server.endpoint, tmp_path / f"dest{i}", once=True, connect_timeout=10)
        for i in range(2)
    ]
    results: list[SyncResult] = []
    started = time.monotonic()
    threads = [threading.Thread(target=lambda c=c: results.append(c.run())) for c in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    elapsed = time.monotonic() - started
    assert [r.bytes for r in results] == [size, size]
    # both clients' bytes went through one bucket (a chunk may overdraw it once)
    assert elapsed >= (2 * size - burst_for(rate) - chunk) / rate  # ~1.0 s


def test_a_capped_server_loses_no_message_it_built_when_tokens_run_out(
    tmp_path: Path, serve: Callable[..., FileServer], zctx: zmq.Context[Any]
) -> None:
    """A capped server stops a round of sending when its bucket is empty: the small
    files it had built in that round (sequence numbers given) still go out, in order.
    (Dropped, they left a gap the mirror refused: 'CHEEZBURGER sequence 42, expected
    40', reconnect after reconnect.)"""
    files = {f"d{i % 5}/f{i:03d}": os.urandom(20 << 10) for i in range(150)}  # 3 MiB
    write_tree(tmp_path / "src", files)
    server = serve(tmp_path / "src", bwlimit=2 << 20)  # tokens run out mid-round
    client = SyncClient(zctx, server.endpoint, tmp_path / "dest", once=True, max_retries=0)
    result = client.run()
    assert result.synced and result.files == len(files) and result.errors == 0
    assert client.connections == 1  # no protocol error, no reconnect


@pytest.mark.parametrize("command", ["sync", "subscribe", "serve"])
def test_bad_bwlimit_is_a_usage_error(command: str, tmp_path: Path) -> None:
    where = ["--publish", str(tmp_path)] if command == "serve" else ["tcp://127.0.0.1:1", "d"]
    done = subprocess.run(
        [sys.executable, "-m", "filemq", command, *where, "--bwlimit", "10Q"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 2
    assert done.stderr.startswith(f"filemq {command}: argument --bwlimit: bad rate '10Q'")
    assert len(done.stderr.splitlines()) == 1
