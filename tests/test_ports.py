"""The test ports' rule (tests/ports.py): never the same port twice in a process, never a
port another live test process holds, given back by the kernel when a holder dies."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ports import PortPool, PortsExhausted, ephemeral_range, free_port

WAIT = 30.0

# a child process taking ports of a small range from the same lock file, printing them,
# then holding them until its stdin closes (or it is killed)
_HOLDER = """
import sys
from pathlib import Path
from tests.ports import PortPool
low, high, path, count = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
pool = PortPool(range(low, high), path)
print(" ".join(str(pool.take()) for _ in range(count)), flush=True)
sys.stdin.read()
"""


def _free_run(count: int) -> range:
    """``count`` consecutive free ports above the ephemeral range: ports no test process's
    ``free_port`` hands out (they come from below it) and the kernel does not pick, so
    the pools of these tests on their own lock files race nobody."""
    _low, high = ephemeral_range()
    for start in range(high + 1, 65536 - count, count):
        block = range(start, start + count)
        socks = []
        try:
            for port in block:
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
        return block
    pytest.skip("no run of free ports below the ephemeral range")


def _holder(block: range, path: Path, count: int) -> tuple[subprocess.Popen[str], set[int]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(block.start), str(block.stop), str(path), str(count)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    held = {int(p) for p in proc.stdout.readline().split()}
    assert len(held) == count, held
    return proc, held


def test_many_calls_never_repeat_and_each_port_binds() -> None:
    ports = [free_port() for _ in range(600)]
    assert len(set(ports)) == len(ports), sorted(p for p in ports if ports.count(p) > 1)
    low, _high = ephemeral_range()
    assert all(p < low for p in ports)  # never one the kernel may give a connection
    socks = [socket.socket() for _ in ports]
    try:
        for sock, port in zip(socks, ports, strict=True):
            sock.bind(("127.0.0.1", port))  # all at once: each was free and ours
    finally:
        for sock in socks:
            sock.close()


def test_a_pool_hands_out_its_whole_range_once_then_says_so(tmp_path: Path) -> None:
    block = _free_run(30)
    pool = PortPool(block, tmp_path / "ports.lock")
    taken = [pool.take() for _ in block]
    assert sorted(taken) == list(block)
    with pytest.raises(PortsExhausted, match=f"{block.start}-{block.stop - 1}"):
        pool.take()
    pool.close()


def test_another_process_holding_ports_keeps_them_until_it_is_killed(tmp_path: Path) -> None:
    block = _free_run(40)
    path = tmp_path / "ports.lock"
    proc, held = _holder(block, path, 25)
    try:
        pool = PortPool(block, path)
        mine = {pool.take() for _ in range(15)}
        assert mine == set(block) - held  # disjoint: the rest of the range exactly
        with pytest.raises(PortsExhausted):
            pool.take()
        proc.send_signal(signal.SIGKILL)  # no cleanup runs: the kernel drops its locks
        proc.wait(WAIT)
        assert {pool.take() for _ in range(25)} == held  # (waited: its locks are gone)
        pool.close()
    finally:
        proc.kill()
        proc.communicate()


def test_a_port_someone_listens_on_is_never_handed_out(tmp_path: Path) -> None:
    block = _free_run(20)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", block.start + 7))
        busy.listen()
        pool = PortPool(block, tmp_path / "ports.lock")
        taken = {pool.take() for _ in range(19)}
        assert block.start + 7 not in taken
        with pytest.raises(PortsExhausted):
            pool.take()
        pool.close()
