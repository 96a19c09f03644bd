"""The clients' sans-IO session core (``broker.client.session``), driven by hand.

No sockets: frames go in as octets with a ``now``; the events that come out are checked.
A hostile or broken broker (garbage, split frames, answers to nothing, answers of the
wrong kind, silence) must end in a ``ClientError`` for the request concerned and leave
the session usable for the next one.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from concurrent.futures import Future
from typing import Any

import pytest

from broker import tmqp
from broker.client import session as S
from broker.client.errors import (
    AccessRefused,
    ClientError,
    ConnectError,
    ConnectionLost,
    ProtocolError,
    RemoteError,
    RequestTimeout,
)
from broker.client.frames import Joining, pull_frame
from broker.protocol import (
    GREETING,
    ConnectionInfo,
    Header,
    MessageType,
    NoContent,
    Operation,
    ResultCode,
)
from tests.zproto.test_import_cycles import ROOT, cycles, import_graph


def encode(**fields: Any) -> bytes:
    return tmqp.encode(tmqp.Frame(**fields))[0]


def ready_session(headers: tuple[tuple[str, str], ...] = (), **kw: Any) -> tuple[S.Session, float]:
    """A session through its handshake at t=100 (answer from the broker's side, with
    ``headers`` beside the client id and the secret)."""
    session = S.Session("tcp://broker:1", ConnectionInfo(name="t"), **kw)
    now = 100.0
    session.begin(now, 5.0)
    greeting, hello = session.hello(now)
    assert greeting == GREETING
    frame = tmqp.decode((hello,))
    assert isinstance(frame, tmqp.Frame) and frame.pending_response
    answer = encode(
        message_type=MessageType.RESPONSE,
        message_id=frame.message_id,
        headers=((Header.CLIENT_ID, "me"), (Header.SESSION_SECRET, "s3"), *headers),
    )
    events = session.feed(answer, now)
    assert events == (S.Ready("me", True),) or list(events) == [S.Ready("me", True)]
    assert session.state is S.SessionState.READY and session.session_secret == "s3"
    return session, now


def start(session: S.Session, call: S.Call, now: float, timeout: float = 2.0) -> Future[Any]:
    waiter: Future[Any] = Future()
    data = session.start(call, waiter, now, timeout)
    assert tmqp.decode((data,)) == call.frame
    return waiter


def apply(events: Any) -> list[Any]:
    """Resolve the waiters the events name; the other events, for the test to look at."""
    rest = []
    for ev in events:
        if isinstance(ev, S.Settled | S.Failed):
            S.resolve(ev)
        else:
            rest.append(ev)
    return rest


def queue_info_call(session: S.Session) -> S.Call:
    from broker.client.admin import operation_frame

    frame = operation_frame(session.new_id(), Operation.QUEUE_INFO, "c", queue_id=1, response=True)
    return S.Call(frame, S.Reply.JSON)


def echo_still_works(session: S.Session, now: float) -> None:
    """The session is usable: a new request is answered and settled."""
    call = S.Call(
        tmqp.Frame(message_type=MessageType.SERVER, pending_ack=True, message_id=session.new_id()),
        S.Reply.NONE,
    )
    waiter = start(session, call, now)
    apply(
        session.feed(encode(message_type=MessageType.ACK, message_id=call.frame.message_id), now)
    )
    assert waiter.done() and waiter.result() is None
    assert call.frame.message_id not in session.pending


# -- the module's shape ---------------------------------------------------------------


def test_the_client_modules_import_one_way() -> None:
    graph = import_graph("broker")
    client = {
        name: {t for t in targets if t.startswith("broker.client.")}
        for name, targets in graph.items()
        if name.startswith("broker.client.")
    }
    assert {"broker.client.session", "broker.client.blocking", "broker.client.aio"} <= set(client)
    assert cycles(client) == []
    assert not [part for part in cycles(graph) if any(m.startswith("broker.client") for m in part)]


def test_the_session_core_does_no_io() -> None:
    """sans-IO: no zmq, asyncio, threading or socket in the core's imports, nor loaded by it."""
    io = {"zmq", "asyncio", "threading", "socket", "selectors"}
    for module in ("session", "api", "admin", "frames", "message", "errors"):
        tree = ast.parse((ROOT / "broker" / "client" / f"{module}.py").read_text())
        names = {
            alias.name.split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.Import)
            for alias in node.names
        } | {
            (node.module or "").split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
        }
        assert not names & io, f"broker.client.{module} imports {names & io}"
    code = (
        "import sys, broker.client.session, broker.client.api;"
        "print(sorted(m for m in ('zmq', 'asyncio') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# -- the handshake --------------------------------------------------------------------


def test_a_refusal_for_good_closes_and_a_temporary_one_retries() -> None:
    session = S.Session("tcp://b:1", ConnectionInfo(), backoff=(0.1, 0.1))
    session.begin(0.0, 5.0)
    session.hello(0.0)
    busy = encode(
        message_type=MessageType.TERMINATE,
        content_type=ResultCode.BUSY,
        headers=((Header.REASON, "later"),),
    )
    events = session.feed(busy, 0.1)
    assert [type(e) for e in events] == [S.Lost] and session.state is S.SessionState.BACKOFF
    assert session.tick(0.1 + 0.2) == [S.Dial()]
    session.hello(0.3)
    no = encode(message_type=MessageType.TERMINATE, content_type=ResultCode.UNAUTHORIZED)
    closed = session.feed(no, 0.4)
    assert len(closed) == 1 and isinstance(closed[0], S.Closed)
    assert isinstance(closed[0].error, AccessRefused)
    assert session.state is S.SessionState.CLOSED


def test_a_connection_dropped_in_the_handshake_dials_again_after_the_backoff() -> None:
    # the hello went out on a connection that ended unanswered (a broker stopping as it
    # read it): the session does not wait for the handshake's deadline (the peer timeout)
    session, now = ready_session(backoff=(0.1, 0.1), peer_timeout=60.0)
    assert session.dropped(now) == []  # (a session up: the driver's watch is closed by then)
    bye = encode(message_type=MessageType.TERMINATE, content_type=ResultCode.BUSY)
    session.feed(bye, now)
    assert session.tick(now + 0.1) == [S.Dial()]
    session.hello(now + 0.1)
    events = session.dropped(now + 0.2)
    assert [type(e) for e in events] == [S.Lost] and session.state is S.SessionState.BACKOFF
    assert "ended before the broker answered" in session.closed_error().args[0]
    assert session.tick(now + 0.2 + 0.04) == []  # (the backoff: 0.05 to 0.1 s)
    assert session.tick(now + 0.2 + 0.1) == [S.Dial()]


def test_no_answer_to_the_first_connect_is_a_connect_error() -> None:
    session = S.Session("tcp://nowhere:1", ConnectionInfo())
    session.begin(0.0, 1.0)
    session.hello(0.0)
    assert session.tick(0.5) == []
    assert 0 < session.next_wake(0.5) <= 0.5
    events = session.tick(1.0)
    assert isinstance(events[-1], S.Closed) and isinstance(events[-1].error, ConnectError)
    assert "no answer from tcp://nowhere:1" in str(events[-1].error)


def test_reconnect_sends_the_secret_and_rejoins() -> None:
    session, now = ready_session(backoff=(0.01, 0.01))
    session.channels["orders"] = Joining(prefetch=5)
    session.subscriptions[("ChannelCreate", None, None)] = None
    waiter = start(session, queue_info_call(session), now)
    bye = encode(message_type=MessageType.TERMINATE, content_type=ResultCode.BUSY)
    assert [type(e) for e in apply(session.feed(bye, now))] == [S.Lost]
    assert isinstance(waiter.exception(0), ConnectionLost)
    assert isinstance(session.closed_error(), ConnectionLost)
    assert S.Dial() in session.tick(now + 1)
    _greeting, hello = session.hello(now + 1)
    frame = tmqp.decode((hello,))
    assert isinstance(frame, tmqp.Frame)
    info = ConnectionInfo.from_payload(frame.payload)
    assert info.client_id == "me" and info.properties[Header.SESSION_SECRET] == "s3"
    answer = encode(message_type=MessageType.RESPONSE, message_id=frame.message_id)
    events = session.feed(answer, now + 1)
    sent = [tmqp.decode((e.data,)) for e in events if isinstance(e, S.Send)]
    assert [(f.content_type, f.target) for f in sent if isinstance(f, tmqp.Frame)] == [
        (Operation.JOIN, "orders"),
        (1, "ChannelCreate"),
    ]
    assert events[-1] == S.Ready("me", False)


# -- a hostile or broken broker -------------------------------------------------------


@pytest.mark.parametrize(
    "junk",
    [
        b"",
        b"\x00",
        b"garbage that is no frame at all",
        GREETING,
        bytes(range(256)),
        encode(message_type=MessageType.ACK, message_id="x")[:5],  # a frame cut short
    ],
    ids=["empty", "one-octet", "text", "greeting", "bytes", "truncated"],
)
def test_garbage_is_dropped_and_the_session_stays_usable(junk: bytes) -> None:
    session, now = ready_session()
    waiter = start(session, queue_info_call(session), now)
    assert session.feed(junk, now) == ()
    assert not waiter.done() and session.state is S.SessionState.READY
    echo_still_works(session, now)


def test_a_frame_split_in_two_messages_is_two_pieces_of_garbage() -> None:
    session, now = ready_session()
    call = queue_info_call(session)
    waiter = start(session, call, now, timeout=1.0)
    whole = encode(
        message_type=MessageType.RESPONSE, message_id=call.frame.message_id, payload=b'{"Id": 1}'
    )
    for part in (whole[:7], whole[7:]):
        assert apply(session.feed(part, now)) == []
    assert not waiter.done()
    # the answer never came whole: the request times out with a ClientError
    assert session.next_wake(now) <= 0.25
    apply(session.tick(now + 1.0))
    err = waiter.exception(0)
    assert isinstance(err, RequestTimeout) and isinstance(err, ClientError)
    assert isinstance(err, TimeoutError)  # callers catching TimeoutError still do
    echo_still_works(session, now + 1.0)


def test_an_answer_to_an_unknown_request_changes_nothing() -> None:
    session, now = ready_session()
    call = queue_info_call(session)
    waiter = start(session, call, now)
    for stray in (
        encode(message_type=MessageType.RESPONSE, message_id="not-mine", payload=b"[1]"),
        encode(message_type=MessageType.ACK, message_id="nobody", content_type=7),
        encode(
            message_type=MessageType.ACK,
            message_id="nack-for-nobody",
            headers=((Header.NACK_REASON, "error"),),
        ),
    ):
        assert session.feed(stray, now) == ()
    assert not waiter.done() and list(session.pending) == [call.frame.message_id]
    answer = encode(
        message_type=MessageType.RESPONSE, message_id=call.frame.message_id, payload=b'{"Id": 1}'
    )
    apply(session.feed(answer, now))
    assert waiter.result(0) == {"Id": 1}


def test_a_broker_that_stops_replying_times_the_request_out() -> None:
    session, now = ready_session(ping_interval=100.0, peer_timeout=200.0)
    waiter = start(session, queue_info_call(session), now, timeout=3.0)
    assert apply(session.tick(now + 2.9)) == [] and not waiter.done()
    apply(session.tick(now + 3.0 + 0.25))  # requests are swept every 0.25 s
    err = waiter.exception(0)
    assert isinstance(err, RequestTimeout) and "within 3.0 s" in str(err)
    assert not session.pending and session.state is S.SessionState.READY
    # a late answer to it is dropped, and the next request still works
    late = encode(message_type=MessageType.RESPONSE, message_id="whatever", payload=b"{}")
    assert session.feed(late, now + 4) == ()
    echo_still_works(session, now + 4)


def test_silence_beyond_the_peer_timeout_loses_the_session() -> None:
    session, now = ready_session(ping_interval=1.0, peer_timeout=3.0, backoff=(1.0, 1.0))
    waiter = start(session, queue_info_call(session), now, timeout=60.0)
    assert apply(session.tick(now + 1.0)) == [S.Send(S.PING)]
    assert apply(session.tick(now + 2.0)) == []  # one probe per silence
    rest = apply(session.tick(now + 3.0))
    assert [type(e) for e in rest] == [S.Lost]
    assert isinstance(waiter.exception(0), ConnectionLost)


def pings_while_paused(session: S.Session, start: float, seconds: float) -> list[float]:
    """Drive a paused session (not reading: a full inbox) the way a driver does, waking
    when ``next_wake`` says; the times at which it sent a PING."""
    session.paused = True
    now, sent = start, []
    while now < start + seconds:
        now += max(session.next_wake(now), 0.001)
        events = apply(session.tick(now))
        assert not [e for e in events if isinstance(e, S.Lost)], "a paused session was lost"
        sent += [now for e in events if e == S.Send(S.PING)]
    return sent


def test_a_paused_session_pings_at_a_third_of_the_peer_timeout_the_broker_announced() -> None:
    # The broker ends a session silent for 3 s; the client's own ping interval is 5 s.
    # A consumer that stops reading used to PING every 5 s and was ended (what was in
    # flight to it on a queue without acknowledges was lost).
    announced = ((Header.PEER_TIMEOUT_MS, "3000"),)
    session, now = ready_session(announced, ping_interval=5.0, peer_timeout=15.0)
    assert session.keepalive == pytest.approx(1.0)
    sent = pings_while_paused(session, now, 10.0)
    gaps = [b - a for a, b in zip([now, *sent], sent, strict=False)]
    assert len(sent) >= 9 and max(gaps) <= 1.0 + 0.01, gaps
    # reading again, a quiet session probes at the same pace
    session.paused = False
    later = sent[-1] + 5.0
    session.heard(later)
    # no PING went for 5 s: one is due at once (hearing the broker proves nothing to it)
    assert session.next_wake(later) == 0.0
    assert apply(session.tick(later)) == [S.Send(S.PING)]
    assert session.next_wake(later) == pytest.approx(1.0)
    assert apply(session.tick(later + 1.0)) == [S.Send(S.PING)]


def drive(session: S.Session, start: float, seconds: float, step: float) -> list[Any]:
    """Tick ``session`` every ``step`` seconds (driver-style, with no other input);
    the events that came out, resolved as ``apply`` does."""
    now, out = start, []
    while now < start + seconds:
        now = round(now + step, 6)
        out += [(now, e) for e in apply(session.tick(now))]
    return out


def test_a_session_busy_receiving_still_pings_the_broker() -> None:
    # A consumer reading a long stream sent nothing to the broker: its PINGs went only
    # after a silence from the broker, which never came.  The broker's own PING to it
    # waited behind megaoctets of deliveries, so the broker ended the session as silent
    # (peer timeout 3 s) and what was in flight on a queue without acks was lost.
    announced = ((Header.PEER_TIMEOUT_MS, "3000"),)
    session, now = ready_session(announced, ping_interval=5.0, peer_timeout=15.0)
    delivery = encode(message_type=MessageType.QUEUE, target="q", payload=b"x")
    sent, t = [], now
    while t < now + 10.0:
        t = round(t + 0.05, 6)
        assert [type(e) for e in session.feed(delivery, t)] == [S.Deliver]
        assert session.next_wake(t) <= 1.0
        events = apply(session.tick(t))
        assert not [e for e in events if isinstance(e, S.Lost)]
        sent += [t for e in events if e == S.Send(S.PING)]
    gaps = [b - a for a, b in zip([now, *sent], sent, strict=False)]
    assert len(sent) >= 9 and max(gaps) <= 1.0 + 0.06, gaps


def test_a_broker_reading_what_the_client_sends_is_alive() -> None:
    # A producer hears nothing from the broker while it pushes; its PING waits behind
    # every push before it.  The socket taking frames again (the broker reads them) is
    # proof enough: the session was lost ("no traffic from the broker for 15 s").
    session, now = ready_session(ping_interval=1.0, peer_timeout=3.0)
    events: list[Any] = []
    t = now
    while t < now + 10.0:
        t = round(t + 0.5, 6)
        session.drained(t)
        events += apply(session.tick(t))
    assert not [e for e in events if isinstance(e, S.Lost)], events
    assert S.Send(S.PING) in events  # still proving itself alive
    # and once the socket stops taking frames too, the silence ends it
    assert S.Lost in [type(e) for _t, e in drive(session, t, 3.5, 0.25)]


@pytest.mark.parametrize(
    ("value", "keepalive"),
    [
        (None, 5.0),  # an older broker: the client's own interval
        ("30000", 5.0),  # a longer peer timeout changes nothing
        ("3000", 1.0),
        ("1", S.MIN_KEEPALIVE),  # a tiny one does not make the client PING in a loop
        ("0", 5.0),
        ("-3000", 5.0),
        ("3.5", 5.0),
        ("", 5.0),
        ("abc", 5.0),
        ("\u0663\u0660\u0660\u0660", 5.0),  # digits, but not ASCII ones
        ("9" * 40, 5.0),
    ],
)
def test_the_keepalive_follows_a_sane_announced_peer_timeout_only(
    value: str | None, keepalive: float
) -> None:
    announced = () if value is None else ((Header.PEER_TIMEOUT_MS, value),)
    session, now = ready_session(announced, ping_interval=5.0, peer_timeout=15.0)
    assert session.keepalive == pytest.approx(keepalive)
    sent = pings_while_paused(session, now, 12.0)
    assert len(sent) >= 2 and sent[1] - sent[0] == pytest.approx(keepalive, abs=0.01)


def test_a_reconnect_to_a_broker_without_the_header_goes_back_to_the_ping_interval() -> None:
    session, now = ready_session(((Header.PEER_TIMEOUT_MS, "600"),), ping_interval=5.0)
    assert session.keepalive == pytest.approx(0.2)
    apply(session.lost("test", now))
    now += 10.0
    assert apply(session.tick(now)) == [S.Dial()]
    _greeting, hello = session.hello(now)
    frame = tmqp.decode((hello,))
    assert isinstance(frame, tmqp.Frame)
    answer = encode(
        message_type=MessageType.RESPONSE,
        message_id=frame.message_id,
        headers=((Header.CLIENT_ID, "me"),),
    )
    assert S.Ready("me", False) in list(session.feed(answer, now))
    assert session.keepalive == 5.0


@pytest.mark.parametrize("reply", [S.Reply.JSON, S.Reply.PULL])
def test_an_ack_where_a_response_was_asked_is_a_protocol_error(reply: S.Reply) -> None:
    session, now = ready_session()
    if reply is S.Reply.JSON:
        call = queue_info_call(session)
    else:
        call = S.Call(pull_frame(session.new_id(), "c", 1, 5), S.Reply.PULL)
    waiter = start(session, call, now)
    apply(
        session.feed(encode(message_type=MessageType.ACK, message_id=call.frame.message_id), now)
    )
    err = waiter.exception(0)
    assert isinstance(err, ProtocolError) and "ACK answered" in str(err)
    echo_still_works(session, now)


@pytest.mark.parametrize(
    "payload", [b"{not json", b"\xff\xfe", b'{"a": 1'], ids=["syntax", "octets", "cut"]
)
def test_a_response_that_is_not_json_is_a_protocol_error(payload: bytes) -> None:
    session, now = ready_session()
    call = queue_info_call(session)
    waiter = start(session, call, now)
    answer = encode(message_type=MessageType.RESPONSE, message_id=call.frame.message_id,
                    payload=payload)  # fmt: skip
    apply(session.feed(answer, now))
    assert isinstance(waiter.exception(0), ProtocolError)
    echo_still_works(session, now)


def test_a_page_that_does_not_fit_the_first_is_a_protocol_error() -> None:
    session, now = ready_session()
    call = queue_info_call(session)
    waiter = start(session, call, now)
    first = encode(
        message_type=MessageType.RESPONSE,
        message_id=call.frame.message_id,
        headers=((Header.PAGE_NEXT, "c1"),),
        payload=b"[1, 2]",
    )
    events = session.feed(first, now)
    assert len(events) == 1 and isinstance(events[0], S.Send)
    page = tmqp.decode((events[0].data,))
    assert isinstance(page, tmqp.Frame)
    assert (Header.PAGE_AFTER, "c1") in page.headers
    wrong = encode(message_type=MessageType.RESPONSE, message_id=page.message_id,
                   payload=b'"a string, not a list"')  # fmt: skip
    apply(session.feed(wrong, now))
    assert isinstance(waiter.exception(0), ProtocolError)
    echo_still_works(session, now)


def test_pages_are_gathered_and_a_cursor_loop_is_refused() -> None:
    session, now = ready_session()
    call = queue_info_call(session)
    waiter = start(session, call, now)
    mid = call.frame.message_id
    for cursor, items in (("a", [1]), ("b", [2])):
        page = encode(
            message_type=MessageType.RESPONSE,
            message_id=mid,
            headers=((Header.PAGE_NEXT, cursor),),
            payload=json.dumps(items).encode(),
        )
        (send,) = session.feed(page, now)
        assert isinstance(send, S.Send)
        frame = tmqp.decode((send.data,))
        assert isinstance(frame, tmqp.Frame)
        mid = frame.message_id
    last = encode(message_type=MessageType.RESPONSE, message_id=mid, payload=b"[3]")
    apply(session.feed(last, now))
    assert waiter.result(0) == [1, 2, 3]

    waiter = start(session, call := queue_info_call(session), now)
    mid = call.frame.message_id
    for cursor in ("a", "b", "a"):
        page = encode(message_type=MessageType.RESPONSE, message_id=mid,
                      headers=((Header.PAGE_NEXT, cursor),), payload=b"[]")  # fmt: skip
        events = apply(session.feed(page, now))
        if waiter.done():
            break
        frame = tmqp.decode((events[0].data,))
        assert isinstance(frame, tmqp.Frame)
        mid = frame.message_id
    assert isinstance(waiter.exception(0), ClientError)
    assert "again" in str(waiter.exception(0)) and not session.pending


def test_pull_answers_are_gathered_and_a_refusal_is_a_remote_error() -> None:
    session, now = ready_session()
    call = S.Call(pull_frame(session.new_id(), "c", 1, 2), S.Reply.PULL)
    waiter = start(session, call, now)
    rid = call.frame.message_id
    for i in (1, 2):
        msg = encode(message_type=MessageType.QUEUE, message_id=f"m{i}", target="c",
                     content_type=1, payload=b"%d" % i,
                     headers=((Header.REQUEST_ID, rid), (Header.INDEX, str(i)),
                              (Header.COUNT, "2")))  # fmt: skip
        apply(session.feed(msg, now))
    assert [m.payload for m in waiter.result(0)] == [b"1", b"2"]
    # a late End marker of a finished pull is dropped, not delivered
    end = encode(
        message_type=MessageType.QUEUE,
        message_id="e",
        target="c",
        content_type=1,
        headers=((Header.REQUEST_ID, rid), (Header.NO_CONTENT, NoContent.END)),
    )
    assert session.feed(end, now) == ()
    call = S.Call(pull_frame(session.new_id(), "c", 1, 2), S.Reply.PULL)
    waiter = start(session, call, now)
    refused = encode(message_type=MessageType.QUEUE, message_id="e", target="c", content_type=1,
                     headers=((Header.REQUEST_ID, call.frame.message_id),
                              (Header.NO_CONTENT, NoContent.UNAUTHORIZED)))  # fmt: skip
    apply(session.feed(refused, now))
    err = waiter.exception(0)
    assert isinstance(err, RemoteError) and err.code == ResultCode.UNAUTHORIZED


def test_a_failure_status_is_a_remote_error_and_a_ping_gets_a_pong() -> None:
    session, now = ready_session()
    call = queue_info_call(session)
    waiter = start(session, call, now)
    failed = encode(message_type=MessageType.RESPONSE, message_id=call.frame.message_id,
                    content_type=ResultCode.NOT_FOUND)  # fmt: skip
    apply(session.feed(failed, now))
    err = waiter.exception(0)
    assert isinstance(err, RemoteError) and err.code == ResultCode.NOT_FOUND
    assert session.feed(tmqp.encode(tmqp.Ping())[0], now) == (S.Send(S.PONG),)
    assert session.feed(encode(message_type=MessageType.PING), now) == (S.Send(S.PONG),)


def test_the_session_after_close_fails_new_and_pending_requests() -> None:
    session, now = ready_session()
    waiter = start(session, queue_info_call(session), now)
    apply(session.close(ConnectionLost("gone")))
    assert isinstance(waiter.exception(0), ConnectionLost)
    assert isinstance(session.closed_error(), ConnectionLost)
    assert session.tick(now + 100) == []


def test_both_clients_keep_their_public_settings() -> None:
    """The drivers' settings read through to the one session (``timeout`` can be changed)."""
    import zmq
    import zmq.asyncio

    from broker.client import AsyncClient, Client

    sync_ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    async_ctx = zmq.asyncio.Context()
    try:
        made = [
            Client("tcp://127.0.0.1:9", context=sync_ctx, timeout=3, ping_interval=2),
            AsyncClient("tcp://127.0.0.1:9", context=async_ctx, timeout=3, ping_interval=2),
        ]
        for client, ctx in zip(made, (sync_ctx, async_ctx), strict=True):
            assert client.context is ctx and client.endpoint == "tcp://127.0.0.1:9"
            assert (client.timeout, client.ping_interval, client.peer_timeout) == (3, 2, 15.0)
            assert client.reconnect and not client.connected and client.client_id is None
            client.timeout = 7
            assert client._session.timeout == 7
    finally:
        sync_ctx.term()
        async_ctx.term()


def test_a_pull_answered_with_more_than_it_asked_is_a_protocol_error() -> None:
    session, now = ready_session()
    call = S.Call(pull_frame(session.new_id(), "c", 1, 2), S.Reply.PULL)
    waiter = start(session, call, now)
    for i in range(3):  # Index never reaches Count: a broker that would go on for ever
        msg = encode(
            message_type=MessageType.QUEUE,
            message_id=f"m{i}",
            target="c",
            content_type=1,
            headers=((Header.REQUEST_ID, call.frame.message_id), (Header.INDEX, "1")),
        )
        apply(session.feed(msg, now))
    err = waiter.exception(0)
    assert isinstance(err, ProtocolError) and "more messages" in str(err)
    assert not session.pending
    echo_still_works(session, now)


def test_endless_pages_are_cut_at_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(S, "MAX_PAGES", 5)
    session, now = ready_session()
    call = queue_info_call(session)
    waiter = start(session, call, now)
    mid = call.frame.message_id
    for n in range(10):
        page = encode(
            message_type=MessageType.RESPONSE,
            message_id=mid,
            headers=((Header.PAGE_NEXT, f"cursor-{n}"),),  # always a new one
            payload=b"[0]",
        )
        events = apply(session.feed(page, now))
        if waiter.done():
            break
        frame = tmqp.decode((events[0].data,))
        assert isinstance(frame, tmqp.Frame)
        mid = frame.message_id
    err = waiter.exception(0)
    assert isinstance(err, ProtocolError) and "over 5 pages" in str(err)
    assert n == 5 and not session.pending


def test_after_the_goodbye_deliveries_needing_an_answer_are_let_go_until_the_end() -> None:
    """CLOSING: a queue message without ack is still delivered (the broker counted it
    done); one waiting for an ack, or a direct request, is let go (no answer can follow:
    the broker takes a queue message back); a PING gets no PONG; the broker's TERMINATE
    is the end, not a lost session to reconnect."""
    session, now = ready_session()
    assert session.goodbye() == S.TERMINATE
    assert session.state is S.SessionState.CLOSING
    plain = encode(message_type=MessageType.QUEUE, message_id="q1", target="c", payload=b"1")
    acked = encode(message_type=MessageType.QUEUE, message_id="q2", target="c", pending_ack=True)
    request = encode(message_type=MessageType.DIRECT, message_id="d1", pending_response=True)
    (delivered,) = session.feed(plain, now)
    assert isinstance(delivered, S.Deliver) and delivered.message.payload == b"1"
    assert session.feed(acked, now) == ()
    assert session.feed(request, now) == ()
    assert session.feed(encode(message_type=MessageType.PING), now) == ()
    kept = S.Message(tmqp.decode((acked,)))  # type: ignore[arg-type]
    assert S.Session.unanswerable(kept, session.state)
    assert not S.Session.unanswerable(kept, S.SessionState.READY)
    bye = encode(message_type=MessageType.TERMINATE, headers=((Header.REASON, "goodbye"),))
    assert session.feed(bye, now) == (S.Ended(),)
    assert session.state is S.SessionState.CLOSING  # the driver closes (session.close)
