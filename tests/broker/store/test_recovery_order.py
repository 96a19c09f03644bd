"""Recovery of records a compaction copied out of sequence order.

Compaction copies a victim's live records to the head in the victim's order, between new
appends and removals, so the log can hold a copy of an old record after a newer record
of the same queue and after the removal of a record older still.  The slow kill -9 test
(``test_crash.py::test_kill_9_over_many_seeds``) lost completed appends that way: the
index moved its first live slot past the copy's slot when the older record was removed,
so the copy was found by ``read`` but left out of ``sequences``/``records`` (what a
restart reloads a queue from).  These tests build that log on disk directly.
"""

from __future__ import annotations

import os
from pathlib import Path

from broker.store.log import LogStore, records, segments
from broker.store.log.recovery import write_seed

from .kit import contents

Q = ("orders", 2)
SEED = 0x5EED


def _write_segment(directory: Path, segment: int, items: list[records.Record]) -> None:
    fd = segments.create_segment(directory, segment, SEED)
    try:
        os.write(fd, b"".join(records.encode(item, SEED) for item in items))
    finally:
        os.close(fd)


def _put(seq: int, origin: int) -> records.Put:
    return records.Put(Q, seq, origin, records.NO_META, b"blob-%d" % seq)


def test_a_copy_after_the_removal_of_an_older_record_is_read_back(tmp_path: Path) -> None:
    tmp_path.chmod(0o700)
    write_seed(tmp_path, SEED)
    # segment 1 was compacted away (its RETIRE is not needed here); segment 2 holds the
    # copies of 3 and 6..8 around a newer append (11) and the removal of 3
    _write_segment(
        tmp_path,
        2,
        [
            _put(3, 1),
            _put(11, 2),
            records.Remove(Q, 3, 1),
            _put(6, 1),
            _put(7, 1),
            _put(8, 1),
            records.Mark(Q, 12),
        ],
    )
    with LogStore(tmp_path) as store:
        assert store.stats().damage == ()
        assert contents(store)[Q] == {seq: b"blob-%d" % seq for seq in (6, 7, 8, 11)}
        bounds = store.bounds(Q)
        assert (bounds.first, bounds.last, bounds.count) == (6, 11, 4)
        assert [seq for seq, _ in store.read_live(Q)] == [6, 7, 8, 11]
        assert list(store.sequences(Q)) == [6, 7, 8, 11]
