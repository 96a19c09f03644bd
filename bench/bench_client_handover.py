"""What the client session's request bookkeeping costs per request (``broker.client.session``,
``broker.client.handover``): CPU time and Python calls, no sockets, on one thread.

Rows (one request = a push waiting for its acknowledge, as ``push_many_async`` makes them):

* ``start+settle``: ``Session.start`` for RUN requests, then ``Session.feed`` of each one's
  ACK (the registration, the hand-over when there is one, the settling);
* ``sweep``: ``Session.tick`` when the sweep is due, over WAITING requests none of which is
  late (the I/O thread's 4 sweeps a second while requests wait), per waiting request.

Whatever ``broker`` is importable is measured: run it once with the base tree first on
``PYTHONPATH`` and once without, taking turns (``--turns``), e.g.::

    PYTHONPATH=/tmp/base .venv/bin/python bench/bench_client_handover.py --label base
    .venv/bin/python bench/bench_client_handover.py --label branch

CPU is process time (``time.process_time``), the best of ``--repeat`` rounds; calls are
cProfile's count of function calls, Python and C (deterministic).
"""

from __future__ import annotations

import argparse
import cProfile
import time
from collections.abc import Callable

from call_count import python_calls

from broker import tmqp
from broker.client import session as S
from broker.client.frames import queue_frame
from broker.protocol import ConnectionInfo, Header, MessageType

RUN = 256  # requests started before their acknowledges are read (one push_many batch)
REQUESTS = 100_000
WAITING = 5_000


def ready_session() -> S.Session:
    """A session through its handshake (the broker's answer fed by hand)."""
    session = S.Session(
        "tcp://bench:1",
        ConnectionInfo(name="bench"),
        timeout=1e6,
        ping_interval=1e6,
        peer_timeout=1e6,
    )
    now = time.monotonic()
    session.begin(now, 5.0)
    _greeting, hello = session.hello(now)
    frame = tmqp.decode((hello,))
    assert isinstance(frame, tmqp.Frame)
    answer = tmqp.Frame(
        message_type=MessageType.RESPONSE,
        message_id=frame.message_id,
        headers=((Header.CLIENT_ID, "bench-1"),),
    )
    session.feed(tmqp.encode(answer)[0], now)
    assert session.state is S.SessionState.READY
    return session


def start_and_settle(requests: int) -> Callable[[], None]:
    session = ready_session()
    now = time.monotonic()
    runs = []
    for first in range(0, requests, RUN):
        calls, acks = [], []
        for i in range(first, min(requests, first + RUN)):
            mid = f"m{i}"
            frame = queue_frame(
                mid,
                "bench",
                1,
                b"x" * 100,
                source="bench-1",
                ack=True,
                headers=(),
                high_priority=False,
            )
            calls.append(S.Call(frame, S.Reply.NONE))
            acks.append(tmqp.encode(tmqp.Frame(message_type=MessageType.ACK, message_id=mid))[0])
        runs.append((calls, acks))

    def run() -> None:
        start, feed = session.start, session.feed
        for calls, acks in runs:
            for call in calls:
                start(call, None, now)
            for ack in acks:
                feed(ack, now)
        assert not session.pending

    return run


def sweep(waiting: int) -> Callable[[], None]:
    session = ready_session()
    now = time.monotonic()
    for i in range(waiting):
        frame = queue_frame(
            f"w{i}", "bench", 1, b"x", source="bench-1", ack=True, headers=(), high_priority=False
        )
        session.start(S.Call(frame, S.Reply.NONE), None, now)
    session.tick(now)
    clock = [now]

    def run() -> None:
        for _ in range(100):
            clock[0] += 0.3  # a sweep is due at every tick (one each 0.25 s)
            assert not session.tick(clock[0])

    return run


def measure(make: Callable[[], Callable[[], None]], per: int, repeat: int) -> tuple[float, float]:
    """(best CPU microseconds, Python calls) per unit of work."""
    best = float("inf")
    for _ in range(repeat):
        run = make()
        t0 = time.process_time()
        run()
        best = min(best, time.process_time() - t0)
    run = make()
    profile = cProfile.Profile()
    profile.runcall(run)
    calls = python_calls(profile)
    return best / per * 1e6, calls / per


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--label", default="this tree")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--requests", type=int, default=REQUESTS)
    args = parser.parse_args()
    rows = [
        ("start+settle", lambda: start_and_settle(args.requests), args.requests),
        ("sweep", lambda: sweep(WAITING), 100 * WAITING),
    ]
    head = "CPU us per request | calls per request (cProfile: Python + C functions)"
    print(f"| {args.label} ({S.__file__}) | {head} |")
    print("|---|---|---|")
    for name, make, per in rows:
        us, calls = measure(make, per, args.repeat)
        print(f"| {name} | {us:.3f} | {calls:.2f} |")


if __name__ == "__main__":
    main()
