"""Random appends, removals, metadata updates, purges, definitions and restarts against a
dict oracle (hypothesis state machine).  Segments are 4 KiB so the random runs roll and
compact segments all the time; after every restart the store must equal the oracle."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from broker.store.log import Durability, LogStore, Meta, QueueBounds, QueueKey

from .kit import contents, small

QUEUES: list[QueueKey] = [("a", 1), ("a", 2), ("b\u00e9", 70000)]
NAMES = ["channel/a", "queue/a/1", "router/r", "sub/s"]
metas = st.builds(
    Meta,
    st.integers(0, 2**32 - 1),
    st.integers(0, 2**32 - 1),
    st.booleans(),
    st.sampled_from([0.0, 1.5, 1.7e9]),
)


class StoreModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="store-model-"))
        self.options = small(Durability.OS, compact_step=3)
        self.store = LogStore(self.directory, self.options)
        self.records: dict[QueueKey, dict[int, tuple[bytes, Meta]]] = {q: {} for q in QUEUES}
        self.next_seq = dict.fromkeys(QUEUES, 1)
        self.values: dict[str, bytes] = {}

    @rule(queue=st.sampled_from(QUEUES), blob=st.binary(max_size=600), meta=metas)
    def append(self, queue: QueueKey, blob: bytes, meta: Meta) -> None:
        appended = self.store.append(queue, blob, meta)
        assert appended.seq == self.next_seq[queue]
        self.next_seq[queue] += 1
        self.records[queue][appended.seq] = (blob, meta)

    @rule(queue=st.sampled_from(QUEUES), count=st.integers(1, 40), size=st.integers(0, 300))
    def bulk_append(self, queue: QueueKey, count: int, size: int) -> None:
        """Records that stay: segments that are well filled and not compacted."""
        for _ in range(count):
            blob = b"%d" % self.next_seq[queue] * (size // 4)
            seq = self.store.append(queue, blob).seq
            self.records[queue][seq] = (blob, Meta())
            self.next_seq[queue] += 1

    @rule(queue=st.sampled_from(QUEUES), count=st.integers(1, 60), size=st.integers(0, 300))
    def churn(self, queue: QueueKey, count: int, size: int) -> None:
        """Many records in, all out: fills segments with dead data."""
        for _ in range(count):
            seq = self.store.append(queue, b"c" * size).seq
            self.store.remove(queue, seq)
        self.next_seq[queue] += count

    @rule(queue=st.sampled_from(QUEUES), data=st.data())
    def remove(self, queue: QueueKey, data: st.DataObject) -> None:
        live = sorted(self.records[queue])
        seq = data.draw(st.sampled_from(live) if live else st.integers(0, 5))
        self.store.remove(queue, seq)
        self.records[queue].pop(seq, None)

    @rule(queue=st.sampled_from(QUEUES), data=st.data(), meta=metas)
    def update(self, queue: QueueKey, data: st.DataObject, meta: Meta) -> None:
        live = sorted(self.records[queue])
        if not live:
            return
        seq = data.draw(st.sampled_from(live))
        self.store.update(queue, seq, meta)
        self.records[queue][seq] = (self.records[queue][seq][0], meta)

    @rule(queue=st.sampled_from(QUEUES))
    def purge(self, queue: QueueKey) -> None:
        self.store.purge(queue)
        self.records[queue].clear()

    @rule(name=st.sampled_from(NAMES), value=st.binary(max_size=200))
    def put_value(self, name: str, value: bytes) -> None:
        self.store.put_value(name, value)
        self.values[name] = value

    @rule(name=st.sampled_from(NAMES))
    def delete_value(self, name: str) -> None:
        self.store.delete_value(name)
        self.values.pop(name, None)

    @precondition(lambda self: True)
    @rule()
    def restart(self) -> None:
        self.store.close()
        self.store = LogStore(self.directory, self.options)
        self.check_everything()

    def check_everything(self) -> None:
        expected = {
            q: {seq: blob for seq, (blob, _) in records.items()}
            for q, records in self.records.items()
            if self.next_seq[q] > 1
        }
        assert contents(self.store) == expected
        for queue, records in self.records.items():
            for seq, (_, meta) in records.items():
                assert self.store.meta(queue, seq) == meta
        assert self.store.values() == self.values
        assert self.store.stats().damage == ()

    @invariant()
    def bounds_match(self) -> None:
        for queue, records in self.records.items():
            last = self.next_seq[queue] - 1
            first = min(records, default=last + 1)
            assert self.store.bounds(queue) == QueueBounds(first, last, len(records))

    def teardown(self) -> None:
        try:
            self.check_everything()
        finally:
            self.store.close()
            shutil.rmtree(self.directory, ignore_errors=True)


TestStoreModel = StoreModel.TestCase
TestStoreModel.settings = settings(max_examples=25, stateful_step_count=35, deadline=None)
