"""The wire side of the blocking client: its DEALER socket, poller and wake-up socket.

``IOLoop`` only does I/O: it feeds what arrives to the session core
(``broker.client.session``), calls its timers, and does what the core's events say
(send, deliver to the inbox or the ``on_message`` callback, settle futures, reconnect).
It runs on the client's background thread, or (poll-on-call clients) on the caller's
thread inside blocking calls; either way only it touches the socket.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import zmq

from broker import batch, tmqp
from broker.client import session as S
from broker.client.core import WAKE_STOP, ClientCore
from broker.client.errors import ClientClosed, ClientError, StopLoop
from broker.client.fanout import RAW_WAIT_MS, FanoutReader
from broker.client.message import Message, messages_of
from broker.client.sockets import open_dealer, read_watch
from broker.protocol import MessageType
from zerohub import zmqkit
from zerohub.wakeup import Wakeup
from zproto.errors import DecodeError

log = logging.getLogger("broker.client.blocking")

_BIG = 65536
_BATCH = 1024
#: (plain ints: the flag enums' operators cost microseconds per poll)
_POLLIN = int(zmq.POLLIN)
_POLLOUT = int(zmq.POLLOUT)
_EVENTS = zmq.EVENTS
#: Seconds a poll-on-call client may read fan-out batches between two loop steps, and
#: seconds the session's timers may wait between two steps that look at them.
_SERVE_EVERY = 0.02
_READY = S.SessionState.READY
_SETTLED = S.Settled
_SETTLED_ALL = S.SettledAll
#: Poll-on-call, between two looks at the timers: how long one recv() may wait (ms).
_RECV_WAIT_MS = 20
_RAW_WAIT = RAW_WAIT_MS / 1000

_new = object.__new__
#: Sets a new Message's frame without the frozen dataclass's __init__ (half the cost).
_set_message_frame: Callable[[Message, tmqp.Frame], None] = vars(Message)["frame"].__set__
_decode = tmqp.decode
_decode_entries = tmqp.decode_entries
_Frame = tmqp.Frame
_QUEUE_BITS = int(MessageType.QUEUE)  # low 6 bits of the first octet
_SERVER_BITS = int(MessageType.SERVER)
_DELIVERIES = batch.DELIVERIES  # content type of several deliveries (octets 5-6)
_PING = S.PING
_PONG = S.PONG
_HEADER_BIT = 32  # in the second octet: a header block follows


def _unbound_send(*args: Any) -> None:
    raise zmq.ZMQError(zmq.ENOTSOCK, "no session socket")


class IOLoop:
    """The blocking client's I/O loop (see the module docstring)."""

    def __init__(self, core: ClientCore, wake: Wakeup | None) -> None:
        self.c = core
        self.s = core.session
        self.wake = wake
        self.sock: zmq.Socket[bytes] | None = None
        #: ``self.sock``'s send (see ``zerohub.zmqkit.fast_send``); only used while sock is set.
        self.send: Callable[..., Any] = _unbound_send
        self.monitor: zmqkit.HandshakeWatch | None = None
        self.poller = zmq.Poller()
        self.flags: dict[Any, int] = {}
        self.want_out = False
        #: Poll-on-call: raw fan-out batches may be read without a step until then.
        self.serve_by = 0.0
        #: The broadcast fan-out SUB and its streams (``broker.client.fanout``).
        self.fan = core.fanout = FanoutReader(
            core.context, core.curve, core.hwm, core.session.endpoint, core.raw_fanout
        )
        #: The wake-up's descriptor (threaded clients), polled with the sockets.
        self.wake_fd = -1
        if wake is not None:
            self.wake_fd = wake.fileno()
            self._register(self.wake_fd, zmq.POLLIN)

    # -- main loop ---------------------------------------------------------------------

    def run(self) -> None:
        """The background thread's loop (threaded clients)."""
        try:
            self.begin()
            while True:
                self.step()
        except StopLoop:
            pass

    def begin(self) -> None:
        self._dial()

    def step(self, cap_ms: int | None = None) -> None:
        """One poll of the sockets (at most ``cap_ms``), then the due timers (looked at
        once per ``_SERVE_EVERY`` while the session is up, a poll-on-call recv() of up to
        ``_RECV_WAIT_MS`` on top: they run at most that much late).

        Raises ``StopLoop`` when the session ends for good (``close``, refusal, no reconnect).
        """
        c = self.c
        s = self.s
        sock = self.sock
        if sock is not None:
            # a full inbox stops reading, unless a reply is awaited
            flags = _POLLIN if not s.paused or s.pending else 0
            if self.want_out:
                flags |= _POLLOUT
            self._register(sock, flags)
        fan = self.fan
        if fan.sock is not None:
            self._register(fan.sock, 0 if s.paused else _POLLIN)
        now = time.monotonic()
        # Timers are looked at (``next_wake``, ``tick``) at most every ``_SERVE_EVERY``
        # while the session is up: a step soon after the last full one only polls, reads
        # and sends (a request/reply round trip pays for its timers once per interval).
        lean = now < self.serve_by and s.state is _READY
        if lean:
            timeout = int((self.serve_by - now) * 1000) + 1
        else:
            timeout = int(s.next_wake(now) * 1000) + 1
        if cap_ms is not None and cap_ms < timeout:
            timeout = cap_ms
        if fan.streams:
            waits = fan.pending_deadline()
            if waits is not None:
                timeout = max(0, min(timeout, int((waits - time.monotonic()) * 1000) + 1))
        if (
            lean
            and sock is not None
            and flags == _POLLIN
            and (cap_ms is None or cap_ms >= _RECV_WAIT_MS)
            and self.wake is None
            and fan.sock is None
            and not c.outbox
        ):
            # Poll-on-call, the DEALER alone: wait in recv() itself (its RCVTIMEO,
            # ``_RECV_WAIT_MS``), as a raw DEALER does.  zmq_poll costs two poll() passes,
            # each asking the socket's EVENTS (itself a poll() of its mailbox).
            try:
                first = sock.recv()
            except zmq.Again:
                return  # (lean: the timers wait for the next step)
            self._drain(sock, first)
            if c.outbox:
                self.flush()
            return
        events = dict(self.poller.poll(timeout))
        if self.wake_fd in events:
            self._drain_wake()
        if sock is not None and sock is self.sock:
            ev = events.get(sock, 0)
            if ev & _POLLIN:
                self._drain(sock)
            if ev & _POLLOUT:
                self.want_out = False
                # the pipe was full and takes frames again: the broker reads them
                s.drained(time.monotonic())
        if fan.sock is not None and fan.sock in events:
            self._read_fan()
        if fan.streams:
            fan.expire(time.monotonic())
        if self.monitor is not None and self.monitor.socket in events:
            self._watched(self.monitor)
        if c.outbox:
            self.flush()
        if lean:
            return
        now = time.monotonic()
        self._apply(s.tick(now))
        self.serve_by = now + _SERVE_EVERY

    def read_fan_between(self, deadline: float | None) -> bool:
        """Poll-on-call raw fan-out reading (``Client.receive_payloads``): take a batch
        from the SUB without a whole step (no poll, no timers), waiting for it at most
        ``fanout.RAW_WAIT_MS``, while the last step is at most ``_SERVE_EVERY`` old and
        ``deadline`` (None: none) is further away than that wait; True when a batch came."""
        fan = self.fan
        if fan.sock is None or self.s.paused:
            return False
        now = time.monotonic()
        if now >= self.serve_by or (deadline is not None and deadline - now < _RAW_WAIT):
            return False
        c = self.c
        if fan.read_raw(wait=True) and c.inbox.waiting:
            c.inbox.wake_all()
        if fan.held >= c.inbox.limit:
            self.s.paused = True
        return bool(fan.batches)

    def _register(self, sock: Any, flags: int) -> None:
        if self.flags.get(sock) != flags:
            self.flags[sock] = flags
            self.poller.register(sock, flags)  # flags 0 takes it out of the poller

    def _unregister(self, sock: Any) -> None:
        if sock in self.flags and self.flags.pop(sock):  # 0: already out of the poller
            self.poller.unregister(sock)

    def _drain_wake(self) -> None:
        c = self.c
        assert self.wake is not None
        if WAKE_STOP in self.wake.take():
            self.goodbye()
            raise StopLoop
        with c.cv:
            c.woken = False
        if self.s.paused and c.inbox.drained and self.fan.held <= c.inbox.limit // 2:
            self.s.paused = False

    def _drain(self, sock: zmq.Socket[bytes], first: bytes | None = None) -> None:
        """Read what ``sock`` holds (after ``first``, read already), a batch at most."""
        c = self.c
        s = self.s
        recv = sock.recv
        feed = s.feed
        apply = self._apply
        now = time.monotonic()
        # Queue deliveries without headers (not pull answers, not markers) are what the
        # session would hand back as Deliver: with no callback they go straight to the inbox.
        inbox = c.inbox
        append = inbox.items.append if c.on_message is None else None
        extend = inbox.items.extend
        try:
            for i in range(_BATCH):
                if i == 1 and not int(sock.get(_EVENTS)) & _POLLIN:
                    break  # a lone message: half what a recv() raising Again costs
                if first is not None:
                    data, first = first, None
                else:
                    try:
                        data = recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                if (
                    append is not None
                    and len(data) > 8
                    and data[0] & 63 == _SERVER_BITS
                    and data[5] | data[6] << 8 == _DELIVERIES
                    and (delivered := self._inbox_batch(data)) is not None
                ):
                    extend(delivered)
                    if inbox.full:
                        break  # a batch of deliveries holds many: stop at the inbox's limit
                    continue
                if (
                    append is not None
                    and len(data) > 8
                    and data[0] & 63 == _QUEUE_BITS
                    and not data[1] & _HEADER_BIT
                ):
                    try:
                        frame = _decode((data,))
                    except DecodeError:
                        frame = None
                    if type(frame) is _Frame:
                        message = _new(Message)
                        _set_message_frame(message, frame)
                        append(message)
                        continue
                if data == _PONG:  # our PING's answer: what we sent before it was read
                    c.confirmations.answered()
                events = feed(data, now)
                if events:
                    apply(events)
                    if self.sock is not sock:
                        return  # the session was reset while dispatching
        finally:
            # once per batch (the waiters registered before looking at the inbox)
            if inbox.items and inbox.waiting:
                inbox.wake_all()
        s.heard(now)
        if c.on_message is None and inbox.full:
            s.paused = True

    @staticmethod
    def _inbox_batch(data: bytes) -> list[Message] | None:
        """Several deliveries in one message (``broker.batch``), for the inbox at once,
        when each is a plain delivery (no headers); None: the session core reads it.
        The entries are decoded where they lie in the batch's payload
        (``tmqp.decode_entries``: no copy of each, no ``decode`` call)."""
        try:
            frame = _decode((data,))
            if type(frame) is not _Frame:
                return None
            # (Any: each is checked to be a Frame below; ``typing.cast`` is a call per batch)
            frames: list[Any] = _decode_entries(frame.payload, batch.DEFAULT_MAX_FRAMES)
        except DecodeError:
            return None
        for one in frames:
            if type(one) is not _Frame or one.message_type != _QUEUE_BITS or one.headers:
                return None
        return messages_of(frames)

    def flush(self) -> None:
        """Send the outbox until it is empty or the socket's pipe is full."""
        c = self.c
        sock = self.sock
        if sock is None or self.s.state is not S.SessionState.READY or self.want_out:
            return
        out = c.outbox
        send = self.send
        s = self.s
        while out:
            item = out[0]
            data = item[0] if isinstance(item, tuple) else item  # (``S.octets`` inline)
            taken = 1
            if s.batch_max and len(out) > 1 and s.batchable(data):
                # the frames at the head that may share a batch, as one batch frame
                data, taken = s.coalesce(out)
            try:
                send(data, zmq.NOBLOCK, len(data) < _BIG)
            except zmq.Again:
                if taken > 1:  # the batch is made: it goes first, once there is room
                    for _ in range(taken):
                        out.popleft()
                    out.appendleft(data)
                self.want_out = True
                break
            for _ in range(taken):
                out.popleft()
        if c.out_waiting and len(out) < c.max_outbox:
            with c.cv:
                c.cv.notify_all()

    def send_or_queue(self, data: bytes) -> bool:
        """Poll-on-call: send ``data`` now unless frames wait before it (True: sent);
        else queue it (False)."""
        c = self.c
        if not c.outbox and not self.want_out and self.s.state is _READY and self.sock is not None:
            try:
                self.send(data, zmq.NOBLOCK, len(data) < _BIG)
                return True
            except zmq.Again:
                self.want_out = True
        c.outbox.append(data)
        self.flush()
        return False

    # -- the core's events -------------------------------------------------------------

    def _apply(self, events: Iterable[S.Event]) -> None:
        c = self.c
        for ev in events:
            # (the most frequent: a batch's acknowledged pushes; an acknowledged push alone)
            if type(ev) is _SETTLED_ALL or type(ev) is _SETTLED:
                S.resolve(ev)
            elif isinstance(ev, S.Send):
                if ev.data is _PING:
                    with c.cv:  # (threaded: callers count and queue under it)
                        c.confirmations.probe(len(c.outbox))
                self._send_now(ev.data)
            elif isinstance(ev, S.Deliver):
                self._deliver(ev.message)
            elif isinstance(ev, S.Settled | S.Failed):
                S.resolve(ev)
            elif isinstance(ev, S.Notify):
                S.notify(ev)
            elif isinstance(ev, S.Ready):
                self._close_monitor()
                log.debug("session ready as %s", ev.client_id)
                if c.outbox:
                    self.flush()
                if ev.first:
                    c.connected.set_result(ev.client_id)
            elif isinstance(ev, S.Fanout):
                self.fan.grant(ev, time.monotonic())
            elif isinstance(ev, S.Unfanout):
                self.fan.leave(ev.channel)
            elif isinstance(ev, S.Lost):
                self._close_fan()
                self._close_socket()  # (what its queue held is dropped)
                with c.cv:
                    why = f"the session was lost ({ev.reason})"
                    c.confirmations.doubt(why, kept=len(c.outbox))
            elif isinstance(ev, S.Dial):
                self._dial()
            elif isinstance(ev, S.Closed):
                with c.cv:
                    c.confirmations.doubt(f"the session ended ({ev.error})", kept=0)
                c.error = ev.error
                if not c.connected.done():
                    c.connected.set_exception(ev.error)
                self._close_fan()
                self._close_socket()
                raise StopLoop

    def _deliver(self, message: Message) -> None:
        callback = self.c.on_message
        if callback is None:
            self.c.inbox.put(message)
            return
        try:
            callback(message)
        except Exception:
            log.exception("on_message callback failed")

    def _send_now(self, data: bytes) -> None:
        if self.sock is not None:
            try:
                self.sock.send(data, zmq.NOBLOCK)
            except zmq.Again:
                self.c.outbox.appendleft(data)

    # -- the socket --------------------------------------------------------------------

    def _dial(self) -> None:
        c = self.c
        s = self.s
        try:
            sock, monitor = open_dealer(
                c.context, s.endpoint, hwm=c.hwm, curve=c.curve, watch=True
            )
        except ClientError as exc:
            self._apply(s.fatal(exc))
            return
        self.sock = sock
        if self.wake is None:  # poll-on-call: a lean step may wait in recv() (see step)
            sock.rcvtimeo = _RECV_WAIT_MS
        self.send = zmqkit.fast_send(sock)
        self.monitor = monitor
        if monitor is not None:
            self._register(monitor.socket, zmq.POLLIN)
        for data in s.hello(time.monotonic()):
            try:
                sock.send(data, zmq.NOBLOCK)
            except zmq.Again:
                # the connection already ended: a handshake refused at once (a plain
                # client at a CURVE server) makes libzmq drop the pipe for good.  The
                # monitor says why, else the session's connect timeout ends or redials.
                break
        self.want_out = False

    def _watched(self, monitor: zmqkit.HandshakeWatch) -> None:
        """What the dial's watch reported: a refused handshake ends the client; a
        connection that ended before the broker answered loses the hello
        (``Session.dropped``: dial again)."""
        s = self.s
        seen = read_watch(monitor, endpoint=s.endpoint, judge=s.first or self.c.curve is not None)
        if seen.refusal is not None:
            self._apply(s.fatal(seen.refusal))
        elif seen.dropped:
            self._apply(s.dropped(time.monotonic()))

    def _close_monitor(self) -> None:
        if self.monitor is not None:
            self._unregister(self.monitor.socket)
            self.monitor.close(self.sock)
            self.monitor = None

    def _read_fan(self) -> None:
        """A batch of the fan-out SUB (``broker.client.fanout``), to the inbox as the
        DEALER's fast path puts deliveries there, or to the ``on_message`` callback."""
        c = self.c
        inbox = c.inbox
        fan = self.fan
        if fan.raw:  # raw reading: batches of payloads for Client.receive_payloads
            if fan.read_raw() and inbox.waiting:
                inbox.wake_all()
            if fan.held >= inbox.limit:
                self.s.paused = True
            return
        frames = fan.read()
        if c.on_message is None:
            if frames:
                inbox.items.extend(messages_of(frames))
                if inbox.waiting:
                    inbox.wake_all()
            if inbox.full:
                self.s.paused = True
        else:
            for frame in frames:
                self._deliver(Message(frame))

    def _close_fan(self) -> None:
        if self.fan.sock is not None:
            self._unregister(self.fan.sock)
        self.fan.close()

    def _close_socket(self) -> None:
        self._close_monitor()
        if self.sock is not None:
            self._unregister(self.sock)
            self.sock.close(linger=0)
            self.sock = None
        self.want_out = False

    def goodbye(self) -> None:
        """Closing: send what is queued and TERMINATE, then read what the broker sent
        until its TERMINATE ends the session (``broker.client.session``: deliveries that
        need no ack still reach the inbox or callback, the others go back to the broker),
        all within the linger time."""
        c = self.c
        sock = self.sock
        if sock is None or self.s.state is not S.SessionState.READY:
            c.confirmations.doubt(f"the session was down at close ({self.s.state.value})")
            return
        deadline = time.monotonic() + c.linger
        out = c.outbox
        out.append(self.s.goodbye())
        while out and time.monotonic() < deadline:
            try:
                sock.send(S.octets(out[0]), zmq.NOBLOCK)
                out.popleft()
            except zmq.Again:
                sock.poll(50, zmq.POLLOUT)
        why = f"the broker did not answer the goodbye within the linger ({c.linger} s)"
        if not out:
            ended = self._read_to_the_end(sock, deadline)
            if ended is not None and not ended.reason:
                c.confirmations.all_read()
            elif ended is not None:
                why = f"the broker ended the session first: {ended.reason}"
        c.confirmations.doubt(why)  # (nothing when all read)
        sock.linger = max(0, int((deadline - time.monotonic()) * 1000))
        self._unregister(sock)
        sock.close()
        self.sock = None

    def _read_to_the_end(self, sock: zmq.Socket[bytes], deadline: float) -> S.Ended | None:
        """After the goodbye: feed what arrives until the session's end (its ``Ended``)
        or the deadline (None)."""
        feed = self.s.feed
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if not sock.poll(max(1, int(left * 1000)), zmq.POLLIN):
                continue
            now = time.monotonic()
            for _ in range(_BATCH):
                try:
                    data = sock.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                for event in feed(data, now):
                    if isinstance(event, S.Ended):
                        return event
                    if isinstance(event, S.Deliver):
                        self._deliver(event.message)
                    elif isinstance(event, S.Settled | S.SettledAll | S.Failed):
                        S.resolve(event)
                    elif isinstance(event, S.Notify):
                        S.notify(event)

    def finish(self) -> None:
        """The loop is over: close the sockets, fail what still waits, wake the waiters."""
        c = self.c
        self._close_fan()
        self._close_socket()
        err = c.error or ClientClosed("client is closed")
        for ev in self.s.close(err):
            S.resolve(ev)
        if not c.connected.done():
            c.connected.set_exception(err)
        with c.cv:
            c.cv.notify_all()
        c.inbox.wake_all()
