"""The sans-IO change tracker: settle rules, state-based decisions, rescan coalescing."""

from __future__ import annotations

import pytest

from filemq.changes import (
    ChangeTracker,
    FileChanged,
    FileDeleted,
    FileStamp,
    RescanNeeded,
    RescanReason,
)

M = "m"


class FakeDisk:
    """``stat`` for the tracker: relpath -> stamp; absent means not a regular file."""

    def __init__(self) -> None:
        self.files: dict[str, FileStamp] = {}
        self.calls = 0

    def write(self, rel: str, size: int, mtime_ns: int = 1, ino: int = 7) -> FileStamp:
        self.files[rel] = FileStamp(size, mtime_ns, ino)
        return self.files[rel]

    def stat(self, mount: str, rel: str) -> FileStamp | None:
        assert mount == M
        self.calls += 1
        return self.files.get(rel)


@pytest.fixture
def disk() -> FakeDisk:
    return FakeDisk()


def tracker(disk: FakeDisk, settle: float = 0.05, hold: float = 1.0) -> ChangeTracker:
    return ChangeTracker(disk.stat, settle=settle, rescan_hold=hold)


def test_written_file_is_published_once_quiet(disk: FakeDisk) -> None:
    t = tracker(disk)
    stamp = disk.write("a", 10)
    t.written(M, "a", 0.0)
    t.sample()
    assert t.next_deadline() == pytest.approx(0.05)
    assert t.poll(0.049) == []
    assert t.poll(0.05) == [FileChanged(M, "a", stamp)]
    assert t.pending() == 0
    assert t.next_deadline() is None


def test_new_hints_push_the_deadline(disk: FakeDisk) -> None:
    t = tracker(disk)
    disk.write("a", 1)
    t.written(M, "a", 0.0)
    t.sample()
    disk.write("a", 2)
    t.written(M, "a", 0.04)
    t.sample()
    assert t.poll(0.06) == []
    assert t.poll(0.09) == [FileChanged(M, "a", FileStamp(2, 1, 7))]


def test_stamp_changed_without_event_rearms_the_wait(disk: FakeDisk) -> None:
    """A writer whose writes raise no event (mmap) is caught by the stamp comparison."""
    t = tracker(disk)
    disk.write("a", 1)
    t.written(M, "a", 0.0)
    t.sample()
    disk.write("a", 2, mtime_ns=2)
    assert t.poll(0.05) == []  # changed since the sample: wait another quiet period
    assert t.next_deadline() == pytest.approx(0.10)
    assert t.poll(0.10) == [FileChanged(M, "a", FileStamp(2, 2, 7))]


def test_unsampled_entry_is_checked_twice(disk: FakeDisk) -> None:
    t = tracker(disk)
    disk.write("a", 1)
    t.written(M, "a", 0.0)
    assert t.poll(0.05) == []
    assert t.poll(0.10) == [FileChanged(M, "a", FileStamp(1, 1, 7))]


def test_sample_stats_each_path_once_per_batch(disk: FakeDisk) -> None:
    t = tracker(disk)
    disk.write("a", 1)
    for i in range(50):
        t.written(M, "a", i * 0.0001)
    t.sample()
    assert disk.calls == 1


def test_close_publishes_at_once_whatever_the_settle(disk: FakeDisk) -> None:
    t = tracker(disk, settle=30.0)
    stamp = disk.write("a", 3)
    t.written(M, "a", 0.0)
    t.completed(M, "a", 0.001)
    t.sample()
    assert t.next_deadline() == float("-inf")
    assert t.poll(0.001) == [FileChanged(M, "a", stamp)]
    assert t.pending() == 0


def test_closed_then_written_again_waits_for_quiet(disk: FakeDisk) -> None:
    t = tracker(disk)
    disk.write("a", 3)
    t.completed(M, "a", 0.0)
    t.written(M, "a", 0.0)  # a new writer before the poll: the latest hint wins
    t.sample()
    assert t.poll(0.0) == []
    assert t.poll(0.05) == [FileChanged(M, "a", FileStamp(3, 1, 7))]


def test_close_does_not_repeat_a_version_the_settle_rule_published(disk: FakeDisk) -> None:
    t = tracker(disk)
    stamp = disk.write("a", 3)
    t.written(M, "a", 0.0)
    t.sample()
    assert t.poll(0.05) == [FileChanged(M, "a", stamp)]
    t.completed(M, "a", 0.06)  # the writer closes without writing more
    assert t.poll(0.06) == []
    new = disk.write("a", 4)  # later versions are published as usual
    t.completed(M, "a", 0.07)
    assert t.poll(0.07) == [FileChanged(M, "a", new)]
    t.completed(M, "a", 0.08)  # a close-published version may be announced again
    assert t.poll(0.08) == [FileChanged(M, "a", new)]


def test_decisions_follow_the_disk_not_the_hint(disk: FakeDisk) -> None:
    """A delete hint for a path that exists again (watchdog delays unpaired moves) is not
    a deletion; a close hint for a path already gone is one."""
    t = tracker(disk)
    stamp = disk.write("back", 5)
    t.removed(M, "back", 0.0)
    t.completed(M, "gone", 0.0)
    assert t.poll(0.0) == [FileChanged(M, "back", stamp), FileDeleted(M, "gone")]


def test_created_then_deleted_before_settle_is_a_deletion(disk: FakeDisk) -> None:
    t = tracker(disk)
    disk.write("tmp", 1)
    t.written(M, "tmp", 0.0)
    t.sample()
    del disk.files["tmp"]
    t.removed(M, "tmp", 0.01)
    assert t.poll(0.01) == [FileDeleted(M, "tmp")]
    assert t.poll(1.0) == []


def test_settling_file_that_vanished_is_reported_deleted(disk: FakeDisk) -> None:
    t = tracker(disk)
    disk.write("a", 1)
    t.written(M, "a", 0.0)
    t.sample()
    del disk.files["a"]
    assert t.poll(0.05) == [FileDeleted(M, "a")]


def test_events_come_out_in_hint_order(disk: FakeDisk) -> None:
    t = tracker(disk)
    for name in ("c", "a", "b"):
        disk.write(name, 1)
        t.completed(M, name, 0.0)
    t.removed(M, "c", 0.0)  # a new hint moves the path to the back
    assert [e.relpath for e in t.poll(0.0)] == ["a", "b", "c"]


def test_move_of_a_complete_file_is_delete_then_change(disk: FakeDisk) -> None:
    t = tracker(disk, settle=30.0)
    stamp = disk.write("new", 9)
    t.moved(M, "old", "new", 0.0)
    assert t.poll(0.0) == [FileDeleted(M, "old"), FileChanged(M, "new", stamp)]


def test_move_of_a_file_still_being_written_keeps_settling(disk: FakeDisk) -> None:
    t = tracker(disk)
    disk.write("old", 1)
    t.written(M, "old", 0.0)
    t.sample()
    stamp = disk.files.pop("old")
    disk.files["new"] = stamp
    t.moved(M, "old", "new", 0.01)
    t.sample()
    assert t.poll(0.01) == [FileDeleted(M, "old")]
    assert t.poll(0.07) == [FileChanged(M, "new", stamp)]


def test_move_with_one_side_outside(disk: FakeDisk) -> None:
    t = tracker(disk)
    stamp = disk.write("in", 1)
    t.moved(M, None, "in", 0.0)
    t.moved(M, "out", None, 0.0)
    assert t.poll(0.0) == [FileChanged(M, "in", stamp), FileDeleted(M, "out")]


def test_zero_settle_does_not_spin(disk: FakeDisk) -> None:
    t = tracker(disk, settle=0.0)
    disk.write("a", 1)
    t.written(M, "a", 0.0)
    assert t.poll(0.0) == []  # not sampled yet: re-armed for the next poll
    assert t.poll(0.0) == [FileChanged(M, "a", FileStamp(1, 1, 7))]


def test_negative_settle_rejected(disk: FakeDisk) -> None:
    with pytest.raises(ValueError, match="settle"):
        ChangeTracker(disk.stat, settle=-1)


# -- rescans ---------------------------------------------------------------------------


def test_removed_directories_coalesce_into_the_topmost(disk: FakeDisk) -> None:
    t = tracker(disk)
    for i, rel in enumerate(["a/b/c", "a/b/d", "a/x", "a/b", "a"]):
        t.subtree_removed(M, rel, i * 0.01)
    assert t.poll(0.05) == []  # still active: 0.04 + settle
    assert t.poll(0.09) == [RescanNeeded(M, RescanReason.DIRECTORY_REMOVED, "a")]
    assert t.pending() == 0


def test_rescans_of_unrelated_subtrees_stay_apart(disk: FakeDisk) -> None:
    t = tracker(disk)
    t.subtree_removed(M, "a", 0.0)
    t.subtree_removed(M, "ab", 0.0)  # a sibling, not a child of "a"
    t.subtree_removed("other", "a", 0.0)
    got = t.poll(0.05)
    assert set(got) == {
        RescanNeeded(M, RescanReason.DIRECTORY_REMOVED, "a"),
        RescanNeeded(M, RescanReason.DIRECTORY_REMOVED, "ab"),
        RescanNeeded("other", RescanReason.DIRECTORY_REMOVED, "a"),
    }


def test_whole_root_rescan_covers_everything_and_keeps_coming(disk: FakeDisk) -> None:
    t = tracker(disk, hold=0.5)
    t.subtree_removed(M, "a/b", 0.0)
    t.request_rescan(M, RescanReason.OVERFLOW, 0.01)
    now = 0.01
    got: list[object] = []
    while not got:  # overflow after overflow: the hold caps the delay
        now += 0.04
        t.request_rescan(M, RescanReason.OVERFLOW, now)
        got = list(t.poll(now))
    assert got == [RescanNeeded(M, RescanReason.OVERFLOW, "")]
    assert now == pytest.approx(0.53, abs=0.05)


def test_immediate_rescan(disk: FakeDisk) -> None:
    t = tracker(disk)
    t.request_rescan(M, RescanReason.ROOT_MISSING, 2.0, immediate=True)
    assert t.next_deadline() == 2.0
    assert t.poll(2.0) == [RescanNeeded(M, RescanReason.ROOT_MISSING, "")]
