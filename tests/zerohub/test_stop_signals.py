"""Servers stop on SIGINT/SIGTERM through ``zerohub.cli.stop_signals``, however many come.

In-process: the handler raises nothing (a KeyboardInterrupt raised by a handler that lands
in a finaliser is dropped: ``broker serve`` once never stopped), a second signal changes
nothing, a slow stop dumps the threads' stacks.  Real processes (``filemq serve``,
``broker serve``, ``zerohub serve``): a second and a third signal while the first one's
stop is under way, exit 0, no traceback.  And ``zerohub serve``'s serving line tells true
file counts when it starts from a saved index that the disk no longer matches.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.filemq.conftest import write_tree
from tests.polling import wait_until
from tests.ports import free_port
from zerohub.cli import stop_signals

from .support import WAIT

# -- in process --------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def sigint_is_ctrl_c() -> Iterator[None]:
    """SIGINT as in a foreground process (a suite run as a background job ignores it, and
    stop_signals then leaves it ignored, as Python does)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class SignalInFinaliser:
    """An object whose finaliser is running when a signal's Python handler runs."""

    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(10_000):  # the handler runs at one of these bytecodes, in here
            pass


def test_a_signal_handled_inside_a_finaliser_still_stops() -> None:
    # (the old sigterm handler raised KeyboardInterrupt from the handler: raised in a
    # finaliser, such as a ZeroMQ frame's, it is printed as "Exception ignored" and
    # dropped, and `broker serve` went on serving after its SIGTERM)
    with stop_signals("test", final=False) as stop:
        SignalInFinaliser()  # dropped at once: its finaliser runs here
        assert stop.wait(WAIT), "the signal was lost"
        assert stop.signum == signal.SIGTERM


def test_a_second_signal_during_the_stop_changes_nothing(
    capfd: pytest.CaptureFixture[str],
) -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with stop_signals("test", final=False) as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.wait(WAIT)
        os.kill(os.getpid(), signal.SIGINT)  # raises nothing: the stop goes on
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.signum == signal.SIGTERM  # the first one
    err = capfd.readouterr().err
    assert "test: stopping (SIGTERM)\n" in err
    assert "test: already stopping (SIGINT)\n" in err
    assert {s: signal.getsignal(s) for s in before} == before  # given back afterwards


def test_a_stop_slower_than_its_limit_dumps_every_thread(
    capfd: pytest.CaptureFixture[str],
) -> None:
    seen = ""

    def dumped() -> bool:
        nonlocal seen
        seen += capfd.readouterr().err
        return "most recent call first" in seen

    with stop_signals("test", dump_after=0.2, final=False) as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.wait(WAIT)
        assert wait_until(dumped), seen  # the stop "hangs" here: where is said on stderr
        assert "test_stop_signals.py" in seen


def test_a_process_that_stops_ignores_later_signals_until_it_exits() -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with stop_signals("test") as stop:
            pass
        assert {s: signal.getsignal(s) for s in before} == before  # no signal: given back
        with stop_signals("test") as stop:
            os.kill(os.getpid(), signal.SIGTERM)
            assert stop.wait(WAIT)
        assert {s: signal.getsignal(s) for s in before} == dict.fromkeys(before, signal.SIG_IGN)
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


# -- real processes ------------------------------------------------------------------------


def _env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "XDG_STATE_HOME": str(tmp_path / "state"),
    }


class Server:
    """A server process; stderr to a file (read while it runs, nothing can fill up)."""

    def __init__(self, tmp_path: Path, *argv: str) -> None:
        self.log = tmp_path / f"{argv[0]}-{len(list(tmp_path.glob('*.log')))}.log"
        with open(self.log, "wb") as err:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", *argv],
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=_env(tmp_path),
            )

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, pattern: str) -> re.Match[str]:
        found: list[re.Match[str]] = []

        def logged() -> bool:
            match = re.search(pattern, self.stderr())
            if match:
                found.append(match)
            assert match or self.popen.poll() is None, f"exited early:\n{self.stderr()}"
            return match is not None

        assert wait_until(logged, WAIT), f"{pattern!r} never logged:\n{self.stderr()}"
        return found[0]

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(WAIT)


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    started: list[Server] = []
    yield started
    for server in started:
        server.kill()


def _stop_three_times(server: Server, prog: str) -> None:
    """SIGTERM; once the process says it is stopping, SIGINT and SIGTERM (``timeout``
    sends two signals, an impatient Ctrl-C comes twice): one clean stop, exit 0."""
    server.popen.send_signal(signal.SIGTERM)
    server.wait_for(rf"{prog}: stopping \(SIGTERM\)")
    server.popen.send_signal(signal.SIGINT)
    server.popen.send_signal(signal.SIGTERM)
    assert server.popen.wait(WAIT) == 0, server.stderr()
    err = server.stderr()
    assert "Traceback" not in err and "Exception ignored" not in err, err


def test_filemq_serve_stops_once_whatever_signals_follow(
    tmp_path: Path, servers: list[Server]
) -> None:
    write_tree(tmp_path / "pub", {f"f{i}.txt": b"x" * i for i in range(50)})
    server = Server(
        tmp_path, "filemq", "serve", "--publish", str(tmp_path / "pub"), "--bind",
        "tcp://127.0.0.1:*",
    )  # fmt: skip
    servers.append(server)
    server.wait_for(r"filemq: serving .* on tcp://")
    _stop_three_times(server, "filemq")


def test_broker_serve_stops_once_whatever_signals_follow(
    tmp_path: Path, servers: list[Server]
) -> None:
    server = Server(tmp_path, "broker", "serve", "--bind", f"tcp://127.0.0.1:{free_port()}")
    servers.append(server)
    server.wait_for(r"broker serving on tcp://")
    _stop_three_times(server, "broker")


def test_zerohub_serve_stops_once_whatever_signals_follow(
    tmp_path: Path, servers: list[Server]
) -> None:
    (tmp_path / "pub").mkdir()
    server = Server(
        tmp_path, "zerohub", "serve", "--publish", str(tmp_path / "pub"), "--bind",
        "tcp://127.0.0.1:*", "--broker-bind", "tcp://127.0.0.1:*", "--no-state",
    )  # fmt: skip
    servers.append(server)
    server.wait_for(r"zerohub: serving .* on tcp://")
    _stop_three_times(server, "zerohub")


# -- zerohub serve's counts ------------------------------------------------------------------


def test_zerohub_serve_tells_true_counts_when_the_saved_index_is_stale(
    tmp_path: Path, servers: list[Server]
) -> None:
    """The serving line used to show the saved index's counts as the served ones, before
    the server had checked them against the disk (files gone or added meanwhile)."""
    pub, state = tmp_path / "pub", tmp_path / "saved"
    write_tree(pub, {f"old{i}.txt": b"old %d" % i for i in range(20)})
    argv = (
        "zerohub", "serve", "--publish", str(pub), "--bind", "tcp://127.0.0.1:*",
        "--broker-bind", "tcp://127.0.0.1:*", "--state-dir", str(state),
    )  # fmt: skip
    first = Server(tmp_path, *argv)
    servers.append(first)
    first.wait_for(r"zerohub: serving .* \(20 files, 20 hashed")
    first.popen.send_signal(signal.SIGTERM)
    assert first.popen.wait(WAIT) == 0, first.stderr()
    assert list(state.rglob("*")), "no index was saved"
    # while it is down: 15 files go, 30 come
    for i in range(15):
        (pub / f"old{i}.txt").unlink()
    write_tree(pub, {f"new{i}.txt": b"new %d" % i for i in range(30)})
    second = Server(tmp_path, *argv)
    servers.append(second)
    line = second.wait_for(r"zerohub: serving .* \((.*)\)\n").group(1)
    if "in the saved index" in line:
        assert re.match(r"\d+ files in the saved index, checking them against the disk", line)
        checked = second.wait_for(r"zerohub: checked .* against the disk \((.*)\)").group(1)
        assert checked.startswith("35 files, "), checked  # (new ones may still be hashing)
    else:  # checked before the line was printed: the counts are the true ones
        assert line.startswith("35 files, "), line
    second.popen.send_signal(signal.SIGTERM)
    assert second.popen.wait(WAIT) == 0, second.stderr()
