"""Live tests of the publisher: real files, real inotify (and polling) observers.

Waits are bounded reads of the sink queue with a deadline; nothing sleeps to synchronise.
A ``Mirror`` plays the consumer (the FILEMQ server): it applies the events to a copy of
the index and reconciles on RescanNeeded; tests check it ends equal to the disk.
"""

from __future__ import annotations

import os
import queue
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from watchdog.observers.api import BaseObserver
from watchdog.observers.polling import PollingObserver

from filemq.changes import (
    ChangeEvent,
    FileChanged,
    FileDeleted,
    FileStamp,
    RescanNeeded,
    RescanReason,
)
from filemq.inotify_observer import OverflowAwareInotifyObserver
from filemq.publisher import Publisher
from filemq.walk import reconcile, stamp_tree

M = "m"
WAIT = 5.0

# watchdog itself warns when a new folder's watch is added twice (by the parent's scan and
# by its own creation event); harmless, and not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore:Callback with id:RuntimeWarning")


class Mirror:
    """Collects a publisher's events and applies them like a consumer would."""

    def __init__(self, roots: dict[str, Path]) -> None:
        self.roots = roots
        self.queue: queue.Queue[ChangeEvent] = queue.Queue()
        self.events: list[ChangeEvent] = []
        self.files: dict[str, dict[str, FileStamp | None]] = {m: {} for m in roots}

    def load(self) -> None:
        """The consumer's initial scan (after the publisher started)."""
        for mount, root in self.roots.items():
            self.files[mount] = dict(stamp_tree(root))

    def apply(self, ev: ChangeEvent) -> None:
        files = self.files[ev.mount]
        if isinstance(ev, FileChanged):
            files[ev.relpath] = ev.stamp
        elif isinstance(ev, FileDeleted):
            files.pop(ev.relpath, None)
        else:
            current = stamp_tree(self.roots[ev.mount], subtree=ev.relpath)
            for fix in reconcile(ev.mount, files, current, subtree=ev.relpath):
                self.apply(fix)

    def _pump(self, timeout: float) -> bool:
        try:
            ev = self.queue.get(timeout=timeout)
        except queue.Empty:
            return False
        self.events.append(ev)
        self.apply(ev)
        return True

    def wait_for(self, pred: Callable[[ChangeEvent], bool], timeout: float = WAIT) -> ChangeEvent:
        """The first event received (since the start) matching ``pred``."""
        deadline = time.monotonic() + timeout
        start = 0
        while True:
            for ev in self.events[start:]:
                if pred(ev):
                    return ev
            start = len(self.events)
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no matching event; got {self.events}")
            self._pump(min(left, 0.05))

    def wait_changed(self, rel: str, mount: str = M, size: int | None = None) -> FileChanged:
        def match(ev: ChangeEvent) -> bool:
            return (
                isinstance(ev, FileChanged)
                and (ev.mount, ev.relpath) == (mount, rel)
                and (size is None or (ev.stamp is not None and ev.stamp.size == size))
            )

        return self.wait_for(match)  # type: ignore[return-value]

    def wait_deleted(self, rel: str, mount: str = M) -> ChangeEvent:
        return self.wait_for(lambda ev: ev == FileDeleted(mount, rel))

    def wait_in_sync(self, timeout: float = WAIT) -> None:
        """Until the mirrored index equals the disk (once writers are done)."""
        deadline = time.monotonic() + timeout
        while True:
            while self._pump(0.0):
                pass
            disk = {m: dict(stamp_tree(root)) for m, root in self.roots.items()}
            if all(self.files[m] == disk[m] for m in self.roots):
                return
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"mirror out of sync: {self.files} != {disk}")
            self._pump(min(left, 0.05))

    def relpaths(self) -> set[str]:
        return {ev.relpath for ev in self.events}


@pytest.fixture(params=["inotify", "polling"])
def observer_factory(request: pytest.FixtureRequest) -> Callable[[], BaseObserver]:
    if request.param == "polling":
        return lambda: PollingObserver(timeout=0.05)
    return OverflowAwareInotifyObserver


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "pub"
    path.mkdir()
    return path


@pytest.fixture
def mirror(root: Path) -> Mirror:
    return Mirror({M: root})


def publish(mirror: Mirror, **kwargs: object) -> Publisher:
    return Publisher(mirror.roots, mirror.queue, **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def running(mirror: Mirror) -> Iterator[Publisher]:
    with publish(mirror) as pub:
        mirror.load()
        yield pub


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return path


def test_create_modify_move_delete_in_new_nested_dirs(
    root: Path, mirror: Mirror, observer_factory: Callable[[], BaseObserver]
) -> None:
    with publish(mirror, observer_factory=observer_factory):
        f = write(root / "a/b/c/f.txt", b"one")
        assert mirror.wait_changed("a/b/c/f.txt", size=3).stamp == FileStamp.from_stat(os.lstat(f))
        with open(f, "ab") as out:
            out.write(b"+two")
        mirror.wait_changed("a/b/c/f.txt", size=7)
        (root / "x/y").mkdir(parents=True)
        os.rename(f, root / "x/y/g.txt")
        mirror.wait_changed("x/y/g.txt", size=7)
        # Into a brand-new directory watchdog may see the new name before the old one
        # goes (an unpaired move-out waits 0.5 s): only both must come.
        mirror.wait_deleted("a/b/c/f.txt")
        os.rename(root / "x/y/g.txt", root / "x/y/h.txt")  # a watched pair: in order
        renamed = mirror.wait_changed("x/y/h.txt", size=7)
        assert mirror.events[mirror.events.index(renamed) - 1] == FileDeleted(M, "x/y/g.txt")
        os.rename(root / "x/y/h.txt", root / "x/y/g.txt")
        mirror.wait_changed("x/y/g.txt", size=7)
        os.unlink(root / "x/y/g.txt")
        mirror.wait_deleted("x/y/g.txt")
        mirror.wait_in_sync()
        assert mirror.files[M] == {}


def test_close_after_write_is_published_without_waiting_for_settle(
    root: Path, mirror: Mirror
) -> None:
    with publish(mirror, settle=60.0):
        write(root / "done.bin", b"x" * 4096)
        ev = mirror.wait_changed("done.bin", size=4096)  # settle would take a minute
        assert ev.stamp is not None


def test_writer_keeping_the_file_open_is_published_once_quiet(root: Path, mirror: Mirror) -> None:
    with publish(mirror, settle=0.1):
        with open(root / "log.txt", "wb") as out:
            out.write(b"a" * 4096)
            out.flush()
            mirror.wait_changed("log.txt", size=4096)
            out.write(b"b" * 4096)
            out.flush()
            mirror.wait_changed("log.txt", size=8192)
        write(root / "marker", b"")  # closing published nothing new: the marker is next
        mirror.wait_changed("marker")
    sizes = [e.stamp.size for e in mirror.events if isinstance(e, FileChanged) and e.stamp]
    assert sizes.count(8192) == 1


def test_reading_is_not_a_change_but_touching_is(root: Path, mirror: Mirror) -> None:
    path = write(root / "doc", b"content")
    with publish(mirror):
        for _ in range(20):  # the FILEMQ server reading what it publishes
            assert path.read_bytes() == b"content"
        write(root / "marker", b"")
        mirror.wait_changed("marker")
        assert mirror.relpaths() == {"marker"}
        os.utime(path, ns=(1_000_000_000, 2_000_000_000))  # cp -p / rsync -t set times
        ev = mirror.wait_changed("doc")
        assert ev.stamp is not None and ev.stamp.mtime_ns == 2_000_000_000


def test_files_in_freshly_made_trees_are_not_missed(root: Path, tmp_path: Path) -> None:
    mirror = Mirror({M: root})
    staged = tmp_path / "staged"
    for d in range(5):
        for i in range(10):
            write(staged / f"d{d}/sub/f{i}", b"s")
    with publish(mirror):
        mirror.load()
        for d in range(20):  # directories made and filled as fast as possible
            for i in range(20):
                write(root / f"burst/d{d}/f{i}", b"b")
        os.rename(staged, root / "moved-in")  # a whole tree arriving at once
        mirror.wait_in_sync()
    assert len(mirror.files[M]) == 20 * 20 + 5 * 10


def test_directory_renamed_inside_the_root(root: Path, mirror: Mirror) -> None:
    for i in range(3):
        write(root / f"old/sub/f{i}", b"z")
    with publish(mirror):
        mirror.load()
        os.rename(root / "old", root / "new")
        mirror.wait_in_sync()
    for i in range(3):
        assert FileDeleted(M, f"old/sub/f{i}") in mirror.events
        assert f"new/sub/f{i}" in mirror.files[M]


def test_directory_deleted_or_moved_out_asks_for_a_subtree_rescan(
    root: Path, tmp_path: Path, mirror: Mirror
) -> None:
    for i in range(3):
        write(root / f"doomed/deep/f{i}", b"1")
        write(root / f"leaving/deep/f{i}", b"2")
    write(root / "stays", b"3")
    with publish(mirror):
        mirror.load()
        shutil.rmtree(root / "doomed")
        os.rename(root / "leaving", tmp_path / "elsewhere")  # no event lists its files
        mirror.wait_for(lambda e: isinstance(e, RescanNeeded) and e.relpath == "leaving")
        mirror.wait_in_sync()
    assert set(mirror.files[M]) == {"stays"}
    rescans = [e for e in mirror.events if isinstance(e, RescanNeeded)]
    assert {e.reason for e in rescans} == {RescanReason.DIRECTORY_REMOVED}
    assert {e.relpath for e in rescans} <= {"doomed", "doomed/deep", "leaving"}


def test_temp_files_of_writers_are_ignored(root: Path, mirror: Mirror) -> None:
    with publish(mirror):
        tmp = write(root / "d/.report.pdf.fmqtmp4f2a", b"partial")
        os.rename(tmp, root / "d/report.pdf")
        mirror.wait_changed("d/report.pdf", size=7)
        write(root / "scratch.fmqtmp", b"never")
        os.unlink(root / "scratch.fmqtmp")
        part = write(root / ".filemq-part-4242-7", b"download")  # filemq.client's temp name
        os.replace(part, root / "downloaded")
        mirror.wait_changed("downloaded", size=8)
        write(root / "marker", b"")
        mirror.wait_changed("marker")
    assert not any("fmqtmp" in rel or "part" in rel for rel in mirror.relpaths())


def test_custom_ignore_patterns(root: Path, mirror: Mirror) -> None:
    with publish(mirror, ignore=["*.swp", "build"]):
        write(root / ".notes.swp", b"x")
        write(root / "build/out.o", b"x")
        write(root / "src.c", b"x")
        mirror.wait_changed("src.c")
    assert mirror.relpaths() == {"src.c"}


def test_symlinks_are_not_followed_out_of_the_root(
    root: Path, tmp_path: Path, mirror: Mirror
) -> None:
    outside = tmp_path / "outside"
    write(outside / "secret", b"s")
    with publish(mirror):
        (root / "link").symlink_to(outside, target_is_directory=True)
        (root / "flink").symlink_to(outside / "secret")
        write(outside / "later", b"l")
        write(root / "marker", b"")
        mirror.wait_changed("marker")
        mirror.wait_in_sync()
    published = {e.relpath for e in mirror.events if isinstance(e, FileChanged)}
    assert published == {"marker"}
    assert set(mirror.files[M]) == {"marker"}


def test_root_removed_and_recreated(root: Path, mirror: Mirror) -> None:
    write(root / "before", b"1")
    with publish(mirror, check_interval=0.05):
        mirror.load()
        shutil.rmtree(root)
        mirror.wait_for(lambda e: e == RescanNeeded(M, RescanReason.ROOT_MISSING))
        mirror.wait_in_sync()
        assert mirror.files[M] == {}
        root.mkdir()
        write(root / "early", b"2")  # may land before the new watch: the rescan finds it
        mirror.wait_for(lambda e: e == RescanNeeded(M, RescanReason.ROOT_RECREATED))
        write(root / "after/deep", b"3")
        mirror.wait_changed("after/deep")
        mirror.wait_in_sync()
    assert set(mirror.files[M]) == {"early", "after/deep"}


def test_dead_watch_is_replaced(root: Path, mirror: Mirror) -> None:
    observers: list[BaseObserver] = []

    def factory() -> BaseObserver:
        observers.append(OverflowAwareInotifyObserver())
        return observers[-1]

    with publish(mirror, observer_factory=factory, check_interval=0.05):
        for emitter in list(observers[0].emitters):
            emitter.stop()  # as if its thread had died
        mirror.wait_for(lambda e: e == RescanNeeded(M, RescanReason.WATCH_LOST))
        write(root / "after", b"x")
        mirror.wait_changed("after")


def test_overflow_asks_for_a_rescan_and_watching_goes_on(root: Path, mirror: Mirror) -> None:
    """Simulated IN_Q_OVERFLOW through watchdog's own handling of the kernel event."""
    observers: list[OverflowAwareInotifyObserver] = []

    def factory() -> BaseObserver:
        observers.append(OverflowAwareInotifyObserver())
        return observers[-1]

    for i in range(5):
        write(root / f"lost/f{i}", b"missed")  # the mirror never heard of these
    with publish(mirror, observer_factory=factory):
        observers[0].simulate_overflow()
        mirror.wait_for(lambda e: e == RescanNeeded(M, RescanReason.OVERFLOW))
        assert {f"lost/f{i}" for i in range(5)} <= set(mirror.files[M])
        write(root / "lost/after", b"seen")  # watches were rebuilt
        mirror.wait_changed("lost/after")
        mirror.wait_in_sync()


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("ZEROHUB_REAL_INOTIFY_OVERFLOW") != "1",
    reason="lowers the global fs.inotify.max_queued_events for a moment; opt in with "
    "ZEROHUB_REAL_INOTIFY_OVERFLOW=1",
)
def test_real_kernel_overflow_is_reconciled(root: Path, mirror: Mirror) -> None:
    knob = Path("/proc/sys/fs/inotify/max_queued_events")
    if not os.access(knob, os.W_OK):
        pytest.skip("max_queued_events is not writable")
    saved = knob.read_text()
    try:
        knob.write_text("64")  # read once, when the inotify instance is created
        observer = OverflowAwareInotifyObserver()
    finally:
        knob.write_text(saved)
    with publish(mirror, observer_factory=lambda: observer):
        for d in range(10):
            for i in range(300):
                write(root / f"d{d}/f{i}", b"x")
        mirror.wait_for(lambda e: e == RescanNeeded(M, RescanReason.OVERFLOW))
        mirror.wait_in_sync(timeout=20.0)
    assert len(mirror.files[M]) == 3000


def test_several_mounts_are_told_apart(tmp_path: Path) -> None:
    roots = {"one": tmp_path / "r1", "two": tmp_path / "r2"}
    for path in roots.values():
        path.mkdir()
    mirror = Mirror(roots)
    with Publisher(roots, mirror.queue):
        write(roots["two"] / "f", b"2")
        write(roots["one"] / "f", b"1")
        mirror.wait_changed("f", mount="one", size=1)
        mirror.wait_changed("f", mount="two", size=1)
        mirror.wait_in_sync()


def test_callable_sink_that_fails_does_not_stop_the_stream(root: Path) -> None:
    got: queue.Queue[ChangeEvent] = queue.Queue()
    calls = 0

    def sink(ev: ChangeEvent) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("consumer hiccup")
        got.put(ev)

    with Publisher({M: root}, sink):
        write(root / "first", b"1")
        write(root / "second", b"2")
        ev = got.get(timeout=WAIT)
    assert ev.relpath == "second"


def test_lifecycle_errors(root: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no mounts"):
        Publisher({}, queue.Queue())
    with pytest.raises(NotADirectoryError):
        Publisher({M: tmp_path / "missing"}, queue.Queue()).start()
    pub = Publisher({M: root}, queue.Queue())
    pub.start()
    assert pub.running
    with pytest.raises(RuntimeError, match="already started"):
        pub.start()
    pub.stop()
    pub.stop()
    assert not pub.running
    assert pub.roots == {M: str(root.resolve())}


def test_restart_after_stop(root: Path, mirror: Mirror) -> None:
    pub = publish(mirror)
    pub.start()
    pub.stop()
    write(root / "while-stopped", b"1")  # not watched: the consumer's scan covers it
    with pub:
        write(root / "again", b"2")
        mirror.wait_changed("again")


def test_a_start_seeded_with_known_folders_watches_those_and_more_when_told(
    root: Path, mirror: Mirror
) -> None:
    """``start(folders)``: the root and the folders named are watched without a walk;
    a folder left out is watched once ``watch_folders`` names it (with what is below it),
    and ``unwatch_folders`` drops a folder's watches.  inotify reports a change in a
    folder it does not watch never: events of one descriptor come in order, so a change
    there made before one in a watched folder would come first."""
    for folder in ("known", "known/deep", "unknown", "unknown/deep"):
        (root / folder).mkdir()
    pub = publish(mirror, observer_factory=OverflowAwareInotifyObserver)
    pub.start({M: ["known", "known/deep"]})
    try:
        mirror.events.clear()
        write(root / "unknown/deep/a", b"unwatched")
        write(root / "unknown/b", b"unwatched")
        write(root / "known/deep/c", b"watched")
        write(root / "top", b"watched")
        mirror.wait_changed("top")
        assert {"known/deep/c", "top"} <= mirror.relpaths()
        assert not {"unknown/deep/a", "unknown/b"} & mirror.relpaths()
        pub.watch_folders(M, ["unknown"])  # and below it: unknown/deep
        write(root / "unknown/deep/d", b"watched now")
        mirror.wait_changed("unknown/deep/d")
        pub.unwatch_folders(M, ["known"])  # and below it: known/deep
        write(root / "known/deep/e", b"unwatched now")
        write(root / "f", b"watched")
        mirror.wait_changed("f")
        assert "known/deep/e" not in mirror.relpaths()
    finally:
        pub.stop()
