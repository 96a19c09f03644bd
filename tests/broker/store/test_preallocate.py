"""Zeros written ahead of the head segment's data (``LogOptions.preallocate``): the head's
syncs are then fdatasync of blocks already on disk; finished segments and a clean close
keep data only; recovery takes a zero tail (what a kill leaves) as the end, not damage."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from broker.store.log import LogOptions, LogStore
from tests.broker.store.kit import contents

Q = ("orders", 1)
WAIT = 30.0
KIB = 1024


def _head(directory: Path) -> Path:
    return sorted(directory.glob("*.seg"))[-1]


def test_the_head_has_zeros_ahead_and_a_closed_store_keeps_data_only(tmp_path: Path) -> None:
    options = LogOptions(segment_size=1024 * KIB, max_record_size=4 * KIB, preallocate=64 * KIB)
    store = LogStore(tmp_path, options)
    try:
        assert store.wait(store.append(Q, b"x" * 100).ticket, WAIT)
        head = _head(tmp_path)
        assert head.stat().st_size >= 64 * KIB  # zeros ahead of ~150 octets of data
        data = head.read_bytes()
        assert data.rstrip(b"\0") and not data[len(data.rstrip(b"\0")) :].strip(b"\0")
        for _ in range(800):  # ~150 KiB: the zeros move ahead as the data grows
            store.append(Q, b"y" * 150)
        assert store.flush(WAIT)
        assert head.stat().st_size >= store.stats().disk_bytes
    finally:
        store.close()
    assert _head(tmp_path).stat().st_size == len(_head(tmp_path).read_bytes().rstrip(b"\0"))
    with LogStore(tmp_path, options) as again:
        assert again.stats().damage == ()
        assert len(contents(again)[Q]) == 801


def test_finished_segments_are_cut_to_their_data(tmp_path: Path) -> None:
    options = LogOptions(segment_size=16 * KIB, max_record_size=4 * KIB, preallocate=8 * KIB)
    with LogStore(tmp_path, options) as store:
        for _ in range(300):  # ~50 KiB: several segments
            store.append(Q, b"z" * 150)
        assert store.flush(WAIT)
        finished = sorted(tmp_path.glob("*.seg"))[:-1]
        assert len(finished) >= 2
        for path in finished:
            data = path.read_bytes()
            assert not data.endswith(b"\0" * 64)  # records end with their blob (no zeros)


def test_a_zero_tail_is_the_end_not_damage_and_is_cut(tmp_path: Path) -> None:
    with LogStore(tmp_path) as store:
        for i in range(10):
            store.append(Q, f"m{i}".encode())
    head = _head(tmp_path)
    size = head.stat().st_size
    with head.open("ab") as f:  # what a killed writer leaves: zeros after the data
        f.write(bytes(256 * KIB))
    with LogStore(tmp_path) as store:
        assert store.stats().damage == ()
        assert contents(store)[Q] == {i + 1: f"m{i}".encode() for i in range(10)}
    assert head.stat().st_size == size


def test_a_torn_record_before_the_zeros_is_damage_and_the_rest_survives(tmp_path: Path) -> None:
    with LogStore(tmp_path) as store:
        for i in range(10):
            store.append(Q, f"m{i}".encode() * 10)
    head = _head(tmp_path)
    data = head.read_bytes()
    with head.open("r+b") as f:  # the last record's end never reached the disk
        f.truncate(len(data) - 5)
        f.seek(0, os.SEEK_END)
        f.write(bytes(64 * KIB))
    with LogStore(tmp_path) as store:
        assert len(store.stats().damage) == 1
        assert contents(store)[Q] == {i + 1: f"m{i}".encode() * 10 for i in range(9)}


_WRITER = """
import sys
from broker.store.log import LogStore, LogOptions
store = LogStore(sys.argv[1], LogOptions(preallocate=1024 * 1024))
n = 0
while True:
    n += 1
    ticket = store.append(("orders", 1), b"%08d" % n).ticket
    if n % 50 == 0:
        store.wait(ticket)
        print(n, flush=True)
"""


def test_kill_9_with_zeros_ahead_keeps_every_completed_record(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    completed = 0
    try:
        while completed < 2_000:
            line = proc.stdout.readline()
            assert line, "the writer process ended"
            completed = int(line)
        assert _head(tmp_path).stat().st_size >= 1024 * 1024  # the zeros are there
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        proc.stdout.close()
    with LogStore(tmp_path) as store:
        got = contents(store)[Q]
        assert store.stats().damage == ()  # only zeros after the last record
    assert all(got[n] == b"%08d" % n for n in range(1, completed + 1))
    assert sorted(got) == list(range(1, len(got) + 1))
