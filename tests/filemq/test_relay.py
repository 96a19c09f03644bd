"""Relays (``filemq subscribe ... --serve``) as real processes: a tree of mirrors.

server -> relay -> relay -> mirror stays exact under creates, updates, deletes and
relay restarts (SIGTERM and kill -9); CURVE on each hop with each relay's own keys and
allow-list; a relay whose upstream went keeps serving; a symbolic link appearing in a
relay's DEST is not followed out of it; a half-received file never leaves a relay.
Waits poll with deadlines; nothing sleeps to synchronise.
"""

from __future__ import annotations

import hashlib
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from filemq.state import load_index
from tests.polling import wait_until
from zerohub.zmqkit import new_certificate

from . import test_subscribe_cli
from .conftest import write_tree
from .test_subscribe_cli import WAIT, Proc, files, kind

procs = test_subscribe_cli.procs  # the fixture: every process started is killed at the end

_ENDPOINT = r"serving .* on (tcp://127\.0\.0\.1:\d+) \("


def _serve(tmp_path: Path, procs: list[Proc], src: Path, *args: str) -> tuple[Proc, str]:
    proc = Proc(
        tmp_path, f"serve{len(procs)}", "serve", "--bind", "tcp://127.0.0.1:*",
        "--publish", str(src), *args,
    )  # fmt: skip
    procs.append(proc)
    return proc, proc.wait_stderr(_ENDPOINT).group(1)


def _relay(
    tmp_path: Path,
    procs: list[Proc],
    upstream: str,
    dest: Path,
    *args: str,
    bind: str = "tcp://127.0.0.1:*",
) -> tuple[Proc, str]:
    proc = Proc(
        tmp_path, f"relay{len(procs)}", "subscribe", upstream, str(dest), "--json",
        "--serve", bind, "--check-interval", "0.5", *args,
    )  # fmt: skip
    procs.append(proc)
    return proc, proc.wait_stderr(_ENDPOINT).group(1)


def _mirror(tmp_path: Path, procs: list[Proc], upstream: str, dest: Path, *args: str) -> Proc:
    proc = Proc(tmp_path, f"mirror{len(procs)}", "subscribe", upstream, str(dest), "--json", *args)
    procs.append(proc)
    return proc


def _tree(root: Path) -> tuple[dict[str, bytes], set[str]]:
    """The files (contents) and the folders under ``root`` (temp files left out)."""
    folders = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_dir()}
    return files(root), folders


def _same(*roots: Path) -> Callable[[], bool]:
    return lambda: all(_tree(root) == _tree(roots[0]) for root in roots[1:])


def _inodes(root: Path) -> dict[str, int]:
    return {name: (root / name).stat().st_ino for name in files(root)}


@pytest.mark.slow
def test_three_level_tree_stays_exact_through_changes_and_relay_restarts(
    tmp_path: Path, procs: list[Proc]
) -> None:
    src, r1, r2, dest = (tmp_path / n for n in ("src", "r1", "r2", "dest"))
    write_tree(src, {f"d{i}/f{j}.txt": f"{i}-{j}".encode() for i in range(3) for j in range(20)})
    write_tree(src, {"top.bin": os.urandom(200_000)})
    _server, origin = _serve(tmp_path, procs, src)
    relay1, ep1 = _relay(tmp_path, procs, origin, r1)
    _relay2, ep2 = _relay(tmp_path, procs, ep1, r2)
    mirror = _mirror(tmp_path, procs, ep2, dest)
    mirror.wait_event(kind("resync-complete"))
    assert wait_until(_same(src, r1, r2, dest), WAIT), files(dest).keys()

    # live: create, update, delete (a whole folder too) travel down both relays
    (src / "d0" / "new.txt").write_bytes(b"new")
    (src / "d1" / "f0.txt").write_bytes(b"updated")
    (src / "d2" / "f5.txt").unlink()
    for name in list((src / "d2").iterdir()):
        name.unlink()
    (src / "d2").rmdir()
    assert wait_until(_same(src, r1, r2, dest), WAIT), sorted(files(dest))
    assert not (dest / "d2").exists()

    # kill -9 the first relay; changes made meanwhile arrive after its restart
    before = _inodes(dest)
    relay1.stop(signal.SIGKILL)
    (src / "d0" / "while-down.txt").write_bytes(b"made while relay 1 was down")
    (src / "d1" / "f1.txt").unlink()
    relay1, again = _relay(tmp_path, procs, origin, r1, bind=ep1)  # same port
    assert again == ep1
    assert wait_until(_same(src, r1, r2, dest), WAIT), sorted(files(dest))
    # the mirrors below resynced by their caches: unchanged files were not copied again
    after = _inodes(dest)
    assert {name for name in after if after[name] != before.get(name)} == {"d0/while-down.txt"}

    # a clean restart (SIGTERM) of the middle relay: the same, and live changes go on
    assert _relay2.stop() == 0
    (src / "d0" / "f3.txt").write_bytes(b"changed while relay 2 was down")
    _relay2, again = _relay(tmp_path, procs, ep1, r2, bind=ep2)
    assert again == ep2
    assert wait_until(_same(src, r1, r2, dest), WAIT), sorted(files(dest))
    (src / "last.txt").write_bytes(b"live after both restarts")
    mirror.wait_event(kind("create", "last.txt"))
    assert wait_until(_same(src, r1, r2, dest), WAIT)
    assert mirror.stop() == 0 and _relay2.stop() == 0 and relay1.stop() == 0


@pytest.mark.slow
def test_curve_on_each_hop_with_the_relays_own_keys(tmp_path: Path, procs: list[Proc]) -> None:
    keys, origin_allow, relay_allow = (tmp_path / n for n in ("keys", "oallow", "rallow"))
    origin_pub, origin_sec = new_certificate("origin", keys)
    relay_pub, relay_sec = new_certificate("relay", keys)  # the relay's server keys
    up_pub, up_sec = new_certificate("relay-client", keys)  # the relay as a client
    mirror_pub, mirror_sec = new_certificate("mirror", keys)
    stranger_pub, stranger_sec = new_certificate("stranger", keys)
    origin_allow.mkdir()
    relay_allow.mkdir()
    (origin_allow / "relay-client.key").write_bytes(Path(up_pub).read_bytes())
    (origin_allow / "stranger.key").write_bytes(Path(stranger_pub).read_bytes())
    (relay_allow / "mirror.key").write_bytes(Path(mirror_pub).read_bytes())
    src, r1, dest = tmp_path / "src", tmp_path / "r1", tmp_path / "dest"
    write_tree(src, {"a.txt": b"secret a", "d/b.txt": b"secret b"})
    _s, origin = _serve(
        tmp_path, procs, src, "--curve-secret", origin_sec, "--allow", str(origin_allow)
    )
    _r, ep1 = _relay(
        tmp_path, procs, origin, r1, "--curve-secret", up_sec, "--server-key", origin_pub,
        "--serve-curve-secret", relay_sec, "--serve-allow", str(relay_allow),
    )  # fmt: skip
    mirror = _mirror(
        tmp_path, procs, ep1, dest, "--curve-secret", mirror_sec, "--server-key", relay_pub
    )
    mirror.wait_event(kind("resync-complete"))
    assert wait_until(_same(src, r1, dest), WAIT)
    (src / "live.txt").write_bytes(b"over two CURVE hops")
    mirror.wait_event(kind("create", "live.txt"))

    # the relay's allow-list is its own: a key the origin allows is refused by the relay
    stranger = _mirror(
        tmp_path, procs, ep1, tmp_path / "s", "--curve-secret", stranger_sec,
        "--server-key", relay_pub,
    )  # fmt: skip
    assert stranger.popen.wait(WAIT) == 3
    assert "key not allowed" in stranger.stderr()
    plain = _mirror(tmp_path, procs, ep1, tmp_path / "p")
    assert plain.popen.wait(WAIT) == 3  # a plain client of a CURVE relay
    assert not files(tmp_path / "s") and not files(tmp_path / "p")


def test_relay_keeps_serving_when_its_upstream_goes(tmp_path: Path, procs: list[Proc]) -> None:
    src, r1 = tmp_path / "src", tmp_path / "r1"
    write_tree(src, {"a.txt": b"alpha", "d/b.txt": b"beta"})
    server, origin = _serve(tmp_path, procs, src)
    relay, ep1 = _relay(tmp_path, procs, origin, r1)
    relay.wait_event(kind("resync-complete"))
    assert server.stop() == 0
    relay.wait_event(kind("disconnected"))
    late = _mirror(tmp_path, procs, ep1, tmp_path / "late")  # joins after the origin went
    late.wait_event(kind("resync-complete"))
    assert files(tmp_path / "late") == {"a.txt": b"alpha", "d/b.txt": b"beta"}
    assert relay.popen.poll() is None


def test_a_link_in_the_relays_dest_is_not_followed_out(tmp_path: Path, procs: list[Proc]) -> None:
    src, r1, dest, outside = (tmp_path / n for n in ("src", "r1", "dest", "outside"))
    write_tree(src, {"a.txt": b"alpha", "d/b.txt": b"beta"})
    write_tree(outside, {"secret.txt": b"SECRET", "sub/more.txt": b"SECRET TOO"})
    _s, origin = _serve(tmp_path, procs, src)
    _r, ep1 = _relay(tmp_path, procs, origin, r1)
    mirror = _mirror(tmp_path, procs, ep1, dest, "--links")
    mirror.wait_event(kind("resync-complete"))
    (r1 / "escape").symlink_to(outside)  # links appear in the relay's DEST
    (r1 / "leak.txt").symlink_to(outside / "secret.txt")
    (r1 / "d" / "up").symlink_to("../../outside")
    (src / "sync-point.txt").write_bytes(b"after the links")
    mirror.wait_event(kind("create", "sync-point.txt"))
    late = _mirror(tmp_path, procs, ep1, tmp_path / "late", "--links")
    late.wait_event(kind("resync-complete"))  # a mirror that joins after the links appeared
    for root in (dest, tmp_path / "late"):
        for path in root.rglob("*"):
            assert not path.is_symlink(), path  # links leading out of DEST are not offered
            if path.is_file():
                assert b"SECRET" not in path.read_bytes(), path
    assert files(dest) == files(src) == files(tmp_path / "late")


def test_a_half_received_file_never_leaves_the_relay(tmp_path: Path, procs: list[Proc]) -> None:
    src, r1, dest = tmp_path / "src", tmp_path / "r1", tmp_path / "dest"
    big = os.urandom(12 << 20)
    digest = hashlib.sha1(big).hexdigest()
    write_tree(src, {"small.txt": b"small"})
    _s, origin = _serve(tmp_path, procs, src, "--chunk-size", "65536")
    relay, ep1 = _relay(tmp_path, procs, origin, r1, "--bwlimit", "3M", "--window", "131072")
    mirror = _mirror(tmp_path, procs, ep1, dest)
    mirror.wait_event(kind("resync-complete"))
    (src / "big.bin").write_bytes(big)
    seen_partial = False
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:  # the relay is receiving it (a partial file in r1)
        seen_partial = any(p.name.startswith(".filemq-part") for p in r1.iterdir())
        assert not (dest / "big.bin").exists()
        if seen_partial:
            break
        time.sleep(0.01)
    assert seen_partial, "the big file was never caught in transfer"
    relay.stop(signal.SIGKILL)  # killed mid-file: a partial file stays in r1
    assert not (dest / "big.bin").exists()
    relay, _ep = _relay(tmp_path, procs, origin, r1, bind=ep1)
    event = mirror.wait_event(kind("create", "big.bin"))
    assert event["sha1"] == digest
    assert (dest / "big.bin").read_bytes() == big
    assert wait_until(_same(src, r1, dest), WAIT)


def _saved_sha1(index_file: Path, root: Path, name: str) -> str | None:
    """What the index a mirror saved says of ``name`` (None: not in it, or no index)."""
    entry = load_index(index_file, root).get(name) if index_file.exists() else None
    return None if entry is None else entry.sha1


def test_a_file_written_again_as_it_was_is_not_sent_to_the_relays_mirrors(
    tmp_path: Path, procs: list[Proc]
) -> None:
    """Was: a relay's mirror that wrote a file again with the same contents (a repair
    here; after a ``kill -9``, the files its stale index did not list) gave it a new
    inode, the relay's server took that for a new version and every mirror below
    copied it again (ops9's three-level tree, seen once)."""
    src, r1, dest = tmp_path / "src", tmp_path / "r1", tmp_path / "dest"
    write_tree(src, {"a.txt": b"alpha", "d/b.txt": b"beta"})
    _s, origin = _serve(tmp_path, procs, src)
    relay, ep1 = _relay(tmp_path, procs, origin, r1)
    mirror = _mirror(tmp_path, procs, ep1, dest)
    relay.wait_event(kind("resync-complete"))  # (its first creates read)
    mirror.wait_event(kind("resync-complete"))
    assert wait_until(_same(src, r1, dest), WAIT)
    before = _inodes(dest)
    (r1 / "d" / "b.txt").write_bytes(b"changed in the relay's DEST")  # repaired from origin
    relay.wait_event(kind("create", "d/b.txt"))
    assert (r1 / "d" / "b.txt").read_bytes() == b"beta"
    (src / "sync-point.txt").write_bytes(b"after the repair")
    seen: list[dict[str, object]] = []
    mirror.wait_event(lambda e: seen.append(e) or kind("create", "sync-point.txt")(e))
    assert [e for e in seen if e.get("name") == "d/b.txt"] == []
    after = _inodes(dest)
    assert {name for name in after if after[name] != before.get(name)} == {"sync-point.txt"}


def test_a_relay_killed_right_after_a_change_does_not_fetch_it_again(
    tmp_path: Path, procs: list[Proc]
) -> None:
    """Was: the relay's mirror saved its index every 30 s, so a ``kill -9`` soon after a
    live change restarted with an index without it: the change was fetched again (and,
    before the fix above, sent again down the tree).  Now the index is saved as soon
    as the mirror is quiet after a change."""
    src, r1, dest, index_file = (tmp_path / n for n in ("src", "r1", "dest", "r1.idx"))
    write_tree(src, {"a.txt": b"alpha", "d/b.txt": b"beta"})
    _s, origin = _serve(tmp_path, procs, src)
    relay, ep1 = _relay(tmp_path, procs, origin, r1, "--index", str(index_file))
    mirror = _mirror(tmp_path, procs, ep1, dest)
    mirror.wait_event(kind("resync-complete"))
    (src / "d" / "new.txt").write_bytes(b"made live")
    (src / "a.txt").write_bytes(b"alpha, updated live")
    mirror.wait_event(kind("create", "d/new.txt"))
    assert wait_until(_same(src, r1, dest), WAIT)
    want = {n: hashlib.sha1(b).hexdigest() for n, b in files(src).items()}
    assert wait_until(
        lambda: all(_saved_sha1(index_file, r1, n) == sha for n, sha in want.items()), WAIT
    ), "the relay's index was not saved after the live changes"
    before = _inodes(r1)
    relay.stop(signal.SIGKILL)
    relay, _again = _relay(tmp_path, procs, origin, r1, "--index", str(index_file), bind=ep1)
    seen: list[dict[str, object]] = []
    relay.wait_event(lambda e: seen.append(e) or kind("resync-complete")(e))
    assert [e for e in seen if e["kind"] == "create"] == []
    assert _inodes(r1) == before
    assert wait_until(_same(src, r1, dest), WAIT)


# ``filemq`` whose main thread is slow between the relay's serving line and the mirror
# (as on a loaded machine, where it may be descheduled for seconds): one second there.
LATE_MIRROR = """
import sys, time
import filemq.subscriber
made = filemq.subscriber.Subscriber.__init__
def late(self, *args, **kwargs):
    time.sleep(1.0)
    made(self, *args, **kwargs)
filemq.subscriber.Subscriber.__init__ = late
from filemq.cli import main
sys.exit(main(sys.argv[1:]))
"""
STOP_WAIT = 60.0  # a process's stop on a machine at load 40-60 (a deadline, not a delay)


def test_a_sigterm_as_soon_as_the_relay_serves_stops_it_cleanly(
    tmp_path: Path, procs: list[Proc]
) -> None:
    """Was (seen under load): ``subscribe --serve`` took its signals after the relay's
    serving line, and a SIGTERM in between killed it (exit -15, the relay not stopped)."""
    src = tmp_path / "src"
    write_tree(src, {"a.txt": b"alpha"})
    _s, origin = _serve(tmp_path, procs, src)
    relay = Proc(
        tmp_path, "late", "subscribe", origin, str(tmp_path / "r1"),
        "--serve", "tcp://127.0.0.1:*", program=[sys.executable, "-c", LATE_MIRROR],
    )  # fmt: skip
    procs.append(relay)
    relay.wait_stderr(_ENDPOINT)
    relay.popen.send_signal(signal.SIGTERM)
    code = relay.popen.wait(STOP_WAIT)
    assert code == 0, relay.stderr()
    assert "Traceback" not in relay.stderr()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--serve-allow", "x"], "need --serve"),
        (["--serve", "tcp://127.0.0.1:*", "--serve-allow", "x"], "go together"),
        (["--serve", "tcp://0.0.0.0:*"], "refusing to bind"),
    ],
)
def test_relay_options_misused_are_one_line_exit_2(
    tmp_path: Path, procs: list[Proc], args: list[str], message: str
) -> None:
    proc = Proc(tmp_path, "bad", "subscribe", "tcp://127.0.0.1:9", str(tmp_path / "d"), *args)
    procs.append(proc)
    assert proc.popen.wait(WAIT) == 2
    lines = proc.stderr().strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
