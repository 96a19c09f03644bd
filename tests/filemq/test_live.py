"""Live mirroring in one process: a watching server (inotify) and Subscriber threads.

Every wait polls the mirror with a deadline; nothing sleeps to synchronise.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import queue
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from watchdog.observers.api import BaseObserver, EventQueue

from filemq.destlock import DestLock, DestLocked
from filemq.events import EventKind, MirrorEvent
from filemq.inotify_observer import OverflowAwareInotifyObserver
from filemq.live import LiveFileServer
from filemq.mirror import LOCK_NAME
from filemq.server import FileServer, Mount
from filemq.subscriber import Subscriber
from tests.polling import wait_until

from .conftest import read_tree, write_tree

WAIT = 10.0

# watchdog warns when a new folder's watch is added twice (harmless, not ours)
pytestmark = pytest.mark.filterwarnings("ignore:Callback with id:RuntimeWarning")


def files(root: Path) -> dict[str, bytes]:
    """Like ``read_tree`` while a mirror is busy: temp files skipped, vanishing files too."""
    out: dict[str, bytes] = {}
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            if name.startswith(".filemq-part-"):
                continue
            with contextlib.suppress(FileNotFoundError):
                out[path.relative_to(root).as_posix()] = path.read_bytes()
    return out


def mirrored(src: Path, dest: Path) -> Callable[[], bool]:
    return lambda: files(dest) == files(src)


class Recorder:
    """Collects a subscriber's events (thread-safe)."""

    def __init__(self) -> None:
        self.events: list[MirrorEvent] = []
        self.lock = threading.Lock()

    def __call__(self, event: MirrorEvent) -> None:
        with self.lock:
            self.events.append(event)

    def of(self, kind: EventKind, name: str = "") -> list[MirrorEvent]:
        with self.lock:
            return [e for e in self.events if e.kind is kind and (not name or e.name == name)]


@pytest.fixture
def live(zctx: zmq.Context[Any], loopback: str) -> Iterator[Callable[..., LiveFileServer]]:
    servers: list[LiveFileServer] = []

    def start(src: Path, **kwargs: Any) -> LiveFileServer:
        kwargs.setdefault("endpoint", loopback)
        server = LiveFileServer(zctx, [Mount(src, "/")], **kwargs)
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def subscribe(zctx: zmq.Context[Any]) -> Iterator[Callable[..., Subscriber]]:
    subs: list[Subscriber] = []

    def start(endpoint: str, dest: Path, **kwargs: Any) -> Subscriber:
        kwargs.setdefault("index_path", None)
        sub = Subscriber(endpoint, dest, context=zctx, **kwargs)
        subs.append(sub)
        sub.start()
        return sub

    yield start
    for sub in subs:
        sub.client.stop()  # all at once, then join each
    for sub in subs:
        sub.stop()
    assert all(sub.error is None for sub in subs)


def test_create_modify_move_delete_in_nested_dirs(
    tmp_path: Path, live: Callable[..., LiveFileServer], subscribe: Callable[..., Subscriber]
) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    write_tree(src, {"top.txt": b"top", "old/keep.txt": b"keep"})
    server = live(src)
    sub = subscribe(server.endpoint, dest)
    assert sub.wait_synced(WAIT) and read_tree(dest) == read_tree(src)

    (src / "new" / "deep" / "er").mkdir(parents=True)  # directories made after start
    (src / "new" / "deep" / "er" / "a.txt").write_bytes(b"first")
    assert wait_until(mirrored(src, dest))

    (src / "top.txt").write_bytes(b"TOP")  # same size, within the same mtime tick or not
    assert wait_until(mirrored(src, dest))

    (src / "moved").mkdir()
    os.rename(src / "new" / "deep" / "er" / "a.txt", src / "moved" / "a.txt")
    assert wait_until(mirrored(src, dest))

    os.rename(src / "old", src / "renamed-dir")  # a whole folder moved inside the root
    assert wait_until(mirrored(src, dest))
    assert wait_until(lambda: not (dest / "old").exists())  # emptied folders go too

    with open(src / "open.log", "wb") as f:  # a writer that keeps its file open
        f.write(b"line 1\n")
        f.flush()
        assert wait_until(lambda: (dest / "open.log").exists())
        assert (dest / "open.log").read_bytes() == b"line 1\n"
        f.write(b"line 2\n")
    assert wait_until(mirrored(src, dest))

    (src / "top.txt").unlink()
    shutil.rmtree(src / "new")
    shutil.rmtree(src / "renamed-dir")
    assert wait_until(mirrored(src, dest))
    assert read_tree(dest) == {"moved/a.txt": b"first", "open.log": b"line 1\nline 2\n"}
    temps = [p.name for p in dest.iterdir() if p.name.startswith(".filemq-part-")]
    assert temps == [LOCK_NAME]  # no temp file, only the running subscriber's lock
    assert sub.result.errors == 0


def test_repeated_notices_send_nothing_new(
    tmp_path: Path, live: Callable[..., LiveFileServer], subscribe: Callable[..., Subscriber]
) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    write_tree(src, {"same.txt": b"unchanged"})
    server = live(src)
    events = Recorder()
    sub = subscribe(server.endpoint, dest, on_event=events)
    assert sub.wait_synced(WAIT)
    server.server.notify_changed("/", "same.txt")
    server.server.notify_changed("/", "same.txt")
    (src / "other.txt").write_bytes(b"new")  # handled after the notices (one loop, in order)
    assert wait_until(lambda: bool(events.of(EventKind.CREATE, "other.txt")))
    assert len(events.of(EventKind.CREATE, "same.txt")) == 1  # from the initial resync only


class DeafObserver(OverflowAwareInotifyObserver):
    """Drops events while ``deaf`` is set, as a kernel queue overflow does."""

    def __init__(self) -> None:
        super().__init__()
        self.deaf = threading.Event()
        self.dropped: queue.SimpleQueue[tuple[str, str]] = queue.SimpleQueue()

    def dispatch_events(self, event_queue: EventQueue) -> None:
        if not self.deaf.is_set():
            super().dispatch_events(event_queue)
            return
        entry = event_queue.get(block=True)
        event_queue.task_done()
        if isinstance(entry, tuple):
            self.dropped.put((entry[0].event_type, os.fsdecode(entry[0].src_path)))
        else:  # the observer's stop marker: hand it on
            event_queue.put(entry)
            self.deaf.clear()


def test_overflow_is_reconciled_end_to_end(
    tmp_path: Path, live: Callable[..., LiveFileServer], subscribe: Callable[..., Subscriber]
) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    # "lost/" exists from the start: files closed in a brand-new directory before its
    # watch is added produce no close event at all, which would make this test racy
    write_tree(src, {"a.txt": b"a", "lost/keep.txt": b"k"})
    observers: list[DeafObserver] = []

    def factory() -> BaseObserver:
        observers.append(DeafObserver())
        return observers[-1]

    # a long settle time: files whose close event is lost must come back through the
    # rescan only, not through the settle timer (meant for writers that keep files open)
    server = live(src, observer_factory=factory, settle=120.0)
    sub = subscribe(server.endpoint, dest)
    assert sub.wait_synced(WAIT)
    observer = observers[0]
    observer.deaf.set()
    write_tree(src, {f"lost/f{i}.txt": b"lost %d" % i for i in range(5)})
    (src / "a.txt").unlink()
    # each file's last event (close after write, delete) dropped: nothing of them is left
    expected = {("closed", str(src / f"lost/f{i}.txt")) for i in range(5)}
    expected.add(("deleted", str(src / "a.txt")))
    seen: set[tuple[str, str]] = set()
    deadline = time.monotonic() + WAIT
    while not expected <= seen and time.monotonic() < deadline:
        with contextlib.suppress(queue.Empty):
            seen.add(observer.dropped.get(timeout=0.1))
    assert expected <= seen, "the events to lose were never produced"
    observer.deaf.clear()
    (src / "marker.txt").write_bytes(b"heard")  # events flow again ...
    assert wait_until(lambda: (dest / "marker.txt").exists())
    lost = [dest / "lost" / f"f{i}.txt" for i in range(5)]
    assert not any(p.exists() for p in lost) and (dest / "a.txt").exists()  # ... the lost not
    rescans = server.server.rescans
    server.simulate_overflow()
    assert wait_until(mirrored(src, dest))
    assert server.server.rescans > rescans
    (src / "lost" / "after.txt").write_bytes(b"watches rebuilt")
    assert wait_until(mirrored(src, dest))


def test_fan_out_to_many_subscribers(
    tmp_path: Path, live: Callable[..., LiveFileServer], subscribe: Callable[..., Subscriber]
) -> None:
    src = tmp_path / "src"
    write_tree(src, {f"d{i}/f.txt": b"%d" % i for i in range(3)})
    server = live(src)
    dests = [tmp_path / f"dest{i:02d}" for i in range(24)]
    subs = [subscribe(server.endpoint, d) for d in dests]
    assert all(s.wait_synced(WAIT) for s in subs)
    for i in range(10):
        (src / f"live{i}.bin").write_bytes(os.urandom(4096))
    (src / "d0" / "f.txt").write_bytes(b"changed")
    (src / "d1" / "f.txt").unlink()
    want = read_tree(src)
    for dest in dests:
        assert wait_until(lambda dest=dest: files(dest) == want), dest.name  # type: ignore[misc]
    assert server.server.client_count == len(subs)


def test_subscriber_events_iterator_and_callback(
    tmp_path: Path, live: Callable[..., LiveFileServer], zctx: zmq.Context[Any]
) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    write_tree(src, {"first.txt": b"1"})
    server = live(src)
    calls = Recorder()
    sub = Subscriber(server.endpoint, dest, context=zctx, index_path=None, on_event=calls)
    events = sub.events(timeout=WAIT)  # registered before start: nothing is missed
    with sub:
        got = next(events)
        assert (got.kind, got.name, got.size) == (EventKind.CREATE, "first.txt", 1)
        assert got.path == str(dest.resolve() / "first.txt")
        assert next(events).kind is EventKind.RESYNC_COMPLETE
        (src / "second.txt").write_bytes(b"22")
        got = next(events)
        assert (got.kind, got.name, got.size) == (EventKind.CREATE, "second.txt", 2)
        assert got.sha1 == hashlib.sha1(b"22").hexdigest()
        (src / "first.txt").unlink()
        got = next(events)
        assert (got.kind, got.name) == (EventKind.DELETE, "first.txt")
        assert '"kind":"delete"' in got.to_json()
    assert list(events) == []  # the iterator ends with the subscriber
    assert [e.kind for e in calls.events][:2] == [EventKind.CREATE, EventKind.RESYNC_COMPLETE]
    assert len(calls.events) == 4


def test_server_index_persists_across_restarts(
    tmp_path: Path, zctx: zmq.Context[Any], loopback: str
) -> None:
    src, state = tmp_path / "src", tmp_path / "state"
    write_tree(src, {f"d{i % 4}/f{i}.txt": b"content %d" % i for i in range(40)})

    def run() -> FileServer:
        server = FileServer(zctx, [Mount(src, "/")], endpoint=loopback, state_dir=state)
        server.start()
        server.stop()
        return server

    first = run()
    assert first.indexes["/"].hashed_files == 40
    (path,) = first.index_files.values()
    assert path.exists() and state in path.parents
    assert run().indexes["/"].hashed_files == 0  # valid index: nothing read again
    (src / "d0" / "f0.txt").write_bytes(b"changed while the server was down")
    (src / "d1" / "f1.txt").unlink()
    (src / "d9").mkdir()
    (src / "d9" / "new.txt").write_bytes(b"new")
    third = run()
    index = third.indexes["/"]
    assert index.hashed_files == 2 and len(index) == 40
    assert "d1/f1.txt" not in index and "d9/new.txt" in index
    path.write_text("not an index\n")  # corrupt: rebuilt, not trusted
    assert run().indexes["/"].hashed_files == 40


def test_watching_server_does_not_restat_per_subscription(
    tmp_path: Path, live: Callable[..., LiveFileServer], subscribe: Callable[..., Subscriber]
) -> None:
    src = tmp_path / "src"
    write_tree(src, {"a.txt": b"a"})
    server = live(src)
    index = server.server.indexes["/"]
    refreshes = 0
    original = index.refresh

    def counting(subdir: str = "") -> Any:
        nonlocal refreshes
        refreshes += 1
        return original(subdir)

    index.refresh = counting  # type: ignore[method-assign]
    subs = [subscribe(server.endpoint, tmp_path / f"d{i}") for i in range(3)]
    assert all(s.wait_synced(WAIT) for s in subs)
    assert refreshes == 0


def test_polling_observer_and_simulated_overflow(
    tmp_path: Path, live: Callable[..., LiveFileServer], subscribe: Callable[..., Subscriber]
) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    write_tree(src, {"a.txt": b"a"})
    server = live(src, poll_interval=0.05, settle=0.1)
    sub = subscribe(server.endpoint, dest)
    assert sub.wait_synced(WAIT)
    (src / "sub").mkdir()
    (src / "sub" / "polled.txt").write_bytes(b"found by polling")
    assert wait_until(mirrored(src, dest))
    rescans = server.server.rescans
    server.simulate_overflow()  # no inotify here: the publisher queues the event itself
    assert wait_until(lambda: server.server.rescans > rescans)
    assert files(dest) == files(src)


def test_dest_removed_whole_comes_back_and_stays_locked(
    tmp_path: Path, live: Callable[..., LiveFileServer], subscribe: Callable[..., Subscriber]
) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    write_tree(src, {"a.txt": b"a", "d/e/b.txt": b"b"})
    server = live(src)
    sub = subscribe(server.endpoint, dest, check_interval=0.05)
    assert sub.wait_synced(WAIT)
    shutil.rmtree(dest)  # the lock file goes with it
    assert wait_until(lambda: files(dest) == files(src))
    assert wait_until(lambda: (dest / LOCK_NAME).exists())
    with pytest.raises(DestLocked):  # taken again: still one mirror per DEST
        DestLock(dest).acquire()
    assert sub.result.errors == 0 and sub.client.repairs >= 1


def test_subscriber_on_a_locked_dest_reports_the_holder(
    tmp_path: Path, live: Callable[..., LiveFileServer], subscribe: Callable[..., Subscriber]
) -> None:
    write_tree(tmp_path / "src", {"a.txt": b"a"})
    server = live(tmp_path / "src")
    (tmp_path / "dest").mkdir()
    with DestLock(tmp_path / "dest"):
        sub = Subscriber(server.endpoint, tmp_path / "dest", index_path=None)
        with pytest.raises(DestLocked) as refused:
            sub.run()
        assert refused.value.pid == os.getpid()
        assert read_tree(tmp_path / "dest") == {}  # nothing written, no temp file cleaned


def test_watching_server_with_a_saved_index_answers_after_finding_changes_made_while_down(
    tmp_path: Path, zctx: zmq.Context[Any], loopback: str
) -> None:
    """The loop checks a loaded index against the disk before its first answer: a
    one-shot sync that starts the moment ``start()`` returns sees the changes made
    while the server was down (not the saved index's stale view)."""
    from filemq.client import SyncClient

    src, state, dest = tmp_path / "src", tmp_path / "state", tmp_path / "dest"
    write_tree(src, {f"d{i % 4}/f{i}.txt": b"content %d" % i for i in range(40)})

    def sync(server: LiveFileServer) -> None:
        SyncClient(
            zctx, server.endpoint, dest, once=True, index_path=tmp_path / "mirror.idx"
        ).run()

    server = LiveFileServer(zctx, [Mount(src, "/")], endpoint=loopback, state_dir=state)
    try:
        server.start()
        assert server.server.verified.is_set()  # nothing saved: hashed in start()
        sync(server)
    finally:
        server.stop()
    assert read_tree(dest) == read_tree(src)
    (src / "d0" / "f0.txt").write_bytes(b"changed while the server was down")
    (src / "d1" / "f1.txt").unlink()
    (src / "d9").mkdir()
    (src / "d9" / "new.txt").write_bytes(b"new")
    os.chmod(src / "d2" / "f2.txt", 0o600)
    server = LiveFileServer(zctx, [Mount(src, "/")], endpoint=loopback, state_dir=state)
    try:
        server.start()
        sync(server)
        assert server.server.verified.is_set()
        index = server.server.indexes["/"]
        assert index.hashed_files == 2 and len(index) == 40 and "d1/f1.txt" not in index
    finally:
        server.stop()
    assert read_tree(dest) == read_tree(src)
    assert (dest / "d2" / "f2.txt").stat().st_mode & 0o777 == 0o600


def test_a_start_from_the_saved_index_watches_folders_made_while_the_server_was_down(
    tmp_path: Path, zctx: zmq.Context[Any], loopback: str, subscribe: Callable[..., Subscriber]
) -> None:
    """The watches of a start with a saved index come from its folders (no walk); the
    check against the disk finds the folders made while the server was down and has
    them watched: a file written in one, or in a folder below it, afterwards is pushed
    live.  A folder replaced by a link out of the root is not watched through the link."""
    src, state, outside = tmp_path / "src", tmp_path / "state", tmp_path / "outside"
    write_tree(src, {f"d{i}/f.txt": b"%d" % i for i in range(3)})
    write_tree(outside, {"x.txt": b"outside"})
    server = LiveFileServer(zctx, [Mount(src, "/")], endpoint=loopback, state_dir=state)
    server.start()
    server.stop()
    write_tree(src, {"new/deep/f.txt": b"made while down", "new/g.txt": b"g"})
    shutil.rmtree(src / "d2")
    (src / "d2").symlink_to(outside)
    server = LiveFileServer(zctx, [Mount(src, "/")], endpoint=loopback, state_dir=state)
    try:
        server.start()
        assert wait_until(server.server.verified.is_set, WAIT)
        assert server.server.indexes["/"].loaded
        dest = tmp_path / "dest"
        sub = subscribe(server.server.endpoint, dest)
        assert wait_until(lambda: "new/deep/f.txt" in files(dest), WAIT)
        write_tree(src, {"new/deep/late.txt": b"after", "new/late.txt": b"after", "d0/l": b"a"})
        (outside / "y.txt").write_bytes(b"not ours")
        assert wait_until(mirrored(src, dest), WAIT), (files(src), files(dest))
        assert not any(n.startswith("d2/") for n in server.server.indexes["/"].entries())
        assert sub.error is None
    finally:
        server.stop()


def test_a_damaged_saved_index_means_one_warning_a_full_scan_and_every_folder_watched(
    tmp_path: Path, zctx: zmq.Context[Any], loopback: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A torn saved index is not trusted: one line, the tree hashed again, and the
    watches come from a walk (not from the index), so every folder is watched."""
    src, state = tmp_path / "src", tmp_path / "state"
    write_tree(src, {f"d{i}/e/f.txt": b"%d" % i for i in range(3)})
    server = LiveFileServer(zctx, [Mount(src, "/")], endpoint=loopback, state_dir=state)
    server.start()
    server.stop()
    (saved,) = server.server.index_files.values()
    saved.write_bytes(saved.read_bytes()[:-7])  # torn
    (src / "d1" / "e" / "f.txt").write_bytes(b"changed while down")
    server = LiveFileServer(zctx, [Mount(src, "/")], endpoint=loopback, state_dir=state)
    try:
        with caplog.at_level("WARNING", logger="filemq"):
            server.start()
        index = server.server.indexes["/"]
        warnings = [r for r in caplog.records if "saved index" in r.getMessage()]
        assert len(warnings) == 1 and not index.loaded and index.hashed_files == 3
        entry = index.get("d1/e/f.txt")
        assert entry is not None
        assert entry.sha1 == hashlib.sha1(b"changed while down").hexdigest()
        (src / "d2" / "e" / "late.txt").write_bytes(b"late")
        assert wait_until(lambda: index.get("d2/e/late.txt") is not None, WAIT)
    finally:
        server.stop()


def test_files_changed_while_the_server_starts_from_its_saved_index_are_mirrored(
    tmp_path: Path, zctx: zmq.Context[Any], loopback: str, subscribe: Callable[..., Subscriber]
) -> None:
    """Changes made while a server checks its saved index against the disk (right after
    ``start``: whether each lands before its folder is checked, during, or after, the
    check or the watcher must see it) and one made while it was down, each of those two
    the same size with only the mtime moved: every one reaches a mirror, and the index
    holds the new contents."""
    src, state = tmp_path / "src", tmp_path / "state"
    write_tree(src, {f"d{i % 30:02d}/f{i:03d}.txt": b"version 1 %03d" % i for i in range(600)})
    server = LiveFileServer(zctx, [Mount(src, "/")], endpoint=loopback, state_dir=state)
    server.start()
    server.stop()
    while_down = src / "d07" / "f007.txt"  # (only the check against the disk can see it)
    while_down.write_bytes(b"VERSION 1 007")
    later = while_down.stat().st_mtime_ns + 5 * 10**9
    os.utime(while_down, ns=(later, later))
    server = LiveFileServer(zctx, [Mount(src, "/")], endpoint=loopback, state_dir=state)
    try:
        server.start()
        changed = {
            f"d{i % 30:02d}/f{i:03d}.txt": b"version two %03d" % i for i in range(0, 600, 43)
        }
        write_tree(src, changed)  # (while the saved index is being checked, or just after)
        same_size = src / "d05" / "f005.txt"
        same_size.write_bytes(b"VERSION 1 005")
        later = same_size.stat().st_mtime_ns + 5 * 10**9
        os.utime(same_size, ns=(later, later))
        changed["d05/f005.txt"] = b"VERSION 1 005"
        changed["d07/f007.txt"] = b"VERSION 1 007"
        assert wait_until(server.server.verified.is_set, 60)
        dest = tmp_path / "dest"
        sub = subscribe(server.server.endpoint, dest)
        assert wait_until(mirrored(src, dest), 60), sorted(
            n for n, data in files(src).items() if files(dest).get(n) != data
        )
        assert sub.error is None
        assert server.server.indexes["/"].loaded
        for name, data in changed.items():
            entry = server.server.indexes["/"].get(name)
            assert entry is not None and entry.sha1 == hashlib.sha1(data).hexdigest(), name
    finally:
        server.stop()
