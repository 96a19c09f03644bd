"""``filemq`` command line safety: key pairs kept, bounded waits, errors that say why."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

from tests.ports import free_port
from tests.zerohub.support import (
    GreetingPeer,
    cli,
    one_line,
    run_into_closed_pipe,
    silent_peer,
)
from zerohub.cli import ExitCode

from .conftest import read_tree, write_tree
from .test_cli import _env, _start_server, processes

__all__ = ["processes"]  # the fixture, used by name


def _filemq(tmp_path: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return cli("filemq", *args, env=_env(tmp_path), timeout=timeout)


def test_keys_new_keeps_an_existing_pair_unless_forced(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    assert _filemq(tmp_path, "keys", "new", "server", "--dir", str(keys)).returncode == 0
    public, secret = keys / "server.key", keys / "server.key_secret"
    before = public.read_bytes(), secret.read_bytes()
    done = _filemq(tmp_path, "keys", "new", "server", "--dir", str(keys))
    line = one_line(done.stderr)
    assert done.returncode == ExitCode.FAILURE and "--force" in line
    assert (public.read_bytes(), secret.read_bytes()) == before  # not a byte changed
    secret.unlink()  # half a pair is still a pair someone may rely on
    done = _filemq(tmp_path, "keys", "new", "server", "--dir", str(keys))
    assert done.returncode == ExitCode.FAILURE and public.read_bytes() == before[0]

    done = _filemq(tmp_path, "keys", "new", "server", "--dir", str(keys), "--force")
    assert done.returncode == 0, done.stderr
    assert public.read_bytes() != before[0]
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert sorted(p.name for p in keys.iterdir()) == ["server.key", "server.key_secret"]


def test_sync_gives_up_on_a_silent_server_after_its_timeout(tmp_path: Path) -> None:
    assert "(default 10.0)" in _filemq(tmp_path, "sync", "--help").stdout
    dest = tmp_path / "dest"
    with silent_peer() as peer:
        # many reconnects allowed: only the timeout may end this run (in ~1 s)
        done = _filemq(
            tmp_path, "sync", peer.endpoint, str(dest), "--once", "--timeout", "1",
            "--retries", "1000",
            timeout=30,
        )  # fmt: skip
        assert len(peer.accepted) <= 1  # (accepted lazily: at most the one connection)
    line = one_line(done.stderr)
    assert done.returncode == ExitCode.FAILURE
    assert line == f"filemq: no answer from {peer.endpoint} in 1 s (is the server running?)"
    nobody = f"tcp://127.0.0.1:{free_port()}"  # (ours, never bound: refused)
    done = _filemq(
        tmp_path, "sync", nobody, str(dest), "--timeout", "0.5", "--retries", "1000", timeout=30
    )
    ready, _, failed = done.stderr.partition("\n")  # (a daemon says it is up first)
    assert ready == f"filemq: syncing {nobody}/ into {dest} until stopped"
    assert done.returncode == ExitCode.FAILURE and "no answer" in one_line(failed)


def test_plain_client_against_a_curve_server_is_told_to_use_keys(
    tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    keys = tmp_path / "keys"
    for name in ("server", "client"):
        assert _filemq(tmp_path, "keys", "new", name, "--dir", str(keys)).returncode == 0
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "client.key").write_bytes((keys / "client.key").read_bytes())
    write_tree(tmp_path / "src", {"s": b"secret"})
    _proc, endpoint = _start_server(
        tmp_path,
        processes,
        "--publish",
        str(tmp_path / "src"),
        "--curve-secret",
        str(keys / "server.key_secret"),
        "--allow",
        str(allowed),
    )
    done = _filemq(
        tmp_path, "sync", endpoint, str(tmp_path / "d"), "--once", "--timeout", "120", timeout=30
    )
    line = one_line(done.stderr)
    assert done.returncode == ExitCode.REFUSED
    assert f"the server at {endpoint} requires CURVE (handshake failed)" in line
    assert "--server-key SERVER.key --curve-secret CLIENT.key_secret" in line
    assert read_tree(tmp_path / "d") == {}


def test_a_server_hanging_up_on_every_greeting_is_one_curve_line(tmp_path: Path) -> None:
    """What a CURVE server does to a plain client's greeting on ~1 dial in 4 (it read the
    client's mechanism first), here on every dial: one line, no lost connection before
    it (each hang-up's disconnect is the failed handshake's own, read with it or later)."""
    peer = GreetingPeer(lambda n: "hang up")
    try:
        done = _filemq(tmp_path, "sync", peer.endpoint, str(tmp_path / "d"), "--once")
    finally:
        peer.close()
    line = one_line(done.stderr)
    assert done.returncode == ExitCode.REFUSED, done.stderr
    assert f"the server at {peer.endpoint} requires CURVE (handshake failed)" in line
    assert peer.accepted >= 2  # (refused at the second hang-up)


def test_sync_of_a_path_with_no_files_warns(
    tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    write_tree(tmp_path / "src", {"docs/a.txt": b"a"})
    _proc, endpoint = _start_server(tmp_path, processes, "--publish", str(tmp_path / "src"))
    done = _filemq(tmp_path, "sync", endpoint, str(tmp_path / "typo"), "--once", "--path", "/dcos")
    assert done.returncode == 0, done.stderr
    assert f"the server at {endpoint} has no files under /dcos (is --path right?)" in done.stderr
    done = _filemq(tmp_path, "sync", endpoint, str(tmp_path / "ok"), "--once", "--path", "/docs")
    assert done.returncode == 0 and "no files under" not in done.stderr
    assert read_tree(tmp_path / "ok") == {"a.txt": b"a"}
    done = _filemq(tmp_path, "sync", endpoint, str(tmp_path / "ok"), "--once", "--path", "/docs")
    assert done.returncode == 0 and "no files under" not in done.stderr  # nothing new: fine


def test_subscribe_json_into_a_closed_pipe_stops_quietly(
    tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    write_tree(tmp_path / "src", {f"f{i}": b"x" * i for i in range(20)})
    _proc, endpoint = _start_server(tmp_path, processes, "--publish", str(tmp_path / "src"))
    done = run_into_closed_pipe(
        "filemq", "subscribe", endpoint, str(tmp_path / "dest"), "--json", env=_env(tmp_path)
    )
    assert done.returncode == ExitCode.BROKEN_PIPE
    assert b"Traceback" not in done.stderr and b"Exception ignored" not in done.stderr
    assert b"event callback failed" not in done.stderr


def test_verbosity_flags_before_or_after_the_subcommand(
    tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    write_tree(tmp_path / "src", {"a.txt": b"a"})
    _proc, endpoint = _start_server(tmp_path, processes, "--publish", str(tmp_path / "src"))

    def sync(*argv: str) -> str:
        dest = tmp_path / f"d{len(os.listdir(tmp_path))}"
        done = _filemq(tmp_path, *(a.replace("DEST", str(dest)) for a in argv))
        assert done.returncode == 0, done.stderr
        return done.stderr

    base = ("sync", endpoint, "DEST", "--once", "--no-index")
    assert "received a.txt" not in sync(*base)  # default: a summary only
    assert "1 files (1 bytes) received" in sync(*base)
    for argv in (("-v", *base), (*base, "-v")):
        assert "received a.txt" in sync(*argv)  # -v: a debug line per file
    for argv in (("-q", *base), (*base, "-q")):
        assert sync(*argv) == ""  # -q: warnings and errors only


def test_errors_name_the_bad_value(tmp_path: Path) -> None:
    done = _filemq(tmp_path, "sync", "tcp://127.0.0.1:1", "d", "--path", "../up")
    assert done.returncode == ExitCode.USAGE and "filemq:" in one_line(done.stderr)
    done = _filemq(tmp_path, "serve", "--publish", str(tmp_path / "missing"), "--no-state")
    assert done.returncode == ExitCode.FAILURE
    assert "missing" in one_line(done.stderr)
