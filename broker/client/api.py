"""The calls both clients offer, written once over two driver hooks.

:class:`ClientApi` builds every request (a ``session.Call``: frame + how its answer is
read) or fire-and-forget frame, and hands it to its driver:

* ``_perform(call, timeout, result)`` sends the request and gives its answer (``result``
  instead when one is given): the blocking ``Client`` waits and returns the value, the
  ``AsyncClient`` returns a coroutine;
* ``_emit(data, result)`` sends octets that wait for no answer and gives ``result``.

So ``R`` is the value itself for the blocking client (``ClientApi[Any]``) and an
awaitable of it for the asyncio one (``ClientApi[Awaitable[Any]]``).  Server operations
(channels, queues, clients, nodes, statistics) answer with JSON, gathered over pages by
the session core; a failure is a ``RemoteError`` with the broker's status code.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar

from broker import tmqp
from broker.client.admin import STATS_LIST, operation_frame
from broker.client.frames import (
    Headers,
    Joining,
    ack_frame,
    as_bytes,
    direct_frame,
    event_frame,
    join_frame,
    normalize_headers,
    pattern_join_frame,
    pattern_leave_frame,
    pull_frame,
    queue_frame,
    response_frame,
)
from broker.client.message import Message
from broker.client.session import Call, Reply, Session
from broker.protocol import Header, MessageType, Operation, ResultCode, RouterOperation
from broker.sequence import (
    DEFAULT_BROWSE_LIMIT,
    Browsed,
    SequenceBounds,
    decode_browse,
)

R = TypeVar("R")

#: ``_perform``'s ``result`` when the answer itself is the result.
ANSWER: Any = object()

_QUEUE = int(MessageType.QUEUE)  # a plain int: IntEnum arithmetic costs ~0.1 us a push


def _json_object(frame: tmqp.Frame) -> dict[str, Any]:
    try:
        value = json.loads(frame.payload)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value


def _whole(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} is not an integer")
    return value


def _bounds_of(frame: tmqp.Frame) -> SequenceBounds:
    obj = _json_object(frame)
    return SequenceBounds(_whole(obj.get("First"), "First"), _whole(obj.get("Last"), "Last"))


def _released_of(frame: tmqp.Frame) -> int:
    return _whole(_json_object(frame).get("Released"), "Released")


def _browsed_of(frame: tmqp.Frame) -> list[Browsed]:
    return decode_browse(frame.payload)


def _count_of(name: str) -> Callable[[tmqp.Frame], int]:
    return lambda frame: _whole(_json_object(frame).get(name), name)


def _chosen(sequences: Iterable[int] | None) -> tuple[tuple[str, str], ...]:
    if sequences is None:
        return ()
    return ((Header.SEQUENCES, ",".join(str(int(s)) for s in sequences)),)


def _joined(channel: str, joining: Joining) -> Callable[[Session], None]:
    def remember(session: Session) -> None:
        session.channels[channel] = joining

    return remember


def _pattern_joined(pattern: str, prefetch: int | None) -> Callable[[Session], None]:
    def remember(session: Session) -> None:
        session.patterns[pattern] = prefetch

    return remember


def _subscribed(
    key: tuple[str, str | None, int | None], callback: Callable[[Message], Any] | None
) -> Callable[[Session], None]:
    def remember(session: Session) -> None:
        session.subscriptions[key] = None
        if callback is not None:
            session.handlers.append((*key, callback))

    return remember


class ClientApi(Generic[R]):
    """The protocol calls of a client (see the module docstring)."""

    _session: Session
    #: Ask for broadcast fan-out when joining (``broker.client.fanout``): only the
    #: clients whose I/O loop reads a fan-out SUB socket.
    _fanout = False

    def _perform(self, call: Call, timeout: float | None = None, result: Any = ANSWER) -> R:
        raise NotImplementedError

    def _emit(self, data: bytes, result: Any = None) -> R:
        raise NotImplementedError

    def new_id(self) -> str:
        """A fresh message id: ``<random prefix>-<counter>``."""
        return self._session.new_id()

    @property
    def client_id(self) -> str | None:
        """The id the broker knows this client by (learnt when connecting)."""
        return self._session.client_id

    @property
    def session_secret(self) -> str | None:
        """The broker's secret for this client's session (sent back when reconnecting)."""
        return self._session.session_secret

    @property
    def endpoint(self) -> str:
        return self._session.endpoint

    @property
    def timeout(self) -> float:
        """Seconds a request waits for its answer (and the first connect for acceptance)."""
        return self._session.timeout

    @timeout.setter
    def timeout(self, value: float) -> None:
        self._session.timeout = value

    @property
    def ping_interval(self) -> float:
        return self._session.ping_interval

    @property
    def peer_timeout(self) -> float:
        return self._session.peer_timeout

    @property
    def reconnect(self) -> bool:
        return self._session.reconnect

    @property
    def backoff(self) -> tuple[float, float]:
        return self._session.backoff

    def _op(
        self,
        operation: int,
        target: str = "",
        *,
        payload: Any = None,
        queue_id: int | None = None,
        path: tuple[str, ...] | None = None,
    ) -> R:
        """A server operation: ACK expected, or (``path`` given) a JSON RESPONSE."""
        response = path is not None
        frame = operation_frame(
            self.new_id(), operation, target, payload=payload, queue_id=queue_id, response=response
        )
        return self._perform(Call(frame, Reply.JSON if response else Reply.NONE, path or ()))

    # -- queues ------------------------------------------------------------------------

    def push(
        self,
        channel: str,
        queue_id: int,
        payload: bytes | str,
        *,
        ack: bool = False,
        high_priority: bool = False,
        headers: Headers | None = None,
        message_id: str | None = None,
        timeout: float | None = None,
    ) -> R:
        """Push into a queue; with ``ack`` wait for the broker's acknowledge (``RemoteError``
        on a negative one).  Gives the message id."""
        session = self._session
        mid = message_id or f"{session.prefix}{next(session.counter)}"  # (``new_id`` inline)
        if ack:
            call = self._push_call(channel, queue_id, payload, mid, headers, high_priority)
            return self._perform(call, timeout, mid)
        body = payload if type(payload) is bytes else as_bytes(payload)
        if not headers and (high_priority is False or high_priority is True):
            encode = (session.senders or session.push_encoders())[high_priority]
            return self._emit(encode(queue_id, mid, channel, body)[0], mid)
        data = tmqp.encode_frame(
            high_priority=high_priority,
            message_type=_QUEUE,
            content_type=queue_id,
            message_id=mid,
            source=session.client_id or "",
            target=channel,
            headers=normalize_headers(headers) if headers else (),
            payload=body,
        )[0]
        return self._emit(data, mid)

    def _push_call(
        self,
        channel: str,
        queue_id: int,
        payload: bytes | str,
        message_id: str,
        headers: Headers | None,
        high_priority: bool,
        reply: Reply = Reply.NONE,
    ) -> Call:
        """An acknowledged push."""
        source = self._session.client_id or ""
        body = as_bytes(payload)
        frame = queue_frame(message_id, channel, queue_id, body, source=source, ack=True,
                            headers=headers, high_priority=high_priority)  # fmt: skip
        return Call(frame, reply)

    def join(
        self,
        channel: str,
        timeout: float | None = None,
        *,
        prefetch: int | None = None,
        selector: str | None = None,
        credit: tuple[int, int] | None = None,
    ) -> R:
        """Join a channel: its push/broadcast/round-robin queues deliver to this client.

        ``prefetch``: the most deliveries of each of the channel's queues in flight to this
        client at once (unacknowledged, or not yet read off its socket); None takes the
        queue's ``Prefetch`` option or the broker's default.  ``selector``: an SQL-92
        expression over message headers (``"priority > 5 AND region = 'eu'"``): only the
        messages it selects are offered to this client (a queue passes it over for the
        others; a broadcast queue does not send it those copies).  ``credit``: ``(count,
        size)`` windows: at most ``count`` unacknowledged deliveries and ``size`` payload
        octets (a delivery goes while either is above zero), given back by acknowledges.
        Selector and credit need queues with ``MessageDeliveryHandler: per-message``
        (``broker.engine.join_rules``); a bad selector or credit is refused by the broker
        (the package's error, with its reason) and nothing is joined.  All kept across
        reconnects.
        """
        frame = join_frame(
            self.new_id(),
            channel,
            prefetch,
            fanout=self._fanout,
            selector=selector,
            credit=credit,
        )
        joining = Joining(prefetch, selector, credit)
        call = Call(frame, Reply.NONE, on_success=_joined(channel, joining))
        return self._perform(call, timeout)

    def leave(self, channel: str, timeout: float | None = None) -> R:
        self._session.channels.pop(channel, None)
        frame = operation_frame(self.new_id(), Operation.LEAVE, channel)
        return self._perform(Call(frame, Reply.NONE), timeout)

    def join_pattern(
        self, pattern: str, timeout: float | None = None, *, prefetch: int | None = None
    ) -> R:
        """Join every channel ``pattern`` matches that this client may join, now and as
        they are created: ``.`` separates segments, ``*`` is any one segment, ``**`` any
        number of them, ``{regex}`` a segment matching a regular expression (JOIN with
        ``Pattern: yes``; ``broker.engine.patterns``).  A bad pattern fails with 400,
        one more than the broker's ``max_pattern_joins`` with 482.  ``prefetch`` as for
        :meth:`join`.  Kept across reconnects."""
        frame = pattern_join_frame(self.new_id(), pattern, prefetch)
        call = Call(frame, Reply.NONE, on_success=_pattern_joined(pattern, prefetch))
        return self._perform(call, timeout)

    def leave_pattern(self, pattern: str, timeout: float | None = None) -> R:
        """Drop a pattern join: the channels it joined are left (those another pattern
        join of this client matches stay joined)."""
        self._session.patterns.pop(pattern, None)
        frame = pattern_leave_frame(self.new_id(), pattern)
        return self._perform(Call(frame, Reply.NONE), timeout)

    def ack(self, message: Message) -> R:
        """Positive acknowledge of a received queue or direct message."""
        return self._emit(tmqp.encode(ack_frame(message))[0])

    def nack(self, message: Message, reason: str = "none", *, put_back: bool = True) -> R:
        """Negative acknowledge (``Nack-Reason`` header); ``put_back=False`` (a queue
        delivery): not put back, to the queue's trash with ``reason`` (``Put-Back: no``)."""
        headers: tuple[tuple[str, str], ...] = ((Header.NACK_REASON, reason),)
        if not put_back:
            headers += ((Header.PUT_BACK, "no"),)
        return self._emit(tmqp.encode(ack_frame(message, headers))[0])

    def pull(
        self,
        channel: str,
        queue_id: int,
        count: int = 1,
        *,
        clear: str | None = None,
        order: str | None = None,
        info: bool = False,
        timeout: float | None = None,
    ) -> R:
        """Pull up to ``count`` messages from a pull (or cache) queue (a list of Message)."""
        return self._perform(
            self._pull_call(channel, queue_id, count, clear, order, info), timeout
        )

    def _pull_call(
        self,
        channel: str,
        queue_id: int,
        count: int,
        clear: str | None,
        order: str | None,
        info: bool,
    ) -> Call:
        frame = pull_frame(self.new_id(), channel, queue_id, count, clear=clear, order=order,
                           info=info)  # fmt: skip
        return Call(frame, Reply.PULL)

    # -- reading by sequence (broker.sequence) ---------------------------------------

    def _sequence_op(
        self,
        operation: int,
        channel: str,
        queue: int,
        headers: tuple[tuple[str, str], ...],
        decode: Callable[[tmqp.Frame], Any],
        timeout: float | None,
    ) -> R:
        frame = operation_frame(self.new_id(), operation, channel, queue_id=queue, response=True)
        frame = frame.replace(headers=(*frame.headers, *headers))
        return self._perform(Call(frame, Reply.DECODED, decode=decode), timeout)

    def queue_bounds(self, channel: str, queue: int, *, timeout: float | None = None) -> R:
        """The queue's oldest held sequence number and the newest given
        (a :class:`~broker.sequence.SequenceBounds`; ``first == last + 1``: it holds none)."""
        return self._sequence_op(Operation.QUEUE_BOUNDS, channel, queue, (), _bounds_of, timeout)

    def browse(
        self,
        channel: str,
        queue: int,
        from_seq: int,
        limit: int = DEFAULT_BROWSE_LIMIT,
        *,
        timeout: float | None = None,
    ) -> R:
        """Up to ``limit`` messages the queue holds numbered ``from_seq`` or more, in order,
        without consuming them (a list of :class:`~broker.sequence.Browsed`).  ``from_seq``
        0: from the oldest held; -1: only newer than the newest (none now).  The broker may
        return fewer (its reply size limit); ask again from the last one's sequence + 1."""
        headers = ((Header.FROM_SEQ, str(from_seq)), (Header.LIMIT, str(limit)))
        return self._sequence_op(
            Operation.QUEUE_BROWSE, channel, queue, headers, _browsed_of, timeout
        )

    def release(
        self, channel: str, queue: int, through_seq: int, *, timeout: float | None = None
    ) -> R:
        """Remove the queue's messages numbered ``through_seq`` or less as consumed
        (deliveries in flight stay with their consumers); gives how many.  The queue must
        have the option ``AllowRelease`` (else ``RemoteError`` 406)."""
        headers = ((Header.THROUGH_SEQ, str(through_seq)),)
        return self._sequence_op(
            Operation.QUEUE_RELEASE, channel, queue, headers, _released_of, timeout
        )

    # -- a queue's trash (broker.engine.queue.trash) -----------------------------------

    def trash_list(
        self,
        channel: str,
        queue: int,
        from_seq: int = 0,
        limit: int = DEFAULT_BROWSE_LIMIT,
        *,
        timeout: float | None = None,
    ) -> R:
        """What the queue's trash holds (expired, past the put-back limit, nacked and not
        put back), by sequence number: a list of :class:`~broker.sequence.Browsed`, each
        message with a ``Trash-Reason`` header."""
        headers = ((Header.FROM_SEQ, str(from_seq)), (Header.LIMIT, str(limit)))
        return self._sequence_op(
            Operation.TRASH_LIST, channel, queue, headers, _browsed_of, timeout
        )

    def trash_resubmit(
        self,
        channel: str,
        queue: int,
        sequences: Iterable[int] | None = None,
        *,
        timeout: float | None = None,
    ) -> R:
        """Push trashed messages (those numbered, or all) back into their queue as new
        messages; gives how many went back."""
        count = _count_of("Resubmitted")
        op = Operation.TRASH_RESUBMIT
        return self._sequence_op(op, channel, queue, _chosen(sequences), count, timeout)

    def trash_purge(
        self,
        channel: str,
        queue: int,
        sequences: Iterable[int] | None = None,
        *,
        timeout: float | None = None,
    ) -> R:
        """Empty the queue's trash (or remove the messages numbered); gives how many."""
        count = _count_of("Purged")
        op = Operation.TRASH_PURGE
        return self._sequence_op(op, channel, queue, _chosen(sequences), count, timeout)

    # -- direct messages ---------------------------------------------------------------

    def send(
        self,
        target: str,
        payload: bytes | str = b"",
        *,
        content_type: int = 0,
        headers: Headers | None = None,
        high_priority: bool = False,
    ) -> R:
        """Fire-and-forget direct message to a client id, ``@name:NAME`` or ``@type:TYPE``."""
        mid = self.new_id()
        frame = direct_frame(
            mid,
            target,
            payload,
            content_type=content_type,
            headers=headers,
            high_priority=high_priority,
        )
        return self._emit(tmqp.encode(frame)[0], mid)

    def request(
        self,
        target: str,
        payload: bytes | str = b"",
        *,
        content_type: int = 0,
        headers: Headers | None = None,
        timeout: float | None = None,
    ) -> R:
        """Send a direct message and wait for the peer's response (a Message; ``RemoteError``
        if it fails or nobody matches ``target``)."""
        call = self._direct_call(target, payload, content_type, headers, Reply.MESSAGE)
        return self._perform(call, timeout)

    def _direct_call(
        self,
        target: str,
        payload: bytes | str,
        content_type: int,
        headers: Headers | None,
        reply: Reply,
        ack: bool = False,
    ) -> Call:
        """A direct message waiting for a response (or, with ``ack``, an acknowledge)."""
        frame = direct_frame(self.new_id(), target, payload, content_type=content_type,
                             headers=headers, response=not ack, ack=ack)  # fmt: skip
        return Call(frame, reply)

    def respond(
        self,
        message: Message,
        payload: bytes | str = b"",
        *,
        code: int = ResultCode.OK,
        headers: Headers | None = None,
    ) -> R:
        """Answer a direct message that waits for a response."""
        frame = response_frame(message, payload, code=code, headers=headers)
        return self._emit(tmqp.encode(frame)[0])

    # -- events ------------------------------------------------------------------------

    def subscribe(
        self,
        event: str,
        callback: Callable[[Message], Any] | None = None,
        *,
        channel: str | None = None,
        queue_id: int | None = None,
        timeout: float | None = None,
    ) -> R:
        """Subscribe to a server event; notifications go to ``callback`` or the inbox."""
        key = (event, channel, queue_id)
        frame = event_frame(self.new_id(), event, True, channel, queue_id)
        call = Call(frame, Reply.NONE, on_success=_subscribed(key, callback))
        return self._perform(call, timeout)

    def unsubscribe(
        self,
        event: str,
        *,
        channel: str | None = None,
        queue_id: int | None = None,
        timeout: float | None = None,
    ) -> R:
        session = self._session
        key = (event, channel, queue_id)
        session.subscriptions.pop(key, None)
        session.handlers = [h for h in session.handlers if (h[0], h[1], h[2]) != key]
        frame = event_frame(self.new_id(), event, False, channel, queue_id)
        return self._perform(Call(frame, Reply.NONE), timeout)

    # -- server operations -------------------------------------------------------------

    def create_channel(self, name: str, options: Mapping[str, Any] | None = None) -> R:
        return self._op(Operation.CHANNEL_CREATE, name, payload=options)

    def update_channel(self, name: str, options: Mapping[str, Any]) -> R:
        return self._op(Operation.CHANNEL_UPDATE, name, payload=options)

    def delete_channel(self, name: str) -> R:
        return self._op(Operation.CHANNEL_DELETE, name)

    def channels(self, pattern: str = "") -> R:
        return self._op(Operation.CHANNEL_LIST, pattern, path=())

    def channel_info(self, name: str) -> R:
        return self._op(Operation.CHANNEL_INFO, name, path=())

    def create_queue(
        self, channel: str, queue_id: int, options: Mapping[str, Any] | None = None
    ) -> R:
        return self._op(Operation.QUEUE_CREATE, channel, payload=options, queue_id=queue_id)

    def update_queue(self, channel: str, queue_id: int, options: Mapping[str, Any]) -> R:
        return self._op(Operation.QUEUE_UPDATE, channel, payload=options, queue_id=queue_id)

    def delete_queue(self, channel: str, queue_id: int) -> R:
        return self._op(Operation.QUEUE_DELETE, channel, queue_id=queue_id)

    def queues(self, channel: str) -> R:
        return self._op(Operation.QUEUE_LIST, channel, path=())

    def queue_info(self, channel: str, queue_id: int) -> R:
        return self._op(Operation.QUEUE_INFO, channel, queue_id=queue_id, path=())

    def purge_queue(self, channel: str, queue_id: int) -> R:
        """Remove the queue's waiting messages; the answer is ``{"Removed": n}``."""
        return self._op(Operation.QUEUE_PURGE, channel, queue_id=queue_id, path=())

    # -- routers (broker.engine.router) ------------------------------------------------

    def create_router(self, name: str, options: Mapping[str, Any] | None = None) -> R:
        """Create router ``name`` (``{"Method": "Distribute"|"OnlyFirst"|"RoundRobin"}``)."""
        return self._op(RouterOperation.ROUTER_CREATE, name, payload=options)

    def remove_router(self, name: str) -> R:
        return self._op(RouterOperation.ROUTER_REMOVE, name)

    def routers(self, pattern: str = "") -> R:
        """Routers with their bindings (``Router.to_json``)."""
        return self._op(RouterOperation.ROUTER_LIST, pattern, path=())

    def add_binding(self, router: str, binding: Mapping[str, Any]) -> R:
        return self._op(RouterOperation.BINDING_ADD, router, payload=binding)

    def remove_binding(self, router: str, name: str) -> R:
        return self._op(RouterOperation.BINDING_REMOVE, router, payload={"Name": name})

    # -- durable subscriptions (broker.engine.dsubs) -------------------------------------

    def create_durable_subscription(self, sub_id: str, topics: Iterable[str]) -> R:
        """Create durable subscription ``sub_id`` collecting what is pushed to the topic
        channels ``topics`` (or set the topics of an existing one).  Consume it by joining
        channel ``/dsub/<sub_id>`` (acknowledge each message); browse it as that
        channel's queue 0."""
        return self._op(Operation.DSUB_CREATE, sub_id, payload={"Topics": list(topics)})

    def destroy_durable_subscription(self, sub_id: str) -> R:
        """Remove the durable subscription and every message it holds."""
        return self._op(Operation.DSUB_DESTROY, sub_id)

    def durable_subscriptions(self) -> R:
        """Every durable subscription: ``[{"Id", "Topics", "Messages", "Consumers"}]``."""
        return self._op(Operation.DSUB_LIST, path=())

    def clients(self, client_type: str = "") -> R:
        return self._op(Operation.CLIENT_LIST, client_type, path=())

    def nodes(self) -> R:
        return self._op(Operation.NODE_LIST, path=())

    def stats(self) -> R:
        """The server's transport counters and the engine's statistics."""
        return self._op(Operation.STATS, path=STATS_LIST)
