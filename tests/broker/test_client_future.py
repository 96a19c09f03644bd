"""The threaded client's lean futures (``broker.client.lean_future.LeanFuture``) behave as
``concurrent.futures.Future`` for their users, alone and against a real broker (the
check that chooses them, and the fallback: ``test_client_future_internals.py``).

Alone: result/exception with a timeout, cancel, callbacks (one that raises is logged and
the others run), ``InvalidStateError``, many threads each blocked on its own future while
one thread settles them, ``concurrent.futures.wait``/``as_completed``.  Against a
``broker serve`` process: acknowledged pushes read through ``wait``/``as_completed``,
threads pushing and waiting at once, and a broker ``kill -9``ed while pushes are in flight
(every future fails with ``ConnectionLost``, none hangs, ``close()`` reports the
fire-and-forget pushes sent into the dead broker).  Every wait is a deadline polled for or
a generous ``result(timeout)``; nothing is timed.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import threading
from typing import Any

import pytest
import zmq

from broker import tmqp
from broker.client.blocking import Client, ConnectionLost, RemoteError, UnconfirmedSends
from broker.client.frames import queue_frame, queue_senders
from broker.client.lean_future import LeanFuture
from broker.protocol import MessageType
from tests.broker.test_durable_serve import Broker
from tests.polling import WAIT, wait_until
from tests.zerohub.support import stop_process

Ctx = zmq.Context[zmq.Socket[bytes]]


# -- alone ------------------------------------------------------------------------------


def test_result_times_out_on_a_pending_future_then_returns_once_set() -> None:
    f = LeanFuture()
    with pytest.raises(TimeoutError):
        f.result(0.01)
    with pytest.raises(TimeoutError):
        f.exception(0.01)
    assert not f.done()
    f.set_result("ack")
    assert f.done() and f.result(0) == "ack" and f.exception(0) is None


def test_an_exception_is_raised_by_result_and_returned_by_exception() -> None:
    f = LeanFuture()
    f.set_exception(ConnectionLost("gone"))
    with pytest.raises(ConnectionLost, match="gone"):
        f.result()
    assert isinstance(f.exception(), ConnectionLost)


def test_settling_a_done_future_again_raises_invalid_state() -> None:
    f = LeanFuture()
    f.set_result(1)
    with pytest.raises(cf.InvalidStateError):
        f.set_result(2)
    with pytest.raises(cf.InvalidStateError):
        f.set_exception(ValueError("late"))
    assert f.result() == 1


def test_cancel_a_pending_future_wakes_its_waiter_and_runs_callbacks() -> None:
    f = LeanFuture()
    seen: list[Any] = []
    f.add_done_callback(seen.append)
    outcome: list[BaseException] = []

    def waiter() -> None:
        try:
            f.result(WAIT)
        except BaseException as exc:  # (kept for the assertion)
            outcome.append(exc)

    t = threading.Thread(target=waiter)
    t.start()
    assert wait_until(lambda: f._cond is not None)  # the waiter is blocked on it
    assert f.cancel() and f.cancel()  # (a second cancel: still cancelled)
    t.join(WAIT)
    assert not t.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], cf.CancelledError)
    assert f.cancelled() and f.done() and seen == [f]
    with pytest.raises(cf.InvalidStateError):
        f.set_result(1)  # (the client checks done() first: an answer after a cancel)


def test_a_settled_future_cannot_be_cancelled() -> None:
    f = LeanFuture()
    f.set_result(None)
    assert not f.cancel() and not f.cancelled()


def test_a_raising_callback_is_logged_and_the_others_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    f = LeanFuture()
    seen: list[str] = []

    def bad(_f: Any) -> None:
        raise RuntimeError("callback bug")

    f.add_done_callback(lambda _f: seen.append("first"))
    f.add_done_callback(bad)
    f.add_done_callback(lambda _f: seen.append("third"))
    with caplog.at_level(logging.ERROR, logger="concurrent.futures"):
        f.set_result("ok")
        f.add_done_callback(bad)  # added once done: run at once, logged too
        f.add_done_callback(lambda _f: seen.append("late"))
    assert seen == ["first", "third", "late"]
    logged = [r for r in caplog.records if r.exc_info and "callback bug" in str(r.exc_info[1])]
    assert len(logged) == 2


def test_many_threads_each_waiting_on_its_own_future() -> None:
    futures = [LeanFuture() for _ in range(32)]
    got: dict[int, Any] = {}
    lock = threading.Lock()

    def wait_on(i: int) -> None:
        value = futures[i].result(WAIT)
        with lock:
            got[i] = value

    threads = [threading.Thread(target=wait_on, args=(i,)) for i in range(len(futures))]
    for t in threads:
        t.start()
    # settled in reverse from one thread, as the I/O thread does, some before their
    # waiter blocks and some after: every waiter gets its own value
    for i in reversed(range(len(futures))):
        futures[i].set_result(i * 10)
    for t in threads:
        t.join(WAIT)
    assert not any(t.is_alive() for t in threads)
    assert got == {i: i * 10 for i in range(len(futures))}


def test_settle_racing_a_waiter_never_hangs() -> None:
    """The Condition is made the moment a waiter needs one, maybe while the I/O thread
    settles the future: the waiter must still be woken (else it would hang)."""
    for _ in range(300):
        f = LeanFuture()
        start = threading.Barrier(2)

        def settle(f: LeanFuture = f, start: threading.Barrier = start) -> None:
            start.wait(WAIT)
            f.set_result("v")

        t = threading.Thread(target=settle)
        t.start()
        start.wait(WAIT)
        assert f.result(WAIT) == "v"
        t.join(WAIT)


def test_wait_and_as_completed_work_on_them() -> None:
    futures = [LeanFuture() for _ in range(6)]
    futures[0].set_result(0)
    done, pending = cf.wait(futures, timeout=0)
    assert done == {futures[0]} and len(pending) == 5

    first: list[cf.Future[Any]] = []
    waiter = threading.Thread(
        target=lambda: first.extend(
            cf.wait(futures[1:], timeout=WAIT, return_when=cf.FIRST_COMPLETED)[0]
        )
    )
    waiter.start()
    assert wait_until(lambda: futures[1]._cond is not None)  # installed its waiter
    futures[3].set_exception(ConnectionLost("gone"))
    waiter.join(WAIT)
    assert first == [futures[3]]

    for i in (5, 1, 2, 4):
        futures[i].set_result(i)
    order = [f for f in cf.as_completed(futures, timeout=WAIT)]
    assert set(order) == set(futures)
    done, pending = cf.wait(futures, timeout=WAIT, return_when=cf.ALL_COMPLETED)
    assert len(done) == 6 and not pending


def test_as_completed_yields_as_another_thread_settles() -> None:
    futures = [LeanFuture() for _ in range(8)]

    def settle() -> None:
        for i, f in enumerate(futures):
            f.set_result(i)

    t = threading.Thread(target=settle)
    t.start()
    values = sorted(f.result() for f in cf.as_completed(futures, timeout=WAIT))
    t.join(WAIT)
    assert values == list(range(8))


@pytest.mark.parametrize("high", [False, True])
def test_the_acked_push_encoder_makes_the_frame_of_an_acked_push(high: bool) -> None:
    """``push_async`` without headers encodes through the client id's sender
    (``queue_senders``): the octets of the frame it used to build and encode."""
    encode = queue_senders("client-7")[2 + high]
    cases = [("a-1", "orders", 1, b"x" * 100), ("b-99", "q", 65535, b""),
             ("c", "\u00e9t\u00e9", 7, b"\0")]  # fmt: skip
    for mid, channel, queue_id, body in cases:
        frame = queue_frame(mid, channel, queue_id, body, source="client-7", ack=True,
                            headers=None, high_priority=high)  # fmt: skip
        assert encode(queue_id, mid, channel, body) == tmqp.encode(frame)
        decoded = tmqp.decode(encode(queue_id, mid, channel, body))
        assert decoded == frame and decoded.pending_ack and decoded.high_priority is high


# -- against a real broker --------------------------------------------------------------


def pull_all(client: Client, channel: str) -> list[bytes]:
    """The payloads a pull queue holds, pulled until it answers with none."""
    payloads: list[bytes] = []
    while batch := client.pull(channel, 1, count=100, timeout=WAIT * 2):
        payloads += [m.payload for m in batch]
    return payloads


def test_acked_pushes_through_wait_and_as_completed(served: Broker, zctx: Ctx) -> None:
    with Client(served.endpoint, context=zctx, timeout=WAIT * 2).connect() as client:
        client.create_queue("fut", 1, {"Status": 3})  # (a pull queue: read back below)
        client.join("fut")
        futures = [client.push_async("fut", 1, b"m%d" % i) for i in range(200)]
        futures += [client.push_async("fut", 1, "text", high_priority=True)]
        assert all(isinstance(f, cf.Future) for f in futures)
        done, pending = cf.wait(futures, timeout=WAIT * 2)
        assert not pending and len(done) == len(futures)
        for f in cf.as_completed(futures, timeout=WAIT):
            assert f.exception() is None  # acknowledged: the ACK frame is the value
        ids = {f.result().message_id for f in futures}
        assert len(ids) == len(futures)
        got = pull_all(client, "fut")
        assert len(got) == len(futures)
        assert got[0] == b"text"  # (the high-priority one first)


def test_push_many_async_futures_give_the_ack_with_or_without_headers(
    served: Broker, zctx: Ctx
) -> None:
    with Client(served.endpoint, context=zctx, timeout=WAIT * 2).connect() as client:
        client.create_queue("many", 1, {"Status": 3})
        client.join("many")
        plain = client.push_many_async("many", 1, [b"p%d" % i for i in range(100)])
        with_headers = client.push_many_async("many", 1, [b"h0", b"h1"], headers={"k": "v"})
        client.create_queue("small", 1, {"Status": 3, "MessageLimit": 1})
        small = client.push_many_async("small", 1, [b"x", b"y", b"z"])
        for f in cf.as_completed(plain + with_headers, timeout=WAIT * 2):
            assert f.result().message_type == MessageType.ACK
        ids = [f.result().message_id for f in plain + with_headers]
        assert len(set(ids)) == 102
        assert small[0].exception(WAIT * 2) is None
        assert all(isinstance(f.exception(WAIT * 2), RemoteError) for f in small[1:])
        assert len(pull_all(client, "many")) == 102


def test_threads_pushing_and_waiting_each_on_its_futures(served: Broker, zctx: Ctx) -> None:
    with Client(served.endpoint, context=zctx, timeout=WAIT * 2).connect() as client:
        client.create_queue("thr", 1, {"Status": 3})
        client.join("thr")
        errors: list[BaseException] = []
        acked: list[str] = []
        lock = threading.Lock()

        def produce(n: int) -> None:
            try:
                futures = [client.push_async("thr", 1, b"%d-%d" % (n, i)) for i in range(50)]
                mids = [f.result(WAIT * 2).message_id for f in futures]
                with lock:
                    acked.extend(mids)
            except BaseException as exc:  # (reported below)
                errors.append(exc)

        threads = [threading.Thread(target=produce, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT * 3)
        assert not errors and not any(t.is_alive() for t in threads)
        assert len(set(acked)) == 400
        assert len(pull_all(client, "thr")) == 400


@pytest.mark.slow
def test_broker_killed_with_pushes_in_flight(served: Broker, zctx: Ctx) -> None:
    """The broker is stopped (SIGSTOP: it answers nothing from then on), pushes go out
    acknowledged and not, then it is killed: every acknowledged push's future fails with
    ConnectionLost once the silence outlasts ``peer_timeout`` (none hangs, none is
    reported acknowledged) and close() raises UnconfirmedSends for the others."""
    client = Client(served.endpoint, context=zctx, timeout=60, peer_timeout=1.0,
                    backoff=(0.05, 0.2), linger=0.5)  # fmt: skip
    client.connect()
    try:
        client.create_queue("k9", 1)
        assert client.push_async("k9", 1, b"before").result(WAIT) is not None
        proc = served.proc
        assert proc is not None
        stop_process(proc)
        futures = [client.push_async("k9", 1, b"in-flight-%d" % i) for i in range(64)]
        blind = 20
        for i in range(blind):
            client.push("k9", 1, b"blind-%d" % i)
        served.kill()
        assert wait_until(lambda: all(f.done() for f in futures), timeout=WAIT * 3)
        for f in futures:
            error = f.exception(0)
            assert isinstance(error, ConnectionLost), error
            assert "no traffic from the broker" in str(error)
    finally:
        with pytest.raises(UnconfirmedSends) as raised:
            client.close()
    assert raised.value.count == blind
