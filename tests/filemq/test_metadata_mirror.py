"""Mirroring what a user cares about, with real ``filemq serve`` and ``filemq sync`` processes:
modes, mtimes, empty folders, links by policy, patterns on both sides, dry run, safety stop."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from . import test_cli
from .conftest import write_tree
from .test_cli import _start_server, _sync

processes = test_cli.processes  # (the fixture: serve processes stopped after each test)

Procs = list[subprocess.Popen[str]]
T1 = 1_500_000_000_123_456_789
T2 = 1_600_000_000_987_654_321
_RECEIVED = re.compile(r"(\d+) files \((\d+) bytes\) received, (\d+) deleted")


def received(done: subprocess.CompletedProcess[str]) -> tuple[int, int, int]:
    """(files, bytes, deleted) from the summary line of a ``filemq sync``."""
    found = _RECEIVED.search(done.stderr)
    assert found, done.stderr
    files, size, deleted = found.groups()
    return int(files), int(size), int(deleted)


def snapshot(root: Path) -> dict[str, Any]:
    """Everything a user sees under ``root``: kind, mode, mtime, content or target."""
    out: dict[str, Any] = {}
    if not root.exists():
        return out
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(dirpath) / name
            st = path.lstat()
            rel = path.relative_to(root).as_posix()
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode))
            else:
                body = path.read_bytes()
                out[rel] = ("file", stat.S_IMODE(st.st_mode), st.st_mtime_ns, body)
    return out


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_modes_mtimes_and_empty_folders_kept(tmp_path: Path, processes: Procs) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    write_tree(src, {"a.txt": b"alpha", "bin/tool": b"#!/bin/sh\n", "secret": b"s", "z": b""})
    (src / "empty" / "nested").mkdir(parents=True)
    (src / "private").mkdir()
    (src / "a.txt").chmod(0o640)
    (src / "bin" / "tool").chmod(0o4755)  # setuid: stripped on the mirror
    (src / "secret").chmod(0o000)
    (src / "private").chmod(0o700)
    (src / "empty" / "nested").chmod(0o555)  # read-only folder: the mirror keeps u+w
    os.utime(src / "a.txt", ns=(T1, T1))
    _proc, endpoint = _start_server(tmp_path, processes, "--publish", str(src), "--no-watch")
    done = _sync(tmp_path, endpoint, str(dest), "--once")
    assert done.returncode == 0, done.stderr
    assert (dest / "a.txt").read_bytes() == b"alpha" and mode(dest / "a.txt") == 0o640
    assert (dest / "a.txt").stat().st_mtime_ns == T1
    assert mode(dest / "bin" / "tool") == 0o755
    assert mode(dest / "secret") == 0o000
    assert (dest / "z").read_bytes() == b""
    assert (dest / "empty" / "nested").is_dir() and mode(dest / "empty" / "nested") == 0o755
    assert mode(dest / "private") == 0o700
    assert not [p for p in dest.iterdir() if p.name.startswith(".filemq-part-")]

    again = _sync(tmp_path, endpoint, str(dest), "--once")  # nothing changed: nothing sent
    assert again.returncode == 0 and received(again) == (0, 0, 0), again.stderr

    (src / "a.txt").chmod(0o600)  # mode and mtime only: no content travels
    os.utime(src / "bin" / "tool", ns=(T2, T2))
    (src / "secret").write_bytes(b"new secret")  # a new version over a mode-000 copy
    (src / "empty" / "nested").rmdir()
    (src / "fresh-empty").mkdir()
    third = _sync(tmp_path, endpoint, str(dest), "--once")
    assert third.returncode == 0, third.stderr
    assert received(third)[:2] == (1, len(b"new secret"))  # only the new content
    assert mode(dest / "a.txt") == 0o600 and (dest / "a.txt").stat().st_mtime_ns == T1
    assert (dest / "bin" / "tool").stat().st_mtime_ns == T2
    assert (dest / "secret").read_bytes() == b"new secret" and mode(dest / "secret") == 0o000
    assert not (dest / "empty" / "nested").exists() and (dest / "empty").is_dir()
    assert (dest / "fresh-empty").is_dir()


def test_special_bits_only_when_asked(tmp_path: Path, processes: Procs) -> None:
    src = tmp_path / "src"
    write_tree(src, {"tool": b"x", "shared/f": b"f"})
    (src / "tool").chmod(0o6755)
    (src / "shared").chmod(0o1777)
    _proc, endpoint = _start_server(tmp_path, processes, "--publish", str(src), "--no-watch")
    kept = _sync(tmp_path, endpoint, str(tmp_path / "kept"), "--once", "--special-bits")
    assert kept.returncode == 0, kept.stderr
    assert mode(tmp_path / "kept" / "tool") == 0o6755
    assert mode(tmp_path / "kept" / "shared") == 0o1777
    plain = _sync(tmp_path, endpoint, str(tmp_path / "plain"), "--once")
    assert mode(tmp_path / "plain" / "tool") == 0o755, plain.stderr
    assert mode(tmp_path / "plain" / "shared") == 0o777


def _linked_tree(tmp_path: Path) -> tuple[Path, Path]:
    src, outside = tmp_path / "src", tmp_path / "outside"
    write_tree(src, {"a.txt": b"inside", "d/sub/f.txt": b"deep"})
    write_tree(outside, {"secret.txt": b"OUTSIDE SECRET"})
    links = {
        "to-a": "a.txt",
        "d/sub/up": "../../a.txt",
        "to-dir": "d",
        "abs-in": str(src / "a.txt"),
        "rel-out": "../outside/secret.txt",
        "abs-out": str(outside / "secret.txt"),
        "dir-out": "../outside",
        "dangling": "nowhere",
        "loop": "loop",
        "via-out/x": "../../outside",  # (inside a folder: 'via-out')
    }
    (src / "via-out").mkdir()
    for name, target in links.items():
        os.symlink(target, src / name)
    return src, outside


_OUT = ("rel-out", "abs-out", "dir-out", "dangling", "loop", "via-out/x")


def _never_outside(dest: Path) -> None:
    for path in dest.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert b"OUTSIDE SECRET" not in path.read_bytes(), path
        if path.is_symlink():
            assert os.path.realpath(path).startswith(os.path.realpath(dest)), path


def test_links_skipped_by_default_one_warning_each(tmp_path: Path, processes: Procs) -> None:
    src, _outside = _linked_tree(tmp_path)
    dest = tmp_path / "dest"
    _proc, endpoint = _start_server(tmp_path, processes, "--publish", str(src), "--no-watch")
    done = _sync(tmp_path, endpoint, str(dest), "--once")
    assert done.returncode == 0, done.stderr
    assert not [p for p in dest.rglob("*") if p.is_symlink()]
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()) == [
        "a.txt",
        "d/sub/f.txt",
    ]
    warned = re.findall(r"skipping symbolic link (\S+):", done.stderr)
    assert sorted(warned) == sorted(["to-a", "d/sub/up", "to-dir", "abs-in", *_OUT])


def test_links_as_links_stay_inside(tmp_path: Path, processes: Procs) -> None:
    src, _outside = _linked_tree(tmp_path)
    dest = tmp_path / "dest"
    _proc, endpoint = _start_server(tmp_path, processes, "--publish", str(src), "--no-watch")
    done = _sync(tmp_path, endpoint, str(dest), "--once", "--links")
    assert done.returncode == 0, done.stderr
    assert os.readlink(dest / "to-a") == "a.txt"
    assert os.readlink(dest / "d" / "sub" / "up") == "../../a.txt"
    assert os.readlink(dest / "to-dir") == "d"
    assert os.readlink(dest / "abs-in") == "a.txt"  # absolute inside: made relative
    assert (dest / "to-dir" / "sub" / "f.txt").read_bytes() == b"deep"
    for name in _OUT:
        assert not os.path.lexists(dest / name), name
    warned = re.findall(r"skipping symbolic link (\S+):", done.stderr)
    assert sorted(warned) == sorted(_OUT)
    _never_outside(dest)
    again = _sync(tmp_path, endpoint, str(dest), "--once", "--links")
    assert received(again) == (0, 0, 0), again.stderr  # links known through ATTRS

    (src / "to-a").unlink()
    os.symlink("d/sub/f.txt", src / "to-a")  # a link changed on the server
    (src / "to-dir").unlink()  # and one removed
    third = _sync(tmp_path, endpoint, str(dest), "--once", "--links")
    assert third.returncode == 0, third.stderr
    assert os.readlink(dest / "to-a") == "d/sub/f.txt"
    assert not os.path.lexists(dest / "to-dir")


def test_copy_links_sends_files_inside_only(tmp_path: Path, processes: Procs) -> None:
    src, _outside = _linked_tree(tmp_path)
    dest = tmp_path / "dest"
    _proc, endpoint = _start_server(tmp_path, processes, "--publish", str(src), "--no-watch")
    done = _sync(tmp_path, endpoint, str(dest), "--once", "--copy-links")
    assert done.returncode == 0, done.stderr
    for name in ("to-a", "d/sub/up", "abs-in"):
        path = dest / name
        assert not path.is_symlink() and path.read_bytes() == b"inside", name
    assert not os.path.lexists(dest / "to-dir")  # a link to a folder is not copied
    for name in _OUT:
        assert not os.path.lexists(dest / name), name
    _never_outside(dest)
    again = _sync(tmp_path, endpoint, str(dest), "--once", "--copy-links")
    assert received(again) == (0, 0, 0), again.stderr
    (src / "a.txt").write_bytes(b"inside, v2")  # the file copied links lead to
    third = _sync(tmp_path, endpoint, str(dest), "--once", "--copy-links")
    assert third.returncode == 0 and (dest / "to-a").read_bytes() == b"inside, v2"


def test_server_without_links_offers_none(tmp_path: Path, processes: Procs) -> None:
    src, _outside = _linked_tree(tmp_path)
    dest = tmp_path / "dest"
    _proc, endpoint = _start_server(
        tmp_path, processes, "--publish", str(src), "--no-watch", "--no-links"
    )
    for option in ("--links", "--copy-links"):
        done = _sync(tmp_path, endpoint, str(dest), "--once", option)
        assert done.returncode == 0, done.stderr
        assert not [p for p in dest.rglob("*") if p.is_symlink()]
        assert not (dest / "to-a").exists()
        assert "the server does not publish links" in done.stderr


def test_patterns_on_both_sides(tmp_path: Path, processes: Procs) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    tree = {f"src/m{i}.c": b"c" for i in range(5)}
    tree |= {"a.log": b"log", "keep.log": b"keep", "build/x.o": b"o", "docs/r.md": b"r"}
    tree |= {"cache/c.bin": b"c", "tmp/t": b"t", "notes.txt": b"n"}
    write_tree(src, tree)
    patterns = tmp_path / "server.patterns"
    patterns.write_text("# what the server never publishes\nbuild/\n*.log\n")
    _proc, endpoint = _start_server(
        tmp_path,
        processes,
        "--publish",
        str(src),
        "--no-watch",
        "--exclude-from",
        str(patterns),
        "--include",
        "keep.log",
    )
    write_tree(dest, {"tmp/mine": b"local", "cache/local.bin": b"mine"})  # excluded below
    client = ["--exclude", "tmp/", "--exclude", "cache/", "--exclude", "*.md"]
    done = _sync(tmp_path, endpoint, str(dest), "--once", *client)
    assert done.returncode == 0, done.stderr
    got = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert got == sorted(
        ["keep.log", "notes.txt", "tmp/mine", "cache/local.bin"]
        + [f"src/m{i}.c" for i in range(5)]
    )
    assert received(done)[2] == 0  # the mirror's excluded files are never deleted

    ten = [f"--exclude=never{i}*" for i in range(7)] + client  # 10 patterns
    again = _sync(tmp_path, endpoint, str(dest), "--once", *ten)
    assert again.returncode == 0 and received(again) == (0, 0, 0), again.stderr

    # a known mirror now: the server's excluded names in DEST are not deleted either
    (dest / "old.log").write_bytes(b"mine too")
    (dest / "extra.txt").write_bytes(b"extra")
    third = _sync(tmp_path, endpoint, str(dest), "--once", *client)
    assert third.returncode == 0, third.stderr
    assert (dest / "old.log").exists() and not (dest / "extra.txt").exists()


def test_garbage_patterns_are_one_line_usage_errors(tmp_path: Path, processes: Procs) -> None:
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"\x00\xff\xfe not text")
    for args in (
        ["--exclude-from", str(garbage)],
        ["--exclude-from", str(tmp_path / "missing")],
        ["--exclude", "*a*a*a*a*b"],
        ["--exclude", "\\"],
    ):
        done = _sync(tmp_path, "tcp://127.0.0.1:1", str(tmp_path / "dest"), "--once", *args)
        assert done.returncode == 2, (args, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("filemq: "), done.stderr
        assert "Traceback" not in done.stderr


def test_dry_run_changes_nothing(tmp_path: Path, processes: Procs) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    write_tree(src, {"same.txt": b"same", "new.txt": b"new", "changed.txt": b"v2"})
    (src / "empty").mkdir()
    write_tree(dest, {"same.txt": b"same", "changed.txt": b"v1", "extra.txt": b"extra"})
    (dest / "same.txt").chmod(0o600)
    os.utime(dest / "same.txt", ns=(T1, T1))
    _proc, endpoint = _start_server(tmp_path, processes, "--publish", str(src), "--no-watch")
    before = snapshot(dest)
    cache_before = snapshot(tmp_path / "cache")
    done = _sync(tmp_path, endpoint, str(dest), "--dry-run")
    assert done.returncode == 0, done.stderr
    assert snapshot(dest) == before  # not a byte, mode, mtime or lock file changed
    assert snapshot(tmp_path / "cache") == cache_before  # no index saved either
    assert sorted(done.stdout.splitlines()) == [
        "attrs same.txt",
        "create new.txt",
        "delete extra.txt",
        "mkdir empty",
        "update changed.txt",
    ]
    assert "a real sync would stop" in done.stderr  # DEST is not a known mirror

    missing = _sync(tmp_path, endpoint, str(tmp_path / "nowhere"), "--dry-run")
    assert missing.returncode == 0, missing.stderr
    assert not (tmp_path / "nowhere").exists()


def test_safety_stop_and_its_override(tmp_path: Path, processes: Procs) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    write_tree(src, {"a.txt": b"server"})
    write_tree(dest, {"mine/notes.txt": b"precious", "a.txt": b"old"})
    _proc, endpoint = _start_server(tmp_path, processes, "--publish", str(src), "--no-watch")
    before = snapshot(dest)
    stopped = _sync(tmp_path, endpoint, str(dest), "--once")
    assert stopped.returncode == 1
    assert "not a known mirror" in stopped.stderr and "--delete-extraneous" in stopped.stderr
    assert snapshot(dest) == before  # nothing deleted, nothing written

    allowed = _sync(tmp_path, endpoint, str(dest), "--once", "--delete-extraneous")
    assert allowed.returncode == 0, allowed.stderr
    assert not (dest / "mine").exists() and (dest / "a.txt").read_bytes() == b"server"

    (dest / "later.txt").write_bytes(b"extra")  # a known mirror now: no flag needed
    known = _sync(tmp_path, endpoint, str(dest), "--once")
    assert known.returncode == 0 and not (dest / "later.txt").exists(), known.stderr

    fresh = tmp_path / "fresh"  # an empty DEST is never a reason to stop
    assert _sync(tmp_path, endpoint, str(fresh), "--once").returncode == 0

    unindexed = _sync(tmp_path, endpoint, str(dest), "--once", "--no-index")
    assert unindexed.returncode == 0  # (nothing to delete: no stop)
    (dest / "x").write_bytes(b"x")
    no_index = _sync(tmp_path, endpoint, str(dest), "--once", "--no-index")
    assert no_index.returncode == 1 and (dest / "x").exists()  # without an index: unknown


@pytest.mark.parametrize("wire", ["czmq"])
def test_older_wire_with_metadata_still_mirrors(
    tmp_path: Path, processes: Procs, wire: str
) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    write_tree(src, {"a.txt": b"a"})
    (src / "a.txt").chmod(0o604)
    (src / "empty").mkdir()
    _proc, endpoint = _start_server(
        tmp_path, processes, "--publish", str(src), "--no-watch", "--wire", wire
    )
    done = _sync(tmp_path, endpoint, str(dest), "--once", "--wire", wire)
    assert done.returncode == 0, done.stderr
    assert mode(dest / "a.txt") == 0o604 and (dest / "empty").is_dir()
