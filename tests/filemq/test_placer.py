"""Whole small files placed beside the receive loop (``filemq.placer``): in order, every
outcome handed back, bounded; end to end, a burst with a bad file in the middle.

Adversaries: a job that fails (its error comes back, the jobs after it still run, in
order); a disk that takes nothing (the submitter waits at the bound instead of queueing
without end); a server whose file in the middle of a burst does not match its SHA-1
(fetched again, the rest of the burst placed, the mirror exact).  The same rules hold
with the jobs run inline (``Placer(thread=False)``, ``sync --placer inline``).
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zmq

from filemq import fmq_msg
from filemq.client import SyncClient, SyncResult
from filemq.engine import HEADER_PATH, HEADER_RESYNC, RESYNC_COMPLETE, Operation
from filemq.placer import Placer
from filemq.server import FileServer
from tests.polling import wait_until

from .conftest import read_tree, write_tree


def recv_decoded(router: zmq.Socket[Any], timeout_ms: int) -> tuple[bytes, Any]:
    """A hand-driven server's next message from the mirror: its identity, decoded."""
    assert router.poll(timeout_ms), "the mirror sent nothing"
    ident, frame = router.recv_multipart()
    return ident, fmq_msg.decode([frame])


@pytest.mark.parametrize("thread", [True, False], ids=["thread", "inline"])
def test_jobs_run_in_order_and_every_outcome_comes_back_in_that_order(thread: bool) -> None:
    placer: Placer[int] = Placer(thread=thread)
    ran: list[int] = []

    def job(i: int) -> int:
        ran.append(i)
        if i == 3:
            raise OSError(28, "No space left on device")
        return i * 10

    try:
        for i in range(8):
            placer.submit(lambda i=i: job(i), 100, f"t{i}")
        done = placer.settle()
        assert ran == list(range(8))  # one after the other, as submitted
        assert [token for token, _ in done] == [f"t{i}" for i in range(8)]
        assert [r for _, r in done if not isinstance(r, Exception)] == [0, 10, 20, 40, 50, 60, 70]
        failed = done[3][1]
        assert isinstance(failed, OSError) and failed.errno == 28  # handed back, not lost
        assert placer.settled and placer.settle() == []  # collected once
    finally:
        placer.close()


def test_a_disk_that_takes_nothing_holds_the_submitter_not_memory() -> None:
    placer: Placer[None] = Placer(max_pending=1000)
    gate = threading.Event()
    returned: list[int] = []

    def submit() -> None:
        for i in range(4):
            placer.submit(gate.wait, 600, i)  # (a job that waits for the "disk")
            returned.append(i)

    thread = threading.Thread(target=submit)
    thread.start()
    try:
        assert wait_until(lambda: len(returned) == 2)  # one running, one queued
        thread.join(0.3)  # the third must wait: 1,200 bytes pending, over the bound
        assert returned == [0, 1] and thread.is_alive()
        gate.set()
        thread.join(10)
        assert returned == [0, 1, 2, 3]
        assert [token for token, _ in placer.settle()] == [0, 1, 2, 3]
    finally:
        gate.set()
        thread.join(10)
        placer.close()


@pytest.mark.parametrize("thread", [True, False], ids=["thread", "inline"])
def test_collect_takes_what_was_placed_in_order_and_stops_holding_it(thread: bool) -> None:
    """At the content bound the client collects the outcomes done so far instead of
    waiting for every job (the worker's queue does not run dry): they come back in
    order and stop counting as held; the rest come with the next collect or settle."""
    placer: Placer[int] = Placer(thread=thread)
    try:
        for i in range(40):
            placer.submit(lambda i=i: i, 10, i)
        first = placer.collect()  # (waits for one run at least: none may be done yet)
        assert first and [token for token, _ in first] == list(range(len(first)))
        assert placer.held == 10 * (40 - len(first))
        rest = placer.settle()
        assert [token for token, _ in first + rest] == list(range(40))
        assert placer.held == 0 and placer.settled
    finally:
        placer.close()


def test_collect_waits_for_a_stalled_job_never_hands_it_back_unrun() -> None:
    placer: Placer[str] = Placer()
    started, gate = threading.Event(), threading.Event()

    def stalled() -> str:  # (a disk that stalls on this file)
        started.set()
        gate.wait()
        return "placed"

    collected: list[Any] = []
    waiter = threading.Thread(target=lambda: collected.extend(placer.collect()))
    try:
        placer.submit(stalled, 10, "slow")
        assert started.wait(10)
        placer.submit(lambda: "placed", 10, "after")
        waiter.start()
        waiter.join(0.3)  # nothing was done: collect waits for the run under way
        assert waiter.is_alive() and not collected
        gate.set()
        waiter.join(10)
        assert collected[0] == ("slow", "placed")
        rest = placer.settle()
        assert [token for token, _ in collected + rest] == ["slow", "after"]
        assert placer.held == 0
    finally:
        gate.set()
        if waiter.is_alive():
            waiter.join(10)
        placer.close()


def test_close_runs_what_was_submitted_then_a_new_job_starts_the_worker_again() -> None:
    placer: Placer[str] = Placer()
    placer.submit(lambda: "a", 1, 1)
    placer.close()
    placer.submit(lambda: "b", 1, 2)
    try:
        assert placer.settle() == [(1, "a"), (2, "b")]
    finally:
        placer.close()


@pytest.mark.parametrize("inline", [False, True], ids=["thread", "inline"])
def test_a_bad_file_in_the_middle_of_a_burst_is_fetched_again_the_rest_placed(
    tmp_path: Path, zctx: zmq.Context[Any], inline: bool
) -> None:
    """A hand-driven server sends 40 whole small files in one burst, the 20th with a
    SHA-1 that does not match: every other file is placed while the burst is received,
    the bad one is asked for again (an ICANHAZ of its name, sent once the burst's files
    are placed) and its good copy lands; DEST ends exact, no temp file left."""
    dest = tmp_path / "dest"
    router = zctx.socket(zmq.ROUTER)
    router.linger = 0
    port = router.bind_to_random_port("tcp://127.0.0.1")
    files = {f"d{i % 4}/f{i:02d}": bytes([i]) * (1000 + i) for i in range(40)}
    client = SyncClient(
        zctx, f"tcp://127.0.0.1:{port}", dest, once=True, max_retries=0, place_inline=inline
    )
    outcome: list[SyncResult] = []
    thread = threading.Thread(target=lambda: outcome.append(client.run()))
    thread.start()
    try:

        def recv() -> tuple[bytes, Any]:
            return recv_decoded(router, 20_000)

        ident, msg = recv()
        assert isinstance(msg, fmq_msg.Ohai)
        router.send_multipart([ident, *fmq_msg.encode(fmq_msg.OhaiOk())])
        icanhaz = [m for _i, m in (recv(), recv()) if isinstance(m, fmq_msg.Icanhaz)]
        assert icanhaz and icanhaz[0].path == "/"
        router.send_multipart([ident, *fmq_msg.encode(fmq_msg.IcanhazOk())])
        sequence = 0

        def send(name: str, data: bytes, sha1: str) -> None:
            nonlocal sequence
            headers = {"sha1": sha1, "size": str(len(data)), "mtime_ns": "1000000000"}
            msg = fmq_msg.Cheezburger(
                sequence, int(Operation.CREATE), "/" + name, 0, 1, headers, data
            )
            router.send_multipart([ident, *fmq_msg.encode(msg)])
            sequence += 1

        for name, data in files.items():  # one burst: nothing waits for the mirror
            bad = name == "d3/f19"
            send(name, data, ("0" * 40) if bad else hashlib.sha1(data).hexdigest())
        again = None
        while again is None:
            _i, msg = recv()
            if isinstance(msg, fmq_msg.Icanhaz):
                again = msg
        assert again.path == "/d3/f19"  # only the bad one is asked for again
        router.send_multipart([ident, *fmq_msg.encode(fmq_msg.IcanhazOk())])
        send("d3/f19", files["d3/f19"], hashlib.sha1(files["d3/f19"]).hexdigest())
        for path in ("/", "/d3/f19"):  # each resync asked for is complete
            headers = {HEADER_RESYNC: RESYNC_COMPLETE, HEADER_PATH: path}
            marker = fmq_msg.Cheezburger(sequence, int(Operation.MARKER), "", 0, 1, headers, b"")
            router.send_multipart([ident, *fmq_msg.encode(marker)])
            sequence += 1
        thread.join(30)
        assert not thread.is_alive() and outcome and outcome[0].synced
        assert outcome[0].files == 40 and outcome[0].refetched == 1
        assert read_tree(dest) == files
    finally:
        client.stop()
        thread.join(30)
        router.close()


def test_not_settled_until_the_outcomes_are_collected() -> None:
    """A job that ran but whose outcome was not collected yet still counts: the client
    settles before a resync's end is reported, so that its files are reported first."""
    placer: Placer[str] = Placer()
    ran = threading.Event()

    def job() -> str:
        ran.set()
        return "placed"

    try:
        assert placer.settled
        placer.submit(job, 1, "f")
        assert ran.wait(10)
        assert not placer.settled  # ran, not collected
        assert placer.settle() == [("f", "placed")]
        assert placer.settled
    finally:
        placer.close()


@pytest.mark.parametrize("cpus", [1, 2], ids=["one-cpu", "two-cpus"])
def test_the_default_places_on_a_thread_only_with_two_cpus_or_more(
    tmp_path: Path, zctx: zmq.Context[Any], serve: Callable[..., FileServer], cpus: int
) -> None:
    """``place_inline=None`` (``--placer auto``): a mirror that may run on one CPU puts
    small files in place itself (a thread there only adds hand-offs: docs/performance.md),
    one with two or more on the placer thread.  Seen from the threads alive while files land."""
    mine = sorted(os.sched_getaffinity(0))
    if len(mine) < cpus:
        pytest.skip(f"this process may use {len(mine)} CPU(s)")
    files = {f"d{i % 3}/f{i}": b"%d" % i * 100 for i in range(30)}
    write_tree(tmp_path / "src", files)
    server = serve(tmp_path / "src")
    threads_seen: set[str] = set()
    outcome: list[SyncResult] = []

    def on_event(event: Any) -> None:
        threads_seen.update(t.name for t in threading.enumerate())

    def mirror() -> None:
        os.sched_setaffinity(0, mine[:cpus])  # (this thread; the threads it starts inherit)
        client = SyncClient(zctx, server.endpoint, tmp_path / "dest", once=True, on_event=on_event)
        outcome.append(client.run())

    thread = threading.Thread(target=mirror)
    thread.start()
    thread.join(60)
    assert not thread.is_alive() and outcome and outcome[0].files == len(files)
    assert read_tree(tmp_path / "dest") == files
    assert ("filemq-placer" in threads_seen) is (cpus > 1), sorted(threads_seen)


def test_jobs_taken_in_runs_still_hold_the_bound_until_they_are_done() -> None:
    """The worker takes several jobs at once (a run): they count as pending until they
    have run, so a disk that takes nothing still holds the submitter at the bound (10
    jobs of 100 bytes), not at the bound plus a run; once the disk takes them, all 300
    are placed in order and what waited never passed the bound."""
    bound, size = 1000, 100
    placer: Placer[None] = Placer(max_pending=bound)
    gate = threading.Event()
    lock = threading.Lock()
    submitted = done = worst = 0

    def job() -> None:
        nonlocal done
        gate.wait()  # (the "disk")
        with lock:
            done += 1

    def submit() -> None:
        nonlocal submitted, worst
        for i in range(300):
            placer.submit(job, size, i)
            with lock:
                submitted += 1
                worst = max(worst, (submitted - done) * size)

    thread = threading.Thread(target=submit)
    thread.start()
    try:
        assert wait_until(lambda: submitted == bound // size)  # the bound is reached
        # (a slow machine can only hide a fault here, never fail a good placer)
        assert not wait_until(lambda: submitted > bound // size, timeout=0.5)
        gate.set()
        thread.join(30)
        assert [token for token, _ in placer.settle()] == list(range(300))
        assert done == 300 and worst <= bound
    finally:
        gate.set()
        thread.join(30)
        placer.close()
