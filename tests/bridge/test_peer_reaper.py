"""The peers' reaper: a test run killed by ``timeout`` leaves its peer brokers running
(they are in sessions of their own); the next run's first peer start kills them.

The peer here is a tiny listener (a Python process) so that this runs in a second; the
records go to a directory of the test's own (``ZEROHUB_TEST_PEERS``), so the reaper never
sees the peers of the other test runs on the machine.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.bridge import peers
from tests.bridge.peers import PeerProcess, reap_stale
from tests.polling import wait_until
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]

LISTENER = (
    "import socket, sys, time\n"
    "s = socket.socket()\n"
    "s.bind(('127.0.0.1', int(sys.argv[1])))\n"
    "s.listen()\n"
    "time.sleep(300)\n"
)

# A test process: starts a listener peer, prints its pid, then waits to be killed.
OWNER = (
    "import sys, time\n"
    "from pathlib import Path\n"
    "from tests.bridge.peers import PeerProcess\n"
    "port, work = int(sys.argv[1]), Path(sys.argv[2])\n"
    "command = [sys.executable, '-c', sys.argv[3], str(port)]\n"
    "peer = PeerProcess('listener', command, work, (port,))\n"
    "peer.start(30)\n"
    "assert peer.proc is not None\n"
    "print(peer.proc.pid, flush=True)\n"
    "time.sleep(300)\n"
)


def alive(pid: int) -> bool:
    return peers._started(pid) is not None


@pytest.fixture
def records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    directory = tmp_path / "records"
    monkeypatch.setenv("ZEROHUB_TEST_PEERS", str(directory))
    yield directory
    for path in directory.glob("*.json"):  # nothing of a failed test may keep running
        pid = json.loads(path.read_text())["pid"]
        if alive(pid):
            os.killpg(pid, signal.SIGKILL)


def test_a_killed_test_runs_peer_is_reaped_by_the_next_run(records: Path, tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(port), str(tmp_path), LISTENER],
        stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env,
    )  # fmt: skip
    try:
        assert owner.stdout is not None
        line = owner.stdout.readline()
        assert line.strip().isdigit(), f"the owner did not start its peer: {line!r}"
        peer = int(line)
        assert [p.name for p in records.glob("*.json")] == [f"{peer}.json"]
        owner.kill()  # what `timeout -s KILL` does to a pytest run
        owner.wait(10)
    finally:
        owner.kill()
        owner.wait(10)
        assert owner.stdout is not None
        owner.stdout.close()
    # the leak: the peer outlives its owner, still listening
    assert alive(peer) and peers.port_open(port)

    assert reap_stale() == [f"listener {peer}"]  # what the next run's first peer start does
    assert wait_until(lambda: not alive(peer), 10.0)
    assert not list(records.glob("*.json"))
    assert wait_until(lambda: not peers.port_open(port), 10.0)


def test_a_live_runs_peers_and_pid_reusers_are_left_alone(records: Path, tmp_path: Path) -> None:
    port = free_port()
    mine = PeerProcess("listener", [sys.executable, "-c", LISTENER, str(port)], tmp_path, (port,))
    mine.start(30)
    # an unrelated process now holds the pid a dead run's record names (pid reuse)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        assert mine.proc is not None
        stale = records / f"{bystander.pid}.json"
        stale.write_text(
            json.dumps(
                {
                    "name": "rabbitmq-server",
                    "pid": bystander.pid,
                    "started": peers._started(bystander.pid) - 1,  # type: ignore[operator]
                    "owner": 2**22 + 1,  # above pid_max: surely gone
                    "owner_started": 1,
                }
            )
        )
        (records / "torn.json").write_text('{"pid": 1')  # a record cut by a kill -9

        assert reap_stale() == []
        assert alive(mine.proc.pid) and mine.listening()  # its owner (this run) is alive
        assert bystander.poll() is None  # not the recorded process: not killed
        assert sorted(p.name for p in records.glob("*.json")) == [f"{mine.proc.pid}.json"]
    finally:
        bystander.kill()
        bystander.wait(10)
        mine.stop()
    assert not list(records.glob("*.json"))  # a stopped peer is forgotten
