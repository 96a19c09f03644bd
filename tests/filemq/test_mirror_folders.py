"""The mirror's kept folder descriptors (``Mirror._folder``): small files into one folder
walk it once per receive batch, the descriptors are bounded and released, and a folder
removed or swapped for a link is never written through."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

import filemq.mirror as mirror_module
import filemq.paths as paths
import filemq.server as server_module
from filemq.client import SyncResult
from filemq.index import FileIndex
from filemq.meta import EntryMeta, Kind
from filemq.mirror import MAX_FOLDER_FDS, Mirror
from filemq.paths import UnsafePathError
from filemq.server import FileServer

from .conftest import read_tree, write_tree


def _place(mirror: Mirror, name: str, data: bytes) -> None:
    parts = tuple(name.split("/"))
    headers = {"size": str(len(data)), "sha1": hashlib.sha1(data).hexdigest()}
    ok, reason = mirror.place(parts, mirror.target(parts), data, headers)
    assert ok, reason


def _mirror(tmp_path: Path) -> tuple[Path, Mirror]:
    """DEST (``tmp_path/dest``, new) and a mirror into it."""
    dest = tmp_path / "dest"
    dest.mkdir()
    return dest, Mirror(dest, FileIndex(dest))


def _swapped(tmp_path: Path) -> tuple[Path, Path, Path, Mirror]:
    """A mirror that placed ``sub/one``; then ``sub`` moved away (to ``moved``) and a
    link to a victim's folder (``outside``, holding ``own``) put in its place.  DEST,
    outside, moved and the mirror."""
    outside, moved = tmp_path / "victim", tmp_path / "moved"
    dest, mirror = _mirror(tmp_path)
    write_tree(outside, {"own": b"victim's"})
    _place(mirror, "sub/one", b"1")
    (dest / "sub").rename(moved)
    (dest / "sub").symlink_to(outside, target_is_directory=True)
    return dest, outside, moved, mirror


def _open_under(dest: Path) -> int:
    """Descriptors this process holds on folders under ``dest`` (the mirror's only)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith(f"{dest}/"):
                count += 1
        except OSError:  # (closed meanwhile)
            pass
    return count


def test_files_into_one_folder_walk_it_once_per_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rename into place walked DEST from its root for every file (four system
    calls more per small file); now once per folder until ``release_folders``."""
    walks: list[tuple[str, ...]] = []  # the walks that make missing folders: renames
    real = paths.open_dir_beneath

    def counting(root: object, parts: tuple[str, ...], *, create: bool = False) -> int:
        if create:
            walks.append(tuple(parts))
        return real(root, parts, create=create)  # type: ignore[arg-type]

    monkeypatch.setattr(mirror_module, "open_dir_beneath", counting)
    monkeypatch.setattr(paths, "open_dir_beneath", counting)
    dest, mirror = _mirror(tmp_path)
    for i in range(50):
        _place(mirror, f"a/b/f{i}", b"x%d" % i)
    assert walks.count(("a", "b")) == 1
    mirror.release_folders()  # (what the client does before each wait for the socket)
    _place(mirror, "a/b/last", b"last")
    assert walks.count(("a", "b")) == 2
    mirror.release_folders()
    assert read_tree(dest) == {**{f"a/b/f{i}": b"x%d" % i for i in range(50)}, "a/b/last": b"last"}


def test_kept_folder_descriptors_are_bounded_and_released(tmp_path: Path) -> None:
    dest, mirror = _mirror(tmp_path)
    for i in range(MAX_FOLDER_FDS + 20):
        _place(mirror, f"d{i}/f", b"%d" % i)
        assert _open_under(dest) == min(i + 1, MAX_FOLDER_FDS)
    mirror.release_folders()
    assert _open_under(dest) == 0
    assert len(read_tree(dest)) == MAX_FOLDER_FDS + 20


def test_a_folder_removed_within_a_batch_is_made_again(tmp_path: Path) -> None:
    dest, mirror = _mirror(tmp_path)
    _place(mirror, "sub/one", b"1")
    shutil.rmtree(dest / "sub")  # a local user, while the kept descriptor is open
    _place(mirror, "sub/two", b"2")
    mirror.release_folders()
    assert read_tree(dest) == {"sub/two": b"2"}
    assert not [p for p in dest.iterdir() if p.name.startswith(".filemq-part-")]


def test_a_folder_swapped_for_a_link_is_never_written_through(tmp_path: Path) -> None:
    """Within a batch the kept descriptor still names the folder itself (moved away:
    never the link's target); from the next batch on the walk refuses the link."""
    dest, outside, moved, mirror = _swapped(tmp_path)
    _place(mirror, "sub/two", b"2")  # this batch: into the folder, where it went
    mirror.release_folders()
    with pytest.raises(UnsafePathError):
        _place(mirror, "sub/three", b"3")
    mirror.release_folders()
    assert read_tree(outside) == {"own": b"victim's"}
    assert read_tree(moved) == {"one": b"1", "two": b"2"}
    assert not [p for p in dest.iterdir() if p.name.startswith(".filemq-part-")]


def test_expired_folders_are_walked_again_by_the_next_rename_not_closed_at_once(
    tmp_path: Path,
) -> None:
    """``expire_folders`` (what the client does before each wait while the placer thread
    may be renaming) closes nothing itself: the next rename releases the kept
    descriptors and walks DEST again, so a folder swapped for a link is refused then."""
    dest, outside, moved, mirror = _swapped(tmp_path)
    mirror.expire_folders()
    assert _open_under(tmp_path) == 1  # (still open, on "moved": the placer may use it)
    with pytest.raises(UnsafePathError):
        _place(mirror, "sub/two", b"2")
    assert _open_under(tmp_path) == 0
    mirror.release_folders()
    assert read_tree(outside) == {"own": b"victim's"}
    assert read_tree(moved) == {"one": b"1"}
    assert not [p for p in dest.iterdir() if p.name.startswith(".filemq-part-")]


def test_server_walks_a_folder_once_per_round_of_sending(
    tmp_path: Path, serve: Callable[..., FileServer], sync_once: Callable[..., SyncResult],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The server walked SRC from the mount's root for every file it opened (and
    ``fstat``-ed it twice); now a folder's descriptor serves a whole round of sending
    (``_pump``: at most ``_PUMP_BUDGET`` = 64 messages), so no round walks it twice.

    Only the server's walks (under SRC) are counted, per round: how many rounds a sync
    takes, and how many files the mirror checks before its first one is placed (its
    walks under DEST), depend on scheduling; one walk per round does not."""
    src, dest = tmp_path / "src", tmp_path / "dest"
    tree = {f"sub/f{i:03d}": b"%d" % i for i in range(100)}
    write_tree(src, tree)
    server = serve(src, indexes_live=True)  # (indexed before: its reads are not counted)
    walked = 0  # the server's walks to SRC/sub in the round being sent
    per_round: list[int] = []
    real = paths.open_dir_beneath
    real_pump = FileServer._pump

    def counting(root: Path, parts: tuple[str, ...], *, create: bool = False) -> int:
        nonlocal walked
        if Path(root) == src and tuple(parts) == ("sub",):
            walked += 1
        return real(root, parts, create=create)

    def pump(self: FileServer) -> bool:  # one round of sending
        nonlocal walked
        walked = 0
        try:
            return real_pump(self)
        finally:
            per_round.append(walked)

    monkeypatch.setattr(server_module, "open_dir_beneath", counting)
    monkeypatch.setattr(paths, "open_dir_beneath", counting)
    monkeypatch.setattr(FileServer, "_pump", pump)
    result = sync_once(server.endpoint, dest)
    assert result.synced and result.errors == 0
    assert read_tree(dest) == tree
    assert sum(per_round) >= 1  # (the files were read through a walked folder)
    assert max(per_round) == 1  # (before: one walk per file, 64 in a full round)


@pytest.mark.parametrize(
    ("umask", "mode", "mask", "chmods"),
    [
        (0o022, 0o644, 0o777, 0),  # the usual case: created with its final bits
        (0o022, 0o000, 0o777, 0),
        (0o077, 0o644, 0o777, 1),  # the umask took bits away: fchmod puts them back
        (0o022, 0o4755, 0o7777, 1),  # special bits: created 0600, then fchmod
        (0o022, 0o4755, 0o777, 0),  # (stripped by the mask)
    ],
)
def test_a_small_file_is_created_with_its_final_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, umask: int, mode: int, mask: int, chmods: int
) -> None:
    """A verified whole file was created 0600 and ``fchmod``-ed every time (a system call
    per small file); now only when the created bits are not the final ones."""
    calls: list[int] = []
    real = os.fchmod

    def counting(fd: int, bits: int) -> None:
        calls.append(bits)
        real(fd, bits)

    monkeypatch.setattr(os, "fchmod", counting)
    dest = tmp_path / "dest"
    dest.mkdir()
    mirror = Mirror(dest, FileIndex(dest), mask=mask)
    data = b"content"
    headers = {"size": str(len(data)), "sha1": hashlib.sha1(data).hexdigest()}
    meta = EntryMeta(Kind.FILE, mode, 1_600_000_000_000_000_000)
    old = os.umask(umask)
    try:
        ok, reason = mirror.place(("d", "f"), mirror.target(("d", "f")), data, headers, meta)
    finally:
        os.umask(old)
        mirror.release_folders()
    assert ok, reason
    st = (dest / "d" / "f").stat()
    assert stat.S_IMODE(st.st_mode) == mode & mask
    assert st.st_mtime_ns == 1_600_000_000_000_000_000
    assert len(calls) == chmods
    assert mirror.index.get("d/f") is not None
    assert mirror.index.get("d/f").mode == mode & mask  # type: ignore[union-attr]
