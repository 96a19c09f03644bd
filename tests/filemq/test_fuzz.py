"""Random and mutated frames from several clients at once never stop the server."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from filemq import fmq_msg
from filemq.client import SyncResult
from filemq.server import FileServer

from .conftest import read_tree, write_tree

VALID: list[fmq_msg.Message] = [
    fmq_msg.Ohai(),
    fmq_msg.Icanhaz("/", {"RESYNC": "1"}, {"a": "0" * 40, "/b/c": "1" * 40}),
    fmq_msg.Icanhaz("/sub/", {}, {}),
    fmq_msg.Nom(1 << 20, 3),
    fmq_msg.Nom(1, 0),
    fmq_msg.Hugz(),
    fmq_msg.HugzOk(),
    fmq_msg.Kthxbai(),
    fmq_msg.OhaiOk(),
    fmq_msg.Cheezburger(1, 1, "/x", 0, 1, {"k": "v"}, b"data"),
    fmq_msg.Srsly("x"),
    fmq_msg.Rtfm("y"),
]


def _mutant(rng: random.Random) -> list[bytes]:
    base = bytearray(fmq_msg.encode(rng.choice(VALID))[0])
    kind = rng.randrange(8)
    if kind == 0:  # flip bytes
        for _ in range(rng.randint(1, 4)):
            base[rng.randrange(len(base))] = rng.randrange(256)
    elif kind == 1:  # truncate
        del base[rng.randrange(2, len(base) + 1) :]
    elif kind == 2:  # trailing garbage
        base += rng.randbytes(rng.randint(1, 64))
    elif kind == 3:  # random body after the signature
        base = bytearray(b"\xaa\xa3" + rng.randbytes(rng.randint(0, 200)))
    elif kind == 4:  # no signature at all
        return [rng.randbytes(rng.randint(0, 100))]
    elif kind == 5:  # extra frames
        return [bytes(base), rng.randbytes(rng.randint(0, 20))]
    elif kind == 6:  # huge lengths in dictionaries and strings
        for pos in range(3, len(base) - 4, 7):
            base[pos : pos + 4] = b"\xff\xff\xff\xff"
    return [bytes(base)]  # kind 7: the valid message itself


def _fuzzer(ctx: zmq.Context[Any], endpoint: str, seed: int, errors: list[BaseException]) -> None:
    rng = random.Random(seed)
    socks = []
    try:
        for _ in range(2):
            s = ctx.socket(zmq.DEALER)
            s.linger = 0
            s.connect(endpoint)
            socks.append(s)
        for _ in range(400):
            s = rng.choice(socks)
            if rng.random() < 0.3:  # sometimes a plausible prefix first
                s.send_multipart(fmq_msg.encode(fmq_msg.Ohai()))
            s.send_multipart(_mutant(rng))
            while s.poll(0):
                s.recv_multipart()  # replies (RTFM, OHAI-OK, chunks): read and ignore
        for s in socks:  # sentinel: once OHAI-OK comes back, everything before was handled
            s.send_multipart(fmq_msg.encode(fmq_msg.Kthxbai()))
            s.send_multipart(fmq_msg.encode(fmq_msg.Ohai()))
            while s.poll(5000):
                if fmq_msg.decode(s.recv_multipart()) == fmq_msg.OhaiOk():
                    break
            else:
                raise AssertionError("server stopped answering")
    except BaseException as exc:  # pragma: no cover - reported by the test
        errors.append(exc)
    finally:
        for s in socks:
            s.close()


def test_fuzzed_server_still_serves_a_good_client(
    tmp_path: Path,
    serve: Callable[..., FileServer],
    sync_once: Callable[..., SyncResult],
    zctx: zmq.Context[Any],
) -> None:
    tree = {"a": b"alpha", "b/c": b"gamma" * 1000, "sub/d": b""}
    write_tree(tmp_path / "src", tree)
    server = serve(tmp_path / "src", chunk_size=1000)
    errors: list[BaseException] = []
    threads = [
        threading.Thread(target=_fuzzer, args=(zctx, server.endpoint, seed, errors))
        for seed in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert server._thread is not None and server._thread.is_alive()
    result = sync_once(server.endpoint, tmp_path / "dest")
    assert result.synced and read_tree(tmp_path / "dest") == tree


def test_direct_protocol_answers(
    tmp_path: Path, serve: Callable[..., FileServer], zctx: zmq.Context[Any]
) -> None:
    write_tree(tmp_path / "src", {"f": b"12345"})
    server = serve(tmp_path / "src")
    s = zctx.socket(zmq.DEALER)
    s.linger = 0
    s.connect(server.endpoint)

    def ask(msg: fmq_msg.Message | list[bytes]) -> fmq_msg.Message:
        s.send_multipart(msg if isinstance(msg, list) else fmq_msg.encode(msg))
        assert s.poll(5000), f"no answer to {msg!r}"
        return fmq_msg.decode(s.recv_multipart())

    try:
        assert isinstance(ask(fmq_msg.Nom(5, 0)), fmq_msg.Rtfm)  # before OHAI
        s.send_multipart([b"garbage without signature"])
        assert isinstance(ask(fmq_msg.Ohai()), fmq_msg.OhaiOk)  # garbage dropped silently
        assert isinstance(ask(fmq_msg.Hugz()), fmq_msg.HugzOk)
        assert isinstance(ask(fmq_msg.Icanhaz("/", {"RESYNC": "1"}, {})), fmq_msg.IcanhazOk)
        got: list[fmq_msg.Cheezburger] = []
        for credit in (2, 2, 2):  # 5 bytes in credits of 2: chunks 2, 2, 1, then the marker
            s.send_multipart(fmq_msg.encode(fmq_msg.Nom(credit, 0)))
            while s.poll(300):
                msg = fmq_msg.decode(s.recv_multipart())
                assert isinstance(msg, fmq_msg.Cheezburger)
                got.append(msg)
        chunks = [(c.filename, c.offset, len(c.chunk), c.eof) for c in got]
        assert chunks == [("/f", 0, 2, 0), ("/f", 2, 2, 0), ("/f", 4, 1, 1), ("", 0, 0, 1)]
        assert [c.sequence for c in got] == [0, 1, 2, 3]
        assert isinstance(ask(fmq_msg.Ohai()), fmq_msg.Rtfm)  # OHAI twice: unexpected
    finally:
        s.close()
