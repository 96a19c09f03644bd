"""kill -9 a writer process at random points (compaction runs nearly all the time), recover,
and check: every completed append is there exactly once with its own blob, every completed
removal stays removed, definitions are the last completed or a later issued value, nothing
is invented.  Then the next round writes on into the same directory and is killed too.

Zeros ahead of the head (``LogOptions.preallocate``, 4 MiB) are on for even seeds, off
for odd ones; ``ZH_CRASH_PREALLOCATE=<octets>`` in the environment sets it for every
seed (a soak loop of one setting)."""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from broker.store.log import LogStore, QueueKey
from tests.variants import variants

from .crash_worker import NAMES, QUEUES, blob_for

WORKER = Path(__file__).with_name("crash_worker.py")
ROOT = Path(__file__).resolve().parents[3]
PREALLOCATE = 4 * 1024 * 1024


def _preallocate(seed: int) -> int:
    forced = os.environ.get("ZH_CRASH_PREALLOCATE")
    if forced is not None:
        return int(forced)
    return 0 if seed % 2 else PREALLOCATE


@dataclass
class Seen:
    """What the killed rounds reported complete (and issued, for definitions)."""

    acked: dict[tuple[QueueKey, int], str] = field(default_factory=dict)
    removing: set[tuple[QueueKey, int]] = field(default_factory=set)
    removed: set[tuple[QueueKey, int]] = field(default_factory=set)
    #: per name: the value of the last completed operation and those issued after it
    values: dict[str, list[str]] = field(default_factory=dict)
    compactions: int = 0

    def take(self, line: str) -> None:
        word, *rest = line.split()
        if word == "A":
            channel, queue_id, seq, token = rest
            key = ((channel, int(queue_id)), int(seq))
            assert key not in self.acked, f"sequence number given twice: {key}"
            self.acked[key] = token
        elif word in ("RI", "R"):
            channel, queue_id, seq = rest
            key = ((channel, int(queue_id)), int(seq))
            (self.removing if word == "RI" else self.removed).add(key)
        elif word == "KI":
            self.values.setdefault(rest[0], ["-"]).append(rest[1])
        elif word == "KC":
            name, value = rest
            history = self.values[name]
            history[:] = history[history.index(value, 1) :]  # completed: earlier ones are moot
        elif word == "C":
            self.compactions = max(self.compactions, int(rest[0]))


def _run_round(
    directory: Path,
    round_: int,
    seed: int,
    durability: str,
    preallocate: int,
    seen: Seen,
    until_compaction: bool = False,
) -> int:
    """Start a worker, let it complete ``kill_after`` appends, SIGKILL it; lines read.
    ``until_compaction``: and, within the round's deadline, until a worker of this seed
    reported a finished compaction (under load a round's appends can all pass before one ends: a
    CI run saw none in 16 rounds, and the kill must land while compactions run)."""
    rng = random.Random(f"{seed}-{round_}")
    kill_after = rng.randrange(50, 400)
    proc = subprocess.Popen(
        [
            sys.executable,
            str(WORKER),
            str(directory),
            str(round_),
            str(seed),
            durability,
            str(preallocate),
        ],
        stdout=subprocess.PIPE,
        cwd=ROOT,
        text=True,
    )
    assert proc.stdout is not None
    appends = 0
    deadline = time.monotonic() + 60
    try:
        while appends < kill_after or (
            until_compaction and not seen.compactions and time.monotonic() < deadline - 10
        ):
            ready, _, _ = select.select(
                [proc.stdout], [], [], max(0.0, deadline - time.monotonic())
            )
            assert ready, "the worker stopped reporting"
            line = proc.stdout.readline()
            assert line, f"the worker ended early (code {proc.poll()})"
            seen.take(line)
            appends += line.startswith("A ")
        # a random extra moment so the kill lands anywhere in the writer's cycle
        time.sleep(rng.random() * 0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        for line in proc.stdout:  # what was reported before the kill still counts
            seen.take(line)
        proc.stdout.close()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    return appends


def _check(directory: Path, seen: Seen) -> None:
    with LogStore(directory) as store:
        present: dict[tuple[QueueKey, int], bytes] = {}
        for queue in store.queues():
            assert queue in QUEUES, f"invented queue {queue}"
            seqs = list(store.sequences(queue))
            assert len(seqs) == len(set(seqs)), "a sequence number twice"
            # every live record is listed (a restart reloads a queue from the listing)
            assert len(seqs) == store.bounds(queue).count, "a live record not listed"
            for record in store.records(queue):
                present[(queue, record.seq)] = record.blob
        for key, token in seen.acked.items():
            if key not in seen.removing:
                assert key in present, f"completed append lost: {key} {token}"
                assert present[key] == blob_for(token), f"wrong blob at {key}"
        for key in seen.removed:
            assert key not in present, f"completed removal undone: {key}"
        for key, blob in present.items():
            token = blob.split(b"|", 1)[0].decode()
            assert blob == blob_for(token), f"invented record at {key}: {blob[:40]!r}"
            if key in seen.acked:
                assert seen.acked[key] == token
        values = store.values()
        for name in NAMES:
            allowed = seen.values.get(name, ["-"])
            assert values.get(name, b"-").decode() in allowed, (name, values.get(name), allowed)
        assert set(values) <= set(NAMES)
        assert store.stats().recovered_records > 0


def _crash_rounds(tmp_path: Path, seed: int, rounds: int) -> Seen:
    durability = ["fsync", "batch", "os"][seed % 3]
    seen = Seen()
    directory = tmp_path / f"store-{seed}"
    for round_ in range(rounds):
        last = round_ == rounds - 1
        _run_round(directory, round_, seed, durability, _preallocate(seed), seen, last)
        _check(directory, seen)
    return seen


# fsync with zeros ahead, batch without (os never zeros ahead, batch with: 2 and 4, with
# ZH_ALL_VARIANTS=1; the slow test below runs every durability both ways)
@pytest.mark.parametrize("seed", variants(chosen=[0, 1], every=[0, 1, 2, 4]))
def test_kill_9_loses_nothing_completed(tmp_path: Path, seed: int) -> None:
    seen = _crash_rounds(tmp_path, seed, rounds=2)
    assert seen.acked and seen.removed


#: seeds 10-13 cover fsync/batch/os and zeros ahead on/off; ZH_ALL_VARIANTS=1: 10-21
MANY_SEEDS = variants(chosen=range(10, 14), every=range(10, 22))


@pytest.mark.slow
@pytest.mark.timeout(900)  # all 12 seeds: ~80 s on a quiet machine, 180-320 s under load
def test_kill_9_over_many_seeds(tmp_path: Path) -> None:
    compactions = 0
    for seed in MANY_SEEDS:
        seen = _crash_rounds(tmp_path, seed, rounds=4)
        compactions += seen.compactions
    assert compactions > 0, "no kill landed while compactions were running"
