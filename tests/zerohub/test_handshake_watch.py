"""``zerohub.zmqkit.HandshakeWatch``: a handshake refused, hung up on, or never answered.

Two kinds of test.  First the rules, worked out by hand: monitor events written in
libzmq's own format (event u16 + value u32, native order; then the endpoint) into a
real inproc PAIR that the watch reads, one read at a time, so that an event and the
disconnect libzmq reports after it can be split across reads as they are under load.
Then real peers on loopback TCP: a listener that never answers (a stopped server, seen
through a short handshake timer), one that hangs up on every greeting (what a CURVE
server does to a plain client when it reads the client's mechanism first), and one
that hangs up once and then never answers (a server killed mid-handshake).

Was (session 13, adv13): a handshake ended by the timer read as "the server requires
CURVE" (plain) or "CURVE settings differ?" (CURVE client), and late13's attempt to fix it
lost the pairing of a failure and its disconnect across reads (a FILEMQ sync logged a
lost connection first).  The clients' own tests: ``tests/broker/test_connect_stopped_serve.py``,
``tests/filemq/test_sync_stopped_server.py``.
"""

from __future__ import annotations

import errno
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq

from tests.polling import WAIT, wait_until
from tests.zerohub.support import GreetingPeer
from zerohub import zmqkit
from zerohub.zmqkit import Handshake, HandshakeWatch, MonitorReport

Ctx = zmq.Context[zmq.Socket[bytes]]

_NO_DETAIL = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
_PROTOCOL = zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
_AUTH = zmq.EVENT_HANDSHAKE_FAILED_AUTH
_DISCONNECTED = zmq.EVENT_DISCONNECTED
#: The client's ZMTP handshake timer in the real-peer tests (libzmq's default is 30 s).
_HANDSHAKE_IVL_MS = 100


class Feed:
    """A watch reading a PAIR into which the test writes monitor events."""

    def __init__(self, zctx: Ctx, *, curve: bool) -> None:
        endpoint = f"inproc://monitor-{id(self)}"
        self.reader = zctx.socket(zmq.PAIR)
        self.reader.bind(endpoint)
        self.writer = zctx.socket(zmq.PAIR)
        self.writer.connect(endpoint)
        self.watch = HandshakeWatch(self.reader, curve=curve)

    def read(self, *events: tuple[int, int]) -> MonitorReport:
        """Write ``events`` (event, value), then one read of the watch."""
        for event, value in events:
            head = event.to_bytes(2, sys.byteorder) + value.to_bytes(4, sys.byteorder)
            self.writer.send_multipart([head, b"tcp://127.0.0.1:5555"])
        if events:
            assert self.reader.poll(WAIT * 1000)  # (all written: each send flushed)
        return self.watch.read()

    def close(self) -> None:
        self.watch.close(None)
        self.writer.close(linger=0)


@pytest.fixture(params=[False, True], ids=["plain", "curve"])
def feed(request: pytest.FixtureRequest, zctx: Ctx) -> Iterator[Feed]:
    fed = Feed(zctx, curve=request.param)
    yield fed
    fed.close()


def _refusal(curve: bool) -> Handshake:
    """What a peer hanging up on every dial means to a client of this kind."""
    return Handshake.MISMATCH if curve else Handshake.CURVE_REQUIRED


def test_handshakes_the_timer_ended_are_no_refusal_nor_lost_connections(feed: Feed) -> None:
    # (the value of a timer's failure is the I/O thread's last errno: EAGAIN here)
    for n in range(1, 4):
        assert feed.read((_NO_DETAIL, errno.EAGAIN)) == MonitorReport(unanswered=n)
        assert feed.read((_DISCONNECTED, 14)) == MonitorReport(unanswered=n)  # its own
    assert feed.read() == MonitorReport(unanswered=3)


def test_a_peer_hanging_up_twice_is_a_refusal_once_is_not(feed: Feed) -> None:
    assert feed.read((_NO_DETAIL, errno.EPIPE)) == MonitorReport(hangups=1)
    assert feed.read((_DISCONNECTED, 14)) == MonitorReport(hangups=1)  # (its own, read later)
    assert feed.read((_NO_DETAIL, errno.EAGAIN), (_DISCONNECTED, 14)) == MonitorReport(
        hangups=1, unanswered=1
    )
    second = feed.read((_NO_DETAIL, errno.ECONNRESET))
    assert second == MonitorReport(_refusal(feed.watch.curve), hangups=2, unanswered=1)
    assert feed.read((_DISCONNECTED, 14)) == second  # the verdict stays; no lost connection


def test_a_mechanism_mismatch_is_told_at_once(feed: Feed) -> None:
    mismatch = zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH
    assert feed.read((_PROTOCOL, mismatch)) == MonitorReport(_refusal(feed.watch.curve))
    assert feed.read((_DISCONNECTED, 14)) == MonitorReport(_refusal(feed.watch.curve))


def test_another_protocol_error_is_a_mismatch(feed: Feed) -> None:
    other = zmq.PROTOCOL_ERROR_ZMTP_UNEXPECTED_COMMAND
    assert feed.read((_PROTOCOL, other)) == MonitorReport(Handshake.MISMATCH)


def test_a_refused_key_outranks_what_came_before(feed: Feed) -> None:
    hung_up = (_NO_DETAIL, errno.EPIPE)
    feed.read(hung_up, (_DISCONNECTED, 14), hung_up, (_DISCONNECTED, 14))
    report = feed.read((_AUTH, 400), (_DISCONNECTED, 14))
    assert report == MonitorReport(Handshake.KEY_REFUSED, hangups=2)
    mismatch = zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH
    assert feed.read((_PROTOCOL, mismatch)).handshake is Handshake.KEY_REFUSED


def test_a_disconnect_after_no_failure_is_a_lost_connection_reported_once(feed: Feed) -> None:
    assert feed.read((_DISCONNECTED, 14)) == MonitorReport(disconnected=True)
    assert feed.read() == MonitorReport()
    # a failure's disconnect, then one of its own: one lost connection
    report = feed.read((_NO_DETAIL, errno.EAGAIN), (_DISCONNECTED, 14), (_DISCONNECTED, 15))
    assert report == MonitorReport(disconnected=True, unanswered=1)


# -- real peers on loopback ---------------------------------------------------------------


def _reports(
    zctx: Ctx,
    tmp_path: Path,
    answers: Callable[[int], str],
    until: Callable[[MonitorReport], bool],
    *,
    curve: bool,
) -> list[MonitorReport]:
    """A DEALER (CURVE when ``curve``, with a short handshake timer) dialling a
    ``GreetingPeer(answers)``, its watch read until ``until(report)``: every report read."""
    listener = GreetingPeer(answers)
    zctx.setsockopt(zmq.HANDSHAKE_IVL, _HANDSHAKE_IVL_MS)  # (sockets made from now on)
    sock = zctx.socket(zmq.DEALER)
    sock.linger = 0
    events = zmqkit.HANDSHAKE_EVENTS | zmq.EVENT_DISCONNECTED
    watch = HandshakeWatch(sock.get_monitor_socket(events), curve=curve)
    reports: list[MonitorReport] = []

    def done() -> bool:
        watch.socket.poll(50)
        reports.append(watch.read())
        return until(reports[-1])

    try:
        if curve:
            _public, secret = zmqkit.new_certificate("client", tmp_path)
            zmqkit.new_certificate("server", tmp_path)
            zmqkit.configure_client(sock, secret, tmp_path / "server.key")
        sock.connect(listener.endpoint)
        assert wait_until(done, WAIT * 3), reports[-1]
    finally:
        watch.close(sock)
        sock.close(linger=0)
        listener.close()
    return reports


@pytest.mark.parametrize("curve", [False, True], ids=["plain", "curve"])
def test_a_server_that_never_answers_is_no_refusal(zctx: Ctx, tmp_path: Path, curve: bool) -> None:
    """Three dials ended by the handshake timer: nothing refused, nothing lost."""
    seen = _reports(zctx, tmp_path, lambda n: "silent", lambda r: r.unanswered >= 3, curve=curve)
    assert all(r.handshake is None and not r.disconnected and r.hangups == 0 for r in seen), seen


@pytest.mark.parametrize("curve", [False, True], ids=["plain", "curve"])
def test_a_server_that_hangs_up_on_every_greeting_refuses_at_the_second(
    zctx: Ctx, tmp_path: Path, curve: bool
) -> None:
    seen = _reports(
        zctx, tmp_path, lambda n: "hang up", lambda r: r.handshake is not None, curve=curve
    )
    assert seen[-1].handshake is _refusal(curve)
    assert all(r.hangups >= zmqkit.HANGUPS_FOR_VERDICT for r in seen if r.handshake), seen
    assert not any(r.disconnected or r.unanswered for r in seen), seen


def test_one_hang_up_then_silence_is_no_refusal(zctx: Ctx, tmp_path: Path) -> None:
    """A server killed mid-handshake hangs up once; what answers next is another matter
    (here: nothing, as a stopped successor would)."""
    seen = _reports(
        zctx,
        tmp_path,
        lambda n: "hang up" if n == 0 else "silent",
        lambda r: r.unanswered >= 2,
        curve=False,
    )
    assert seen[-1].hangups == 1
    assert all(r.handshake is None and not r.disconnected for r in seen), seen
