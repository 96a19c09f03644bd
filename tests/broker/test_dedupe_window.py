"""The duplicate window (``broker.engine.queue.dedupe.RecentIds``) against a model: the
plain algorithm it replaces (read the first entry on every check), on random sequences
of checks, stores and clears, with ids stored again and a clock that sometimes goes back
(where its cheap lower bound of the oldest time must give way to reading the entry)."""

from __future__ import annotations

import random
from collections import OrderedDict

import pytest

from broker.engine.queue.dedupe import RecentIds


class Model:
    """Forget the first entry while it is past the window time, on every check."""

    def __init__(self) -> None:
        self.ids: OrderedDict[str, float] = OrderedDict()

    def seen(self, message_id: str, now: float, lifetime_ms: int) -> bool:
        ids = self.ids
        if lifetime_ms:
            cutoff = now - lifetime_ms / 1000.0
            while ids and next(iter(ids.values())) <= cutoff:
                ids.popitem(last=False)
        return message_id in ids

    def add(self, message_id: str, now: float, count: int) -> None:
        self.ids[message_id] = now
        while len(self.ids) > count:
            self.ids.popitem(last=False)


@pytest.mark.parametrize("back", [0.0, 0.03], ids=["monotonic", "clock-back"])
def test_the_window_forgets_and_remembers_as_the_model(back: float) -> None:
    for seed in range(400):
        rnd = random.Random(seed)
        model, window = Model(), RecentIds()
        count = rnd.randint(1, 8)
        lifetime = rnd.choice([0, 5, 20, 100])
        now = 0.0
        for step in range(200):
            now += rnd.choice([0.0, 0.001, 0.003, 0.01]) * (-1 if rnd.random() < back else 1)
            mid = f"m{rnd.randint(0, 15)}"  # few ids: many are stored again
            roll = rnd.random()
            if roll < 0.5:
                expected = model.seen(mid, now, lifetime)
                assert window.seen(mid, now, lifetime) is expected, (seed, step)
            elif roll < 0.98:
                model.add(mid, now, count)
                window.add(mid, now, count)
            else:
                model.ids.clear()
                window.clear()
            assert list(window.ids.items()) == list(model.ids.items()), (seed, step)


def test_an_id_stored_again_still_expires_by_the_first_entry() -> None:
    window = RecentIds()
    window.add("a", 1.0, 10)
    window.add("b", 2.0, 10)
    window.add("a", 5.0, 10)  # updated in place: "a" stays first, now with a later time
    window.add("c", 6.0, 10)
    assert window.seen("b", 4.5, 1000)  # "a" (5.0) is not past: nothing behind it goes
    assert not window.seen("a", 6.5, 1000)  # past 5.0 + 1 s: "a" and then "b" go
    assert not window.seen("b", 6.5, 1000)
    assert window.seen("c", 6.5, 1000)


@pytest.mark.parametrize("batched", [False, True], ids=["one-push", "a-batch"])
def test_a_window_made_smaller_forgets_down_to_its_size_on_the_fast_paths(
    batched: bool,
) -> None:
    """``DuplicateWindow`` lowered at run time: the next id a plain push stores (the fast
    paths, ``Queue.push_plain`` and ``push_plain_run``) leaves the window at its new
    size, as ``RecentIds.add`` (the general path) does.  Before: the fast paths forgot one
    id per push, so a push whose id the window no longer holds was taken for a duplicate
    and dropped (its producer told it was done) where the general path delivers it."""
    from broker import tmqp
    from broker.protocol import MessageType

    from .engine_kit import Frame, Kit

    kit = Kit()
    for client in ("p", "c"):
        kit.connect(client)
    kit.queue("p", "ch", 1, status=1, use_message_id=True, duplicate_window=100)
    kit.join("c", "ch")
    for mid in ("a", "b", "c", "d", "e"):
        kit.push("p", "ch", 1, mid=mid)
    kit.update("p", "ch", 1, DuplicateWindow=2)
    later = ("f", "b")  # b: out of a window of 2 once f is stored
    if batched:
        frames = [Frame(message_type=MessageType.QUEUE, content_type=1, target="ch",
                        message_id=mid, source="p", payload=b"x") for mid in later]  # fmt: skip
        items = [(i, f, tmqp.encode(f)[0]) for i, f in enumerate(frames)]
        kit.route(kit.engine.receive_batch("p", items, kit.now)[0])
    else:
        for mid in later:
            kit.push("p", "ch", 1, mid=mid)
    got = [f.message_id for f in kit.take("c") if f.message_type == MessageType.QUEUE]
    assert got == ["a", "b", "c", "d", "e", "f", "b"]
    assert kit.info("p", "ch", 1)["DuplicateMessages"] == 0
