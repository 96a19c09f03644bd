"""The placer's bound holds for what it keeps alive, not only for what waits for it
(``filemq.placer``: ``held``; ``filemq.client._perform``).

A placed small file keeps its content in memory until the client collects its outcome
(``Placer.settle``: the outcome's token is the chunk).  The client collected only after
each wait for the socket or before its next other action: with the default credit window
(16 MiB) that is a grant every 4 MiB received, but with ``sync --window 64M`` (grants every
16 MiB) and a disk as fast as the wire nothing waited for the worker, so ``max_pending``
never held, and up to 256 whole files (one receive budget; 256 MiB with the default
1 MiB chunk) or a grant's worth stayed alive.  The schedule here is forced, not
timed: the mirror's first small file holds the receive loop until the hand-driven server
has put its whole burst in the mirror's pipe (inproc: a sent message is in the peer's
pipe when ``send`` returns), so the loop then reads the burst without a wait between.
"""

from __future__ import annotations

import hashlib
import threading
import uuid
import weakref
from pathlib import Path
from typing import Any

import pytest
import zmq

from filemq import client as client_module
from filemq import fmq_msg
from filemq.client import SyncClient, SyncResult
from filemq.engine import HEADER_PATH, HEADER_RESYNC, RESYNC_COMPLETE, Operation
from filemq.placer import MAX_PENDING, Placer
from tests.polling import WAIT

from .conftest import read_tree
from .test_placer import recv_decoded

#: The burst: whole small files, together half again the placer's bound.
FILES = 60
SIZE = 200 << 10
#: The mirror's credit window (``sync --window``): its grants (every quarter) come after
#: the burst, so no other action makes it settle in between.
WINDOW = 64 << 20


class Recording(Placer[Any]):
    """A placer that measures what it keeps alive on its own (the content of the chunks
    submitted, less those handed back by ``settle`` or ``collect``) and holds its first
    ``submit`` until ``go`` is set."""

    go = threading.Event()
    seen: list[int] = []  # the largest amount of content alive, per placer

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.alive = 0
        self.first = True
        Recording.seen.append(0)

    def submit(self, job: Any, size: int, token: Any) -> None:
        if self.first:
            self.first = False
            assert Recording.go.wait(WAIT), "the burst was never sent"
        super().submit(job, size, token)
        self.alive += len(token.data)
        Recording.seen[-1] = max(Recording.seen[-1], self.alive)

    def settle(self) -> list[tuple[Any, Any]]:
        return self._released(super().settle())

    def collect(self) -> list[tuple[Any, Any]]:
        return self._released(super().collect())

    def _released(self, done: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
        self.alive -= sum(len(token.data) for token, _ in done)
        return done


@pytest.mark.parametrize("inline", [False, True], ids=["thread", "inline"])
def test_a_burst_of_small_files_keeps_at_most_the_bound_alive(
    tmp_path: Path, zctx: zmq.Context[Any], monkeypatch: pytest.MonkeyPatch, inline: bool
) -> None:
    monkeypatch.setattr(client_module, "Placer", Recording)
    monkeypatch.setattr(Recording, "go", threading.Event())
    monkeypatch.setattr(Recording, "seen", [])
    dest = tmp_path / "dest"
    endpoint = f"inproc://placer-bound-{uuid.uuid4().hex}"
    router = zctx.socket(zmq.ROUTER)
    router.linger = 0
    router.bind(endpoint)
    files = {f"d{i % 3}/f{i:02d}": bytes([i]) * SIZE for i in range(FILES)}
    client = SyncClient(
        zctx, endpoint, dest, once=True, max_retries=0, place_inline=inline, window=WINDOW
    )
    outcome: list[SyncResult] = []
    thread = threading.Thread(target=lambda: outcome.append(client.run()))
    thread.start()
    try:

        def recv() -> tuple[bytes, Any]:
            return recv_decoded(router, WAIT * 1000)

        ident, msg = recv()
        assert isinstance(msg, fmq_msg.Ohai)
        router.send_multipart([ident, *fmq_msg.encode(fmq_msg.OhaiOk())])
        while not isinstance(msg, fmq_msg.Icanhaz):
            _i, msg = recv()
        router.send_multipart([ident, *fmq_msg.encode(fmq_msg.IcanhazOk())])
        for sequence, (name, data) in enumerate(files.items()):
            headers = {"sha1": hashlib.sha1(data).hexdigest(), "size": str(len(data)),
                       "mtime_ns": "1000000000"}  # fmt: skip
            msg = fmq_msg.Cheezburger(sequence, int(Operation.CREATE), "/" + name, 0, 1,
                                      headers, data)  # fmt: skip
            router.send_multipart([ident, *fmq_msg.encode(msg)])
        Recording.go.set()  # (the whole burst is in the mirror's pipe)
        headers = {HEADER_RESYNC: RESYNC_COMPLETE, HEADER_PATH: "/"}
        marker = fmq_msg.Cheezburger(FILES, int(Operation.MARKER), "", 0, 1, headers, b"")
        router.send_multipart([ident, *fmq_msg.encode(marker)])
        thread.join(WAIT)
        assert not thread.is_alive() and outcome and outcome[0].synced
        assert outcome[0].files == FILES and read_tree(dest) == files
        assert len(Recording.seen) == 1
        assert 0 < Recording.seen[0] <= MAX_PENDING + SIZE  # (the bound, and one file)
    finally:
        Recording.go.set()
        client.stop()
        thread.join(WAIT)
        router.close()


class _Content:
    """Stands for a job's content: alive while something refers to it."""

    def __call__(self) -> str:
        return "placed"


def test_the_worker_keeps_nothing_of_a_run_once_its_outcomes_are_collected() -> None:
    placer: Placer[str] = Placer()
    job, token = _Content(), _Content()
    alive = (weakref.ref(job), weakref.ref(token))
    try:
        placer.submit(job, 1, token)
        del job, token
        assert placer.settle() == [(alive[1](), "placed")]
        assert [ref() for ref in alive] == [None, None]  # (nothing left on the worker)
        assert placer.held == 0
    finally:
        placer.close()
