"""SENDs of one repeated head as one unit, parser to door (session 21), against the
one-frame-at-a-time readers.

* ``FrameParser.feed_streaks_until_error``: the frames of its items (a ``SendStreak``
  is its frames in turn) are what ``feed_until_error`` gives, on the generated streams
  of ``test_send_run_reads``, fed whole, byte by byte or cut anywhere.
* ``read_send_run`` over frames and SendStreaks: the SENDs of its streaks are what
  ``parse_send_control`` of each frame gives, with the window's cut in the middle of a
  SendStreak (its unread SENDs handed back).
* the session: a stream (streaks crossing the window, a body at the limit and one over
  it, garbage in the middle of a streak, a receipt or a transaction appearing
  mid-streak, NUL-bearing bodies with content-length, heart-beats, other frames, a SEND
  the backend refuses part way) read through a batch backend (streaks, runs) and
  through a backend taking one SEND at a time: the same SENDs published, the same bytes
  written back, on STOMP 1.0, 1.1 and 1.2.
* the door: a run's messages share one header block object, stamp included, and ids
  and refusals count SENDs, not streaks.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.engine.engine import Engine
from broker.engine.options import ChannelOptions
from broker.message import Message
from broker.stomp.backend import ConnectionInfo, Refusal
from broker.stomp.destinations import parse_destinations
from broker.stomp.engine_backend import EngineBackend, EngineDoor
from broker.stomp.engine_mapping import QUEUE_ID, QUEUE_OPTIONS, channel_rest
from broker.stomp.errors import BackendError
from broker.stomp.frames import Command, Frame, FrameParser, Limits, SendStreak, Version
from broker.stomp.memory import MemoryBackend
from broker.stomp.session import Session, SessionConfig
from broker.stomp.subscription import PublishSpec, PublishStreak, SendRun, read_send_run
from tests.stomp.test_send_run_reads import BLOCKS, RUNS, _copy, _frames, _oracle, _parser

# -- the parser ---------------------------------------------------------------------------


def _unfolded(items: list[Frame | SendStreak]) -> list[Frame]:
    out: list[Frame] = []
    for item in items:
        if isinstance(item, SendStreak):
            assert item.command is Command.SEND and item.bodies
            assert len({len(body) for body in item.bodies}) == 1  # one content-length
            out += item.frames()
        else:
            out.append(item)
    return out


def _read(
    parser: FrameParser, pieces: list[bytes], streaks: bool
) -> tuple[list[Frame], str | None, bool, int]:
    out: list[Frame] = []
    for piece in pieces:
        if streaks:
            items, error = parser.feed_streaks_until_error(piece)
            got = _unfolded(items)
        else:
            got, error = parser.feed_until_error(piece)
        out += got
        if error is not None:
            return out, f"{type(error).__name__}: {error}", False, parser.heartbeats
    return out, None, parser.idle, parser.heartbeats


def _pieces(stream: bytes, cuts: list[int]) -> list[list[bytes]]:
    bounds = [0, *sorted({c for c in cuts if c < len(stream)}), len(stream)]
    return [
        [stream],
        [stream[i : i + 1] for i in range(len(stream))],
        [stream[a:b] for a, b in itertools.pairwise(bounds) if b > a],
    ]


@settings(max_examples=300, deadline=None)
@given(
    runs=RUNS,
    version=st.sampled_from([None, Version.V1_0, Version.V1_1, Version.V1_2]),
    cuts=st.lists(st.integers(1, 400), max_size=4),
    eols=st.booleans(),
)
def test_streaks_unfold_to_the_frames_the_parser_gives(
    runs: list[tuple[int, int, int, bool]],
    version: Version | None,
    cuts: list[int],
    eols: bool,
) -> None:
    """Every stream, whole or in pieces: the streak reading's frames, error, idleness and
    heart-beat count are the frame reading's (``eols``: a heart-beat after every
    third frame)."""
    frames = _frames(runs)
    if eols:
        frames = [f + (b"\n" if i % 3 == 2 else b"") for i, f in enumerate(frames)]
    stream = b"".join(frames)
    for pieces in _pieces(stream, cuts):
        expected = _read(_parser(version), pieces, streaks=False)
        assert _read(_parser(version), pieces, streaks=True) == expected


def test_a_long_run_of_one_head_comes_as_streaks_that_unfold_to_its_frames() -> None:
    """stomp.py's auto-ack SENDs (every head alike) in 64 KiB reads cut anywhere: after
    the first few frames, each read's SENDs come as one streak sharing one headers tuple;
    bodies with NULs (content-length) and a body holding the head's own bytes included."""
    head = b"SEND\ncontent-length:100\ndestination:/queue/bench\n\n"
    bodies = [bytes([i % 7]) * 50 + head[:50] for i in range(3000)]  # NULs, a fake head
    stream = b"".join(head + body + b"\0" for body in bodies)
    parser = FrameParser(version=Version.V1_2)
    items: list[Frame | SendStreak] = []
    for at in range(0, len(stream), 65536):
        got, error = parser.feed_streaks_until_error(stream[at : at + 65536])
        assert error is None
        items += got
    assert [f.body for f in _unfolded(items)] == bodies
    streaks = [item for item in items if isinstance(item, SendStreak)]
    assert sum(len(s.bodies) for s in streaks) > 2900
    assert len({id(s.headers) for s in streaks}) == 1


def test_a_bad_nul_in_the_middle_of_a_streak_ends_it_with_the_error_the_frame_gives() -> None:
    head = b"SEND\ncontent-length:3\ndestination:/queue/a\n\n"
    stream = (head + b"abc\0") * 6 + head + b"abcd\0" + (head + b"abc\0") * 2
    for pieces in _pieces(stream, [50, 200]):
        expected = _read(FrameParser(version=Version.V1_2), pieces, streaks=False)
        assert expected[1] is not None and len(expected[0]) == 6
        assert _read(FrameParser(version=Version.V1_2), pieces, streaks=True) == expected


# -- the run reader -----------------------------------------------------------------------

ITEMS = st.lists(
    st.tuples(
        st.integers(0, len(BLOCKS) - 1),
        st.booleans(),  # the block's own tuple (shared), or an equal copy
        st.booleans(),  # a SendStreak (else a frame per SEND)
        st.integers(1, 6),  # SENDs
        st.integers(0, 4),  # body size (one for the SENDs of one item)
        st.booleans(),  # an ACK instead
    ),
    max_size=12,
)


def _items(spec: list[tuple[int, bool, bool, int, int, bool]]) -> list[Frame | SendStreak]:
    items: list[Frame | SendStreak] = []
    number = itertools.count()
    for block, shared, streak, sends, size, ack in spec:
        headers = BLOCKS[block] if shared else _copy(BLOCKS[block])
        if ack:
            items.append(Frame(Command.ACK, headers))
            continue
        bodies = [b"%d" % next(number) for _ in range(sends)]
        bodies = [(body * size)[:size] for body in bodies]
        if streak:
            items.append(SendStreak(Command.SEND, headers, bodies))
        else:
            items += [Frame(Command.SEND, headers, body) for body in bodies]
    return items


def _specs(run: SendRun) -> tuple[list[PublishSpec], list[str | None], int]:
    specs = [spec for streak in run.streaks for spec in streak.specs()]
    assert run.sends == len(specs)
    return specs, run.receipts, run.size


@settings(max_examples=500, deadline=None)
@given(
    spec=ITEMS,
    room=st.integers(0, 40),
    room_bytes=st.integers(0, 80),
    now_ms=st.integers(0, 10**6),
)
def test_a_run_of_frames_and_streaks_reads_as_each_send_in_turn(
    spec: list[tuple[int, bool, bool, int, int, bool]], room: int, room_bytes: int, now_ms: int
) -> None:
    """The SENDs, receipts and size of each SEND read alone (``_oracle``); what was read
    whole (``items``) and the cut streak's unread SENDs (``rest``) add up to the SENDs
    taken; streaks in a row differ (destinations or carried headers not the same
    objects, or other rules)."""
    items = _items(spec)
    frames = _unfolded(items)
    run = read_send_run(items, room, room_bytes, broker_id="b", connection_id=7, now_ms=now_ms)
    assert _specs(run) == _oracle(frames, room, room_bytes, now_ms)
    read = _unfolded(items[: run.items])
    if run.rest is not None:
        cut = items[run.items]
        assert isinstance(cut, SendStreak) and run.rest.headers is cut.headers
        assert 0 < len(run.rest.bodies) < len(cut.bodies)
        read += _unfolded(
            [SendStreak(cut.command, cut.headers, cut.bodies[: -len(run.rest.bodies)])]
        )
    assert len(read) == run.sends
    for before, after in itertools.pairwise(run.streaks):  # (else they would be one)
        assert (
            before.destinations is not after.destinations
            or before.headers is not after.headers
            or before[3:] != after[3:]
        )


def test_a_streak_cut_by_the_window_of_bytes_takes_the_sends_that_start_within_it() -> None:
    """Room for 25 bytes, bodies of 10: three SENDs go (they start at 0, 10 and 20 bytes),
    as one by one; a receipt on every SEND of the streak; room for 2 SENDs: two."""
    headers = (("destination", "/queue/a"), ("receipt", "r"))
    streak = SendStreak(Command.SEND, headers, [b"%010d" % i for i in range(6)])
    run = read_send_run([streak], 100, 25, broker_id="b", connection_id=7, now_ms=0)
    assert [s.bodies for s in run.streaks] == [streak.bodies[:3]]
    assert run.receipts == ["r"] * 3 and run.size == 30 and run.items == 0
    assert run.rest == SendStreak(Command.SEND, headers, streak.bodies[3:])
    run = read_send_run([streak], 2, 1000, broker_id="b", connection_id=7, now_ms=0)
    assert run.sends == 2 and run.rest is not None and len(run.rest.bodies) == 4


# -- the session --------------------------------------------------------------------------


class _Later(MemoryBackend):
    """Takes SENDs one at a time (``publish_async``) in the order handed over (as the
    engine thread runs operations) and answers when told (``step``): each SEND taken is
    logged, a body ``refuse`` is refused, and nothing of the connection is taken after a
    refusal (as the engine's door does).  A synchronous ``publish`` is taken at once.
    A SEND with header ``bad:x`` is refused at once (BackendError, as ``check_headers``
    refuses one)."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, tuple[tuple[str, str], ...], bytes]] = []
        self.pending: list[tuple[Any, int, int, bool]] = []  # answer, taken, of, batch
        self.failed = False

    def publish_async(self, connection_id: int, spec: Any, answer: Any) -> None:
        if ("bad", "x") in spec.headers:  # (refused at once, as check_headers does)
            raise BackendError("bad header")
        self.pending.append((answer, self._take([spec]), 1, False))

    def publish(self, connection_id: int, spec: Any) -> None:
        if not self._take([spec]):
            raise BackendError("refused")

    def _take(self, specs: list[PublishSpec]) -> int:
        """How many of ``specs`` are taken (logged), in order."""
        for taken, spec in enumerate(specs):
            if self.failed or spec.body == b"refuse":
                self.failed = True
                return taken
            dest = ",".join(d.stomp for d in spec.destinations)
            self.log.append((dest, spec.headers, spec.body))
        return len(specs)

    def step(self) -> bool:
        """Answer the oldest hand-over; False: none waits."""
        if not self.pending:
            return False
        answer, taken, of, batch = self.pending.pop(0)
        error = None if taken == of else Refusal("refused")
        if batch:
            answer(taken, error)
        else:
            answer(error)
        return True


class _Runs(_Later):
    """:class:`_Later` that also takes runs (``publish_batch``): the session's streaks."""

    def publish_batch(self, connection_id: int, streaks: Any, answer: Any) -> None:
        for streak in streaks:
            assert isinstance(streak, PublishStreak) and streak.bodies
            if ("bad", "x") in streak.headers:  # nothing handed over
                raise BackendError("bad header")
        specs = [spec for streak in streaks for spec in streak.specs()]
        self.pending.append((answer, self._take(specs), len(specs), True))


_HEAD = "SEND\ndestination:/queue/a\ncontent-length:{n}\n"
#: SEND heads (without the empty line; ``{n}``: the body's length) a stream repeats
HEADS = [
    _HEAD,
    _HEAD + "receipt:r1\n",
    _HEAD + "receipt:r2\n",
    _HEAD + "x:a\\cb\n",  # an escape: a carried header read as 1.0 or 1.1/1.2 says
    _HEAD + "transaction:t\n",
    "SEND\ndestination:/queue/b\ncontent-length:{n}\npersistent:true\n",
    "SEND\ndestination:/queue/a\n",  # no content-length: the body ends at its NUL
    "SEND\ndestination:/queue/a,/topic/t\ncontent-length:{n}\n",
    "SEND\ndestination:nowhere\ncontent-length:{n}\nreceipt:bad\n",
    _HEAD + "bad:x\nreceipt:r3\n",  # refused by the backend at once (a run: one by one)
]
#: bodies: a NUL-bearing one, the limit's size (8), one over it, the refused one
BODIES = [b"", b"ab", b"a\0b\0", b"12345678", b"123456789", b"refuse"]
#: what may come between streaks
OTHERS = [
    b"\n",
    b"\r\n",
    b"BEGIN\ntransaction:t\n\n\0",
    b"COMMIT\ntransaction:t\nreceipt:c\n\n\0",
    b"ABORT\ntransaction:t\n\n\0",
    b"SUBSCRIBE\nid:s\ndestination:/queue/z\nreceipt:sub\n\n\0",
    b"GARBAGE\n\n\0",
]

STREAMS = st.lists(
    st.one_of(
        st.tuples(
            st.sampled_from([0, 1, 3, 5, 6]) | st.integers(0, len(HEADS) - 1),  # (half good)
            st.integers(1, 12),  # SENDs in a row
            st.sampled_from([0, 1, 2, 3]) | st.integers(0, len(BODIES) - 1),
            st.integers(-1, 11),  # the SEND (if any) whose body is the next one instead
        ),
        st.integers(0, len(OTHERS) - 1),
    ),
    min_size=1,
    max_size=8,
)


def _stream(parts: list[tuple[int, int, int, int] | int], weights: tuple[int, int]) -> bytes:
    out = []
    for part in parts:
        if isinstance(part, int):
            if part == len(OTHERS) - 1 and weights[0] % 3:  # (garbage seldom)
                continue
            out.append(OTHERS[part])
            continue
        head, times, body, odd = part
        for i in range(times):
            chosen = BODIES[(body + 1) % len(BODIES) if i == odd else body]
            if "{n}" not in HEADS[head] and b"\0" in chosen:
                chosen = b"nul"  # (a NUL would end it early: another frame, not this test)
            out.append(HEADS[head].format(n=len(chosen)).encode() + b"\n" + chosen + b"\0")
    return b"".join(out)


def _outcome(
    backend: _Later, version: Version, stream: bytes, cuts: list[int], config: SessionConfig
) -> tuple[object, ...]:
    """What a session on ``backend`` publishes and writes for ``stream`` read in the
    pieces ``cuts`` make, the backend answering one hand-over after each piece."""
    session = Session(backend, 1, 0.0, config=config, wall_clock_ms=lambda: 0)
    accept = "" if version is Version.V1_0 else f"accept-version:{version.value}\nhost:localhost\n"
    session.receive(f"CONNECT\n{accept}\n\0".encode(), 0.0)
    out = [session.take_output(0.0)]
    assert out[0].startswith(b"CONNECTED\n") and session.version is version
    bounds = [0, *sorted({c for c in cuts if c < len(stream)}), len(stream)]
    for a, b in itertools.pairwise(bounds):
        if b > a:
            session.receive(stream[a:b], 1.0)
            backend.step()
            out.append(session.take_output(1.0))
    while backend.step():
        out.append(session.take_output(2.0))
    return backend.log, b"".join(out), session.state, session.reading_paused


WINDOWS = [(1, 1 << 24), (2, 1 << 24), (3, 10), (5, 1), (1000, 17), (1000, 1 << 24)]


@settings(max_examples=600, deadline=None)
@given(
    parts=STREAMS,
    version=st.sampled_from([Version.V1_0, Version.V1_1, Version.V1_2]),
    window=st.sampled_from(WINDOWS),
    cuts=st.lists(st.integers(1, 600), max_size=5),
    weights=st.tuples(st.integers(0, 2), st.integers(0, 2)),
)
def test_a_session_reading_streaks_publishes_and_answers_as_one_send_at_a_time(
    parts: list[tuple[int, int, int, int] | int],
    version: Version,
    window: tuple[int, int],
    cuts: list[int],
    weights: tuple[int, int],
) -> None:
    stream = _stream(parts, weights)
    config = SessionConfig(
        limits=Limits(max_body=8),
        max_unanswered_sends=window[0],
        max_unanswered_bytes=window[1],
    )
    streaks = _outcome(_Runs(), version, stream, cuts, config)
    alone = _outcome(_Later(), version, stream, cuts, config)
    assert streaks == alone


def test_a_streak_crossing_the_window_goes_in_cuts_with_its_receipts_in_order() -> None:
    """Ten SENDs of one head with a receipt (one streak after the first frames), a window
    of 3 SENDs: handed over 3 at a time, every RECEIPT in order, all published."""
    frame = (_HEAD + "receipt:r1\n").format(n=2).encode() + b"\nab\0"
    config = SessionConfig(max_unanswered_sends=3)
    backend = _Runs()
    log, out, *_ = _outcome(backend, Version.V1_2, frame * 10, [], config)
    assert len(log) == 10 and out.count(b"RECEIPT\nreceipt-id:r1\n\n\0") == 10
    assert (log, out) == _outcome(_Later(), Version.V1_2, frame * 10, [], config)[:2]


def test_a_streak_of_transactional_sends_is_buffered_whole_and_goes_at_commit() -> None:
    """Plain SENDs, then a streak of one head with ``transaction:t`` (the run path does
    not take it: its SENDs go one by one into the transaction), plain ones again, the
    COMMIT: every SEND published once, the transaction's at COMMIT, receipts in order."""
    plain = _HEAD.format(n=2).encode() + b"\n"
    tx = (_HEAD + "transaction:t\n").format(n=2).encode() + b"\n"
    stream = b"".join(
        [plain + b"p%d\0" % i for i in range(5)]
        + [b"BEGIN\ntransaction:t\n\n\0"]
        + [tx + b"t%d\0" % i for i in range(8)]
        + [plain + b"q%d\0" % i for i in range(3)]
        + [b"COMMIT\ntransaction:t\nreceipt:c\n\n\0"]
    )
    for window in ((1000, 1 << 24), (2, 1 << 24)):
        config = SessionConfig(max_unanswered_sends=window[0])
        log, out, *_ = _outcome(_Runs(), Version.V1_2, stream, [], config)
        bodies = [b"p%d" % i for i in range(5)] + [b"q%d" % i for i in range(3)]
        assert [body for _, _, body in log] == bodies + [b"t%d" % i for i in range(8)]
        assert out.endswith(b"RECEIPT\nreceipt-id:c\n\n\0") and b"ERROR" not in out
        assert (log, out) == _outcome(_Later(), Version.V1_2, stream, [], config)[:2]


class _NoRuns(_Runs):
    """Refuses every run at once (BackendError, nothing handed over), as a batch
    backend may: the session then hands its SENDs over one by one."""

    def publish_batch(self, connection_id: int, streaks: Any, answer: Any) -> None:
        raise BackendError("no runs today")


def test_runs_refused_at_once_go_one_by_one_streaks_cut_by_the_window_included() -> None:
    """Streaks of one head, a window of 3 SENDs (each run cuts a streak): every run is
    refused at once, so every SEND goes alone -- all of them, once, in order."""
    frame = (_HEAD + "receipt:r1\n").format(n=2).encode() + b"\nab\0"
    stream = b"".join(frame[:-3] + b"%02d\0" % i for i in range(12))
    config = SessionConfig(max_unanswered_sends=3)
    log, out, *_ = _outcome(_NoRuns(), Version.V1_2, stream, [70, 600], config)
    assert [body for _, _, body in log] == [b"%02d" % i for i in range(12)]
    assert out.count(b"RECEIPT\nreceipt-id:r1\n\n\0") == 12 and b"ERROR" not in out
    assert (log, out) == _outcome(_Later(), Version.V1_2, stream, [70, 600], config)[:2]


# -- the door -----------------------------------------------------------------------------


class _Door:
    """The engine's backend and door on one thread, connection ``1`` attached: the
    messages reaching ``Engine.publish_many`` and the runs' answers are kept."""

    def __init__(self) -> None:
        self.door = EngineDoor(Engine())
        self.backend = EngineBackend(self.door, wall_clock_ms=lambda: 1234)
        self.posted: list[Any] = []
        self.backend.bind(self.posted.append, lambda: None)
        self.seen: list[Message] = []
        self.answers: list[tuple[int, Refusal | None]] = []
        engine = self.door.engine
        publish_many = engine.publish_many

        def spy(client_id: str, messages: list[Message], *args: Any, **kwargs: Any) -> Any:
            self.seen.extend(messages)
            return publish_many(client_id, messages, *args, **kwargs)

        engine.publish_many = spy  # type: ignore[method-assign]
        self.backend.attach(ConnectionInfo(1, "u", "default", "1.2"), lambda d: True)
        self.pump()

    def pump(self) -> None:
        while self.door.pending_ops or self.posted:
            self.door.run_ops(0.0)
            while self.posted:
                self.posted.pop(0)()

    def publish(self, run: list[PublishStreak]) -> None:
        self.backend.publish_batch(1, run, lambda *answer: self.answers.append(answer))
        self.pump()


def _streak(destination: str, headers: tuple[tuple[str, str], ...], n: int) -> PublishStreak:
    dest = parse_destinations(
        destination, broker_id="default", connection_id=1, allow_wildcards=False
    )
    return PublishStreak(dest, headers, [b"%d" % i for i in range(n)])


def test_a_runs_messages_share_one_header_block_with_the_stamp_and_count_sends() -> None:
    """Streaks with user headers (equal ones, not one tuple) to a queue, another one,
    the first again: every message holds the same header block object, the user's then
    the stamp; ids count SENDs across streaks and destinations; one answer."""
    door = _Door()
    first = _streak("/queue/a", (("x", "1"),), 3)
    second = _streak("/queue/b", (("x", "1"),), 2)
    door.publish([first, second, first._replace(bodies=[b"z"])])
    seen = door.seen
    assert len(seen) == 6 and len({id(m.headers) for m in seen}) == 1
    assert seen[0].headers == (("x", "1"), ("Stomp-User", "u"), ("Stomp-Timestamp", "1234"))
    prefix = door.door.id_prefix  # (s<nonce>-: new in each process)
    assert [m.message_id for m in seen] == [f"{prefix}1-{i}" for i in range(1, 7)]
    assert [(m.target, m.payload) for m in seen] == [
        ("a", b"0"),
        ("a", b"1"),
        ("a", b"2"),
        ("b", b"0"),
        ("b", b"1"),
        ("a", b"z"),
    ]
    assert door.answers == [(6, None)]
    door.publish([_streak("/queue/a", (), 2)])  # (no user header: the stamp itself)
    assert door.seen[-1].headers is door.seen[-2].headers
    assert door.answers[-1] == (2, None)
    assert [m.message_id for m in seen[-2:]] == [f"{prefix}1-7", f"{prefix}1-8"]


def test_a_send_refused_in_the_middle_of_a_streak_is_counted_in_sends() -> None:
    """A queue taking bodies of 1 byte at most: streaks [a b c] [d ee f] -- the fifth
    SEND is refused, the four before it taken, nothing after it."""
    door = _Door()
    engine = door.door.engine
    limited = dataclasses.replace(QUEUE_OPTIONS, message_size_limit=1)
    rest = channel_rest(engine.config.channel_defaults)
    engine.create_channel("full", ChannelOptions(**rest), [])
    engine.create_queue("full", QUEUE_ID, limited, [])
    first = _streak("/queue/full", (), 3)
    second = first._replace(bodies=[b"d", b"ee", b"f"])
    door.publish([first, second])
    ((taken, error),) = door.answers
    assert taken == 4 and error is not None and "/queue/full" in error.reason
    assert engine.channels["full"].queues[QUEUE_ID].sequence == 4
