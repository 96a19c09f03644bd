"""Property tests: no name, however built, reaches outside its root.

Names are made of '..', '.', empty parts, backslashes, drive letters, NUL and the
names of symbolic links planted at every depth (to files and folders inside and
outside the root, dangling, looping, absolute).  The oracles are independent of
the code under test: ``os.walk`` without following links says what is inside a
root; a snapshot of the outside folder says nothing there changed.

* server side: what ``FileIndex`` indexes or ``open_beneath`` opens for any name,
  and what a real server sends for an exact-path ICANHAZ of any path;
* client side: where a mirror writes or deletes for any CHEEZBURGER filename,
  with links planted in DEST.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from filemq import fmq_msg
from filemq.engine import HEADER_SHA1, HEADER_SIZE, Operation, load_wire
from filemq.engine_client import ClientSession, FileChunk, FileDelete, FileRefused
from filemq.index import FileIndex
from filemq.mirror import TEMP_PREFIX, Mirror
from filemq.paths import UnsafePathError, local_parts, open_beneath, relative_parts
from filemq.server import FileServer, Mount

SECRET = b"SECRET-OUTSIDE"
_PROPS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# -- trees with links everywhere ---------------------------------------------------------

#: (relative path, kind, link target) -- the server's published root, under ``pub``
_PUB_ZOO = [
    ("f", "file", ""),
    ("d/g", "file", ""),
    ("d/e/h", "file", ""),
    ("a\\b", "file", ""),  # a backslash is an ordinary character in a POSIX name
    ("C:", "dir", ""),
    ("C:/x", "file", ""),
    ("lin_f", "link", "f"),
    ("lin_d", "link", "d"),
    ("lout_f", "link", "../outside/secret"),
    ("lout_d", "link", "../outside"),
    ("abs", "link", "/"),
    ("abs_out", "link", "{outside}"),
    ("dangling", "link", "nowhere"),
    ("loop", "link", "loop"),
    ("d/up", "link", ".."),
    ("d/lout", "link", "../../outside"),
    ("d/e/out", "link", "../../../outside"),
    ("d/e/lin", "link", "../g"),
    ("d/e/dead", "link", "../../../outside/none"),
]
_OUTSIDE = {"secret": SECRET, "sub/secret": SECRET, "d/g": SECRET, "e/h": SECRET}


def _build(root: Path, outside: Path, zoo: list[tuple[str, str, str]]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for name, data in _OUTSIDE.items():
        (outside / name).parent.mkdir(parents=True, exist_ok=True)
        (outside / name).write_bytes(data)
    for rel, kind, target in zoo:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind == "file":
            path.write_bytes(f"inside {rel}".encode())
        elif kind == "dir":
            path.mkdir(exist_ok=True)
        else:
            path.symlink_to(target.format(outside=outside))


def _inside(root: Path) -> tuple[dict[str, bytes], set[tuple[int, int]]]:
    """The oracle: regular files reached from ``root`` without a link, and the
    (device, inode) of every file and folder reached that way (the root included)."""
    files: dict[str, bytes] = {}
    ids = {(os.stat(root).st_dev, os.stat(root).st_ino)}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st_ = os.lstat(path)
            if stat.S_ISDIR(st_.st_mode) or stat.S_ISREG(st_.st_mode):
                ids.add((st_.st_dev, st_.st_ino))
            if stat.S_ISREG(st_.st_mode):
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                files[rel] = Path(path).read_bytes()
    return files, ids


def _snapshot(folder: Path) -> dict[str, bytes | str]:
    out: dict[str, bytes | str] = {}
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = path.relative_to(folder).as_posix()
            if path.is_symlink():
                out[rel] = "-> " + os.readlink(path)
            elif path.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = path.read_bytes()
    return out


# -- hostile names -----------------------------------------------------------------------

_PARTS = [
    *("f", "d", "e", "g", "h", "x", "a\\b", "C:", "secret", "sub"),
    *("lin_f", "lin_d", "lout_f", "lout_d", "abs", "abs_out", "dangling", "loop"),
    *("up", "lout", "out", "lin", "dead", "etc", "passwd"),
    *("", ".", "..", "...", "\\", "..\\..", "C:\\x", "c:", "\x00", "a\x00b", "~", " "),
]
_SEPARATORS = ["/", "/", "/", "\\", "//"]
_PREFIXES = ["", "", "", "/", "//", "./", "../", "C:\\", "C:/", "\\\\server\\share\\"]


@st.composite
def hostile_names(draw: st.DrawFn) -> str:
    parts = draw(st.lists(st.sampled_from(_PARTS) | st.text(max_size=4), min_size=1, max_size=5))
    name = draw(st.sampled_from(_PREFIXES))
    for i, part in enumerate(parts):
        name += (draw(st.sampled_from(_SEPARATORS)) if i else "") + part
    return name


# -- server side -------------------------------------------------------------------------


@pytest.fixture
def zoo(tmp_path: Path) -> tuple[Path, Path, dict[str, bytes], set[tuple[int, int]]]:
    pub, outside = tmp_path / "pub", tmp_path / "outside"
    _build(pub, outside, _PUB_ZOO)
    files, ids = _inside(pub)
    assert files and all(SECRET not in data for data in files.values())
    return pub, outside, files, ids


@_PROPS
@given(name=hostile_names())
@example(name="lout_d/secret").via("a link to a folder outside, then a file")
@example(name="d/e/out/e/h").via("a link out at depth 3")
@example(name="abs_out/sub/secret").via("an absolute link out")
def test_index_and_open_only_reach_files_inside_the_root(
    zoo: tuple[Path, Path, dict[str, bytes], set[tuple[int, int]]], name: str
) -> None:
    pub, _outside, files, ids = zoo
    index = FileIndex(pub)
    entry = index.update(name)
    if name in files:  # reachable without a link: indexed, with the right content
        assert entry is not None and entry.name == name
        assert entry.sha1 == hashlib.sha1(files[name]).hexdigest()
    else:
        assert entry is None and len(index) == 0
    index.refresh(name)  # as a subtree: whatever it holds must be inside
    assert set(index.entries()) <= set(files)
    for flags in (os.O_RDONLY, os.O_RDONLY | os.O_DIRECTORY):
        try:
            fd = open_beneath(pub, local_parts(name), flags | os.O_NONBLOCK)
        except (OSError, UnsafePathError):
            continue
        try:
            st_ = os.fstat(fd)
            assert (st_.st_dev, st_.st_ino) in ids
            if stat.S_ISREG(st_.st_mode):
                assert SECRET not in os.pread(fd, 1 << 16, 0)
        finally:
            os.close(fd)


_KINDS = ["file", "dir", "link_in_file", "link_in_dir", "link_out_file", "link_out_dir"]
_KINDS += ["link_abs", "dangling", "loop", "link_up"]


@st.composite
def random_trees(draw: st.DrawFn) -> list[tuple[str, str, str]]:
    """Up to 12 entries at depths 1-4, each a file, a folder or some kind of link."""
    tree: list[tuple[str, str, str]] = []
    taken: set[str] = set()
    for _ in range(draw(st.integers(1, 12))):
        depth = draw(st.integers(1, 4))
        parts = [draw(st.sampled_from(["a", "b", "c", "..x", "a\\b"])) for _ in range(depth)]
        rel = "/".join(parts)
        if any("/".join(parts[:i]) in taken for i in range(1, depth + 1)):
            continue  # keep it a tree: nothing below a file or a link
        up = "/".join([".."] * depth)
        kind = draw(st.sampled_from(_KINDS))
        target = {
            "link_in_file": f"{up}/inside-file",
            "link_in_dir": f"{up}/inside-dir",
            "link_out_file": f"{up}/../outside/secret",
            "link_out_dir": f"{up}/../outside",
            "link_abs": "{outside}",
            "dangling": "no/such/thing",
            "loop": parts[-1],
            "link_up": "..",
        }.get(kind, "")
        tree.append((rel, "link" if target else kind, target))
        if target or kind == "file":
            taken.add(rel)
        for i in range(1, depth):  # its folders are folders
            taken.discard("/".join(parts[:i]))
    return [("inside-file", "file", ""), ("inside-dir/f", "file", ""), *tree]


@settings(_PROPS, max_examples=80)
@given(tree=random_trees(), names=st.lists(hostile_names(), max_size=5))
def test_random_trees_index_exactly_what_is_inside(
    tmp_path_factory: pytest.TempPathFactory, tree: list[tuple[str, str, str]], names: list[str]
) -> None:
    base = tmp_path_factory.mktemp("tree")
    pub, outside = base / "pub", base / "outside"
    try:
        _build(pub, outside, tree)
    except OSError:
        assume(False)  # the drawn entries collide (a file where a folder goes): not a tree
    files, _ids = _inside(pub)
    index = FileIndex(pub)
    index.refresh()
    assert {n: e.sha1 for n, e in index.entries().items()} == {
        n: hashlib.sha1(d).hexdigest() for n, d in files.items()
    }
    for rel, _kind, _target in tree:
        for name in (rel, rel + "/secret", rel + "/f", rel + "/sub/secret", *names):
            entry = index.update(name)
            assert (entry is not None) == (name in files)
    assert set(index.entries()) == set(files)


def _ask(sock: zmq.Socket[Any], path: str) -> list[fmq_msg.Cheezburger]:
    sock.send_multipart(fmq_msg.encode(fmq_msg.Ohai()))
    assert sock.poll(5000)
    assert isinstance(fmq_msg.decode(sock.recv_multipart()), fmq_msg.OhaiOk)
    sock.send_multipart(fmq_msg.encode(fmq_msg.Icanhaz(path, {"RESYNC": "1"}, {})))
    sock.send_multipart(fmq_msg.encode(fmq_msg.Nom(1 << 30, 0)))
    got: list[fmq_msg.Cheezburger] = []
    while sock.poll(5000):
        msg = fmq_msg.decode(sock.recv_multipart())
        if isinstance(msg, fmq_msg.IcanhazOk):
            continue
        if isinstance(msg, fmq_msg.Srsly | fmq_msg.Rtfm):
            return got  # a refused path: nothing sent
        assert isinstance(msg, fmq_msg.Cheezburger), msg
        if msg.operation == Operation.MARKER:
            sock.send_multipart(fmq_msg.encode(fmq_msg.Kthxbai()))
            return got
        got.append(msg)
    raise AssertionError(f"no answer for {path!r}")


@pytest.fixture
def zoo_server(
    zoo: tuple[Path, Path, dict[str, bytes], set[tuple[int, int]]],
    zctx: zmq.Context[Any],
    loopback: str,
) -> Iterator[tuple[FileServer, dict[str, bytes]]]:
    pub, _outside, files, _ids = zoo
    server = FileServer(zctx, [Mount(pub, "/")], endpoint=loopback, indexes_live=True)
    server.start()
    try:
        yield server, files
    finally:
        server.stop()


@settings(_PROPS, max_examples=60)
@given(name=hostile_names())
@example(name="/lout_d/secret").via("the exact path of a file behind a link out")
@example(name="/d/lout/sub/secret").via("a link out at depth 2")
@example(name="/abs_out/e/h").via("an absolute link out")
@example(name="/lout_d/sub/").via("a folder behind a link out")
def test_exact_path_icanhaz_of_any_path_sends_only_files_inside(
    zoo_server: tuple[FileServer, dict[str, bytes]], zctx: zmq.Context[Any], name: str
) -> None:
    server, files = zoo_server
    path = name if name.startswith("/") else "/" + name
    if len(path.encode("utf-8", "surrogatepass")) > 255 or "\udcff" in path:
        return
    sock = zctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(server.endpoint)
    try:
        try:
            got = _ask(sock, path)
        except UnicodeEncodeError:
            return  # not a name the codec can send
    finally:
        sock.close()
    for msg in got:
        assert msg.operation == Operation.CREATE
        assert msg.filename[1:] in files and SECRET not in msg.chunk
        assert msg.chunk == files[msg.filename[1:]]


# -- client side -------------------------------------------------------------------------

#: Links planted in a mirror's DEST (``victim`` is outside it).
_DEST_ZOO = [
    ("d/kept", "file", ""),
    ("lout_d", "link", "../victim"),
    ("d/lout", "link", "../../victim"),
    ("lout_f", "link", "../victim/v"),
    ("dangling", "link", "../victim/nothing"),
    ("abs", "link", "{outside}"),
    ("loop", "link", "loop"),
    ("lin_d", "link", "d"),
    ("d/up", "link", ".."),
]


def _expected_target(dest: Path, name: str, path: str) -> tuple[str, ...] | None:
    """Where a CHEEZBURGER ``name`` for a subscription to ``path`` may land, or None."""
    if name.startswith("/"):
        if not name.startswith(path) or name == path:
            return None
        name = name[len(path) :]
    try:
        parts = relative_parts(name)
    except UnsafePathError:
        return None
    if parts[0].startswith(TEMP_PREFIX):
        return None
    current = dest
    for part in parts[:-1]:
        current = current / part
        if current.is_symlink() or (current.exists() and not current.is_dir()):
            return None
    if (dest.joinpath(*parts)).is_dir() and not dest.joinpath(*parts).is_symlink():
        return None
    return parts


@_PROPS
@given(name=hostile_names(), absolute=st.booleans(), delete=st.booleans())
def test_mirror_writes_and_deletes_only_inside_dest(
    tmp_path_factory: pytest.TempPathFactory, name: str, absolute: bool, delete: bool
) -> None:
    base = tmp_path_factory.mktemp("mirror")
    dest, victim = base / "dest", base / "victim"
    _build(dest, victim, _DEST_ZOO)
    (victim / "v").write_bytes(SECRET)
    before_victim = _snapshot(victim)
    before_dest = _snapshot(dest)
    wire = load_wire("czmq")  # 4-octet names: any length reaches the checks
    session = ClientSession(wire, "/", {}, 0.0, reserved=lambda p: p[0].startswith(TEMP_PREFIX))
    session.start(0.0)
    session.receive(wire.codec.encode(wire.codec.OhaiOk()), 0.0)
    filename = ("/" + name) if absolute and not name.startswith("/") else name
    data = b"payload"
    headers = {HEADER_SHA1: hashlib.sha1(data).hexdigest(), HEADER_SIZE: str(len(data))}
    op = Operation.DELETE if delete else Operation.CREATE
    body = b"" if delete else data
    msg = wire.codec.Cheezburger(0, int(op), filename, 0, 1, headers, body)
    try:
        frames = wire.codec.encode(msg)
    except (UnicodeEncodeError, ValueError):
        return  # not encodable: cannot arrive
    mirror = Mirror(dest, FileIndex(dest))
    applied = False
    for action in session.receive(frames, 0.0):
        try:
            if isinstance(action, FileChunk):
                target = mirror.target(action.parts)
                applied, _reason = mirror.place(action.parts, target, action.data, action.headers)
            elif isinstance(action, FileDelete):
                applied = mirror.delete(action.parts)
            else:
                assert isinstance(action, FileRefused)
        except (OSError, UnsafePathError):
            applied = False
    assert _snapshot(victim) == before_victim  # nothing outside DEST changed
    expected = _expected_target(dest, filename, "/")
    after = _snapshot(dest)
    changed = {k for k in set(before_dest) | set(after) if before_dest.get(k) != after.get(k)}
    for rel in changed:  # every change inside DEST went through real folders only
        parts = rel.split("/")
        assert not any((dest.joinpath(*parts[:i])).is_symlink() for i in range(1, len(parts)))
    if expected is None:
        assert not applied
        assert changed == set()
    elif not delete:
        assert applied and (dest.joinpath(*expected)).read_bytes() == data
