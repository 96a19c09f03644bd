"""The client's outbox coalescing (``Session.coalesce``) and a batch acknowledge's settlement
(``SettledAll``), driven by hand through the sans-IO session core.

The oracle for the batch octets is ``broker.batch.batch_frame`` (the generic frame encoder
over ``batch.pack``), a path the session's one-pass coalescing does not take; the oracle for
an accepted push's value is the keyword-built ACK frame.  Settlement keeps the index order
of the batch around refused and later-acknowledged pushes.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future
from typing import Any

import pytest

from broker import batch, tmqp
from broker.client import session as S
from broker.client.errors import RemoteError
from broker.protocol import MessageType
from tests.broker.test_client_core import ready_session


def batch_session(**kw: Any) -> tuple[S.Session, float]:
    """A ready session whose broker takes batches of 256 frames, 1 MiB."""
    return ready_session(((batch.BATCH_MAX, "256"), (batch.BATCH_OCTETS, str(1 << 20))), **kw)


def acked_push(session: S.Session, now: float, payload: bytes) -> tuple[str, bytes, Future[Any]]:
    """A push awaiting its acknowledge as ``Client.push_async`` makes it: (its id, its
    octets, its future, registered with the session)."""
    mid = session.new_id()
    waiter: Future[Any] = Future()
    session.expect(mid, waiter, now, 5.0)
    return mid, session.push_encoders()[2](1, mid, "ch", payload)[0], waiter


def consumer_ack(mid: str) -> bytes:
    return tmqp.encode(tmqp.Frame(message_type=MessageType.ACK, message_id=mid))[0]


def fire_and_forget(session: S.Session, payload: bytes) -> bytes:
    return session.push_encoders()[0](1, session.new_id(), "ch", payload)[0]


def resolve_all(events: Any) -> list[Any]:
    """Resolve the events' waiters in the order the events come; the other events."""
    rest = []
    for ev in events:
        if isinstance(ev, S.Settled | S.SettledAll | S.Failed):
            S.resolve(ev)
        else:
            rest.append(ev)
    return rest


def test_the_batch_coalesced_is_the_frame_batch_frame_makes_of_the_same_entries() -> None:
    session, now = batch_session()
    pushes = [acked_push(session, now, b"p" * size) for size in (0, 100, 252, 253, 4096)]
    head = [data for _mid, data, _w in pushes[:3]] + [consumer_ack("d1")]
    head += [data for _mid, data, _w in pushes[3:]]
    outbox = deque([*head, fire_and_forget(session, b"ff"), pushes[0][1]])
    data, taken = session.coalesce(outbox)
    assert taken == len(head) == 6  # up to the fire-and-forget push, which travels alone
    frame = tmqp.decode((data,))
    assert isinstance(frame, tmqp.Frame)
    assert (frame.message_type, frame.content_type) == (MessageType.SERVER, batch.BATCH)
    assert frame.pending_ack and frame.source == "me"
    assert batch.unpack(frame.payload, 1024) == head
    assert data == batch.batch_frame(frame.message_id, "me", head, True)
    # the batch's one acknowledge settles every acknowledged push in it, nothing else
    answer = tmqp.encode(batch.result_frame(frame.message_id, "me", ()))[0]
    assert resolve_all(session.feed(answer, now)) == []
    for mid, _data, waiter in pushes:
        assert waiter.result(0) == tmqp.Frame(message_type=MessageType.ACK, message_id=mid)
    assert session.pending == {} and session.batched == {}


def test_a_batch_of_acknowledges_alone_asks_for_no_acknowledge() -> None:
    session, _now = batch_session()
    acks = [consumer_ack(f"d{i}") for i in range(3)]
    data, taken = session.coalesce(deque(acks))
    frame = tmqp.decode((data,))
    assert taken == 3 and isinstance(frame, tmqp.Frame) and not frame.pending_ack
    assert data == batch.batch_frame(frame.message_id, "me", acks, False)
    assert session.batched == {}  # nothing waits for an answer to it


@pytest.mark.parametrize(
    ("limits", "expected"),
    [
        (lambda entry: {"batch_max": 3}, 3),  # the frame limit
        (lambda entry: {"batch_octets": 3 * entry}, 3),  # just room for three entries
        (lambda entry: {"batch_octets": 3 * entry - 1}, 2),  # one octet short of three
        (lambda entry: {"batch_octets": 1}, 1),  # not even one: the first frame alone
    ],
)
def test_coalescing_stops_at_the_session_limits(limits: Any, expected: int) -> None:
    session, now = batch_session()
    pushes = [acked_push(session, now, b"x" * 4096) for _ in range(5)]
    outbox = deque(data for _mid, data, _w in pushes)
    for name, value in limits(len(outbox[0]) + 4).items():  # (an entry: its length, it)
        setattr(session, name, value)
    data, taken = session.coalesce(outbox)
    assert taken == expected
    if expected == 1:
        assert data is outbox[0] and session.batched == {}
    else:
        frame = tmqp.decode((data,))
        assert isinstance(frame, tmqp.Frame)
        assert batch.unpack(frame.payload, 1024) == list(outbox)[:expected]
        assert len(frame.payload) <= session.batch_octets


@pytest.mark.parametrize(
    "second",
    [
        pytest.param(lambda s: fire_and_forget(s, b"x"), id="fire-and-forget"),
        pytest.param(lambda s: acked_push(s, 0.0, b"x" * 20_000)[1], id="too big"),
        pytest.param(lambda s: b"\x02\x00", id="garbage"),
    ],
)
def test_a_frame_that_may_not_share_a_batch_leaves_its_neighbour_alone(second: Any) -> None:
    session, now = batch_session()
    _mid, first, waiter = acked_push(session, now, b"a")
    data, taken = session.coalesce(deque([first, second(session)]))
    assert (data, taken) == (first, 1)
    assert session.batched == {} and not waiter.done()


def test_a_batch_acknowledge_settles_in_index_order_around_refused_and_later_pushes() -> None:
    session, now = batch_session()
    pushes = [acked_push(session, now, f"m{i}".encode()) for i in range(6)]
    order: list[int] = []
    for i, (_mid, _data, waiter) in enumerate(pushes):
        waiter.add_done_callback(lambda _f, i=i: order.append(i))
    data, taken = session.coalesce(deque(data for _mid, data, _w in pushes))
    assert taken == 6
    bid = tmqp.peek_message_id(data)
    assert bid is not None
    answer = batch.result_frame(bid, "me", [(1, "full", "the queue is full"), (4, "", "")], [3])
    events = session.feed(tmqp.encode(answer)[0], now)
    kinds = [S.SettledAll, S.Failed, S.SettledAll, S.Failed, S.SettledAll]
    assert [type(ev) for ev in events] == kinds
    resolve_all(events)
    assert order == [0, 1, 2, 4, 5]  # 3 waits for its own acknowledge
    refused = pushes[1][2].exception(0)
    assert isinstance(refused, RemoteError) and "the queue is full" in str(refused)
    assert isinstance(pushes[4][2].exception(0), RemoteError)
    for i in (0, 2, 5):
        assert pushes[i][2].result(0).message_id == pushes[i][0]
    late = pushes[3]
    resolve_all(session.feed(consumer_ack(late[0]), now))
    assert order[-1] == 3 and late[2].result(0).message_id == late[0]


def test_a_cancelled_push_in_an_accepted_batch_stays_cancelled() -> None:
    session, now = batch_session()
    pushes = [acked_push(session, now, b"x") for _ in range(3)]
    assert pushes[1][2].cancel()
    data, _taken = session.coalesce(deque(data for _mid, data, _w in pushes))
    bid = tmqp.peek_message_id(data)
    assert bid is not None
    resolve_all(session.feed(tmqp.encode(batch.result_frame(bid, "me", ()))[0], now))
    assert pushes[1][2].cancelled()
    assert [pushes[i][2].result(0).message_id for i in (0, 2)] == [pushes[0][0], pushes[2][0]]


def test_the_acknowledge_of_an_accepted_push_is_the_frame_its_own_ack_would_be() -> None:
    assert S.ack_frame("abc-1") == tmqp.Frame(message_type=MessageType.ACK, message_id="abc-1")
    made = S._frame_by_id(ttl=3, content_type=7)("x")
    assert made == tmqp.Frame(ttl=3, content_type=7, message_id="x")
    with pytest.raises(TypeError, match="before message_id"):
        S._frame_by_id(payload=b"late")


def test_a_refused_entry_reports_its_reasons() -> None:
    session, now = batch_session()
    pushes = [acked_push(session, now, b"x") for _ in range(2)]
    data, _taken = session.coalesce(deque(data for _mid, data, _w in pushes))
    bid = tmqp.peek_message_id(data)
    assert bid is not None
    answer = batch.result_frame(bid, "me", [(0, "no-consumers", "")])
    resolve_all(session.feed(tmqp.encode(answer)[0], now))
    error = pushes[0][2].exception(0)
    assert isinstance(error, RemoteError) and "no-consumers" in str(error)
    assert pushes[1][2].result(0).headers == ()


def test_pack_into_reuses_its_buffer_and_packs_what_pack_packs() -> None:
    buffer = bytearray()
    big = [b"a" * 300, b"", b"bc"]
    with batch.pack_into(buffer, big) as view:
        assert bytes(view) == batch.pack(big)
        assert bytes(view[:8]) == b"\x2c\x01\x00\x00aaaa"  # (300, little-endian, then it)
    grown = len(buffer)
    small = [b"xyz", b"q"]
    with batch.pack_into(buffer, small) as view:
        assert bytes(view) == b"\x03\x00\x00\x00xyz\x01\x00\x00\x00q" == batch.pack(small)
    assert len(buffer) == grown  # kept for the next one
    with batch.pack_into(buffer, []) as view:
        assert bytes(view) == b""


def test_batches_coalesced_one_after_another_each_carry_their_own_entries() -> None:
    session, now = batch_session()
    for sizes in ((4096,) * 8, (10, 20), (100,) * 5, (16000, 1)):
        pushes = [acked_push(session, now, bytes([65 + i]) * size) for i, size in enumerate(sizes)]
        entries = [data for _mid, data, _w in pushes]
        data, taken = session.coalesce(deque(entries))
        frame = tmqp.decode((data,))
        assert taken == len(sizes) and isinstance(frame, tmqp.Frame)
        assert data == batch.batch_frame(frame.message_id, "me", entries, True)
        answer = tmqp.encode(batch.result_frame(frame.message_id, "me", ()))[0]
        resolve_all(session.feed(answer, now))
        assert all(waiter.result(0).message_id == mid for mid, _data, waiter in pushes)


def test_pushes_queued_with_their_ids_and_without_share_one_batch() -> None:
    """The threaded client queues ``push_async``'s frames with their message ids
    (``session.Queued``); a poll-on-call client, ``push`` with headers, acks: the octets
    alone.  Both kinds settle by the batch's one acknowledge."""
    session, now = batch_session()
    pushes = [acked_push(session, now, b"q" * size) for size in (10, 4096, 300, 0)]
    outbox: deque[S.Queued] = deque()
    for i, (mid, data, _waiter) in enumerate(pushes):
        outbox.append((data, mid) if i % 2 else data)
    outbox.insert(2, consumer_ack("d7"))
    data, taken = session.coalesce(outbox)
    assert taken == 5
    entries = [S.octets(item) for item in outbox]
    frame = tmqp.decode((data,))
    assert isinstance(frame, tmqp.Frame)
    assert data == batch.batch_frame(frame.message_id, "me", entries, True)
    resolve_all(session.feed(tmqp.encode(batch.result_frame(frame.message_id, "me", ()))[0], now))
    for mid, _data, waiter in pushes:
        assert waiter.result(0).message_id == mid
    assert session.coalesce(deque([(pushes[0][1], pushes[0][0])])) == (pushes[0][1], 1)
