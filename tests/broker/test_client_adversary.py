"""Both clients against a hostile or broken broker (a hand-driven ROUTER socket).

The broker answers with garbage, frames split over two ZeroMQ messages, answers to
requests never made, answers of the wrong kind, or nothing at all.  Every time the
client raises a ``ClientError`` (or gets the right answer when one finally comes), within
a bounded time, and the next request on the same client works.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import zmq
import zmq.asyncio

from broker import tmqp
from broker.client.aio import AsyncClient
from broker.client.blocking import Client
from broker.client.errors import ClientError, ProtocolError, RequestTimeout
from broker.protocol import MessageType
from tests.broker.test_client_session import FakeBroker

Ctx = zmq.Context[zmq.Socket[bytes]]
#: What the fake broker does with one request: the messages it sends back (a list of
#: octet strings is one multi-part ZeroMQ message).
Answer = Callable[[tmqp.Frame], list[bytes | list[bytes]]]


def response(payload: bytes, **kw: Any) -> Answer:
    def answer(request: tmqp.Frame) -> list[bytes | list[bytes]]:
        kw.setdefault("message_type", MessageType.RESPONSE)
        frame = tmqp.Frame(message_id=request.message_id, payload=payload, **kw)
        return [tmqp.encode(frame)[0]]

    return answer


LIST = response(b'[{"Name": "orders"}]')


class Script:
    """A fake broker on a thread: accepts one session, then answers requests in turn."""

    def __init__(self, fake: FakeBroker, answers: list[Answer]) -> None:
        self.fake = fake
        self.answers = answers
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="fake-broker")
        self.thread.start()

    def _run(self) -> None:
        try:
            rid, _info = self.fake.accept()
            for answer in self.answers:
                while True:
                    _rid, data = self.fake.recv(timeout=10)
                    request = tmqp.decode((data,))
                    if isinstance(request, tmqp.Frame) and request.message_id:
                        break  # (PINGs and PONGs are not requests)
                for reply in answer(request):
                    if isinstance(reply, list):
                        self.fake.sock.send_multipart([rid, *reply])
                    else:
                        self.fake.send(rid, reply)
        except BaseException as exc:  # reported by join()
            self.failure = exc

    def join(self) -> None:
        self.thread.join(15)
        assert not self.thread.is_alive(), "the fake broker did not finish its script"
        if self.failure is not None:
            raise self.failure


Scenario = Callable[[Any, Callable[[Any], Awaitable[Any]]], Awaitable[None]]


@pytest.fixture(params=["threaded", "poll-on-call", "asyncio"])
def drive(request: pytest.FixtureRequest, zctx: Ctx) -> Iterator[Callable[..., None]]:
    """Run a scenario against a fresh fake broker with one of the three client kinds.

    The scenario gets the client and ``invoke``: ``await invoke(client.call(...))`` is the
    call's value for both clients (the blocking client has done it by then).
    """
    kind = request.param

    def run(answers: list[Answer], scenario: Scenario, timeout: float = 5.0) -> None:
        fake = FakeBroker(zctx)
        script = Script(fake, answers)
        try:
            if kind == "asyncio":
                asyncio.run(_async(fake.endpoint, scenario, timeout))
            else:
                threaded = kind == "threaded"
                client = Client(fake.endpoint, context=zctx, timeout=timeout, threaded=threaded)
                with client:
                    asyncio.run(scenario(client, _same))
            script.join()
        finally:
            fake.sock.close(linger=0)

    yield run


async def _same(value: Any) -> Any:
    return value


async def _async(endpoint: str, scenario: Scenario, timeout: float) -> None:
    ctx = zmq.asyncio.Context()
    try:
        async with AsyncClient(endpoint, context=ctx, timeout=timeout) as client:

            async def invoke(awaitable: Awaitable[Any]) -> Any:
                return await asyncio.wait_for(awaitable, timeout + 5)  # never a hang

            await scenario(client, invoke)
    finally:
        ctx.destroy(linger=0)


def test_garbage_split_frames_and_strays_before_the_answer(drive: Callable[..., None]) -> None:
    def noise_then_answer(request: tmqp.Frame) -> list[bytes | list[bytes]]:
        real = tmqp.encode(
            tmqp.Frame(
                message_type=MessageType.RESPONSE,
                message_id=request.message_id,
                payload=b'[{"Name": "orders"}]',
            )
        )[0]
        stray = tmqp.Frame(message_type=MessageType.RESPONSE, message_id="never-asked")
        return [
            b"\x00\xff garbage",
            b"",
            [real[:9], real[9:]],  # the answer split over two parts: two pieces of garbage
            tmqp.encode(stray)[0],
            real[:-3],  # cut short
            real,
        ]

    async def scenario(client: Any, invoke: Callable[[Any], Awaitable[Any]]) -> None:
        assert await invoke(client.channels()) == [{"Name": "orders"}]
        assert await invoke(client.channels()) == [{"Name": "orders"}]

    drive([noise_then_answer, LIST], scenario)


def test_an_answer_that_is_not_json_is_a_client_error(drive: Callable[..., None]) -> None:
    async def scenario(client: Any, invoke: Callable[[Any], Awaitable[Any]]) -> None:
        with pytest.raises(ProtocolError, match="not JSON"):
            await invoke(client.channels())
        assert await invoke(client.channels()) == [{"Name": "orders"}]

    drive([response(b"{not json"), LIST], scenario)


def test_an_ack_for_a_list_request_is_a_client_error(drive: Callable[..., None]) -> None:
    async def scenario(client: Any, invoke: Callable[[Any], Awaitable[Any]]) -> None:
        with pytest.raises(ProtocolError, match="ACK answered"):
            await invoke(client.queues("orders"))
        assert await invoke(client.channels()) == [{"Name": "orders"}]

    drive([response(b"", message_type=MessageType.ACK), LIST], scenario)


def test_a_broker_that_stops_replying_times_the_request_out(drive: Callable[..., None]) -> None:
    def silence(request: tmqp.Frame) -> list[bytes | list[bytes]]:
        return []

    async def scenario(client: Any, invoke: Callable[[Any], Awaitable[Any]]) -> None:
        with pytest.raises(RequestTimeout) as info:
            await invoke(client.channels())
        assert isinstance(info.value, ClientError) and "no answer" in str(info.value)
        assert await invoke(client.channels()) == [{"Name": "orders"}]

    drive([silence, LIST], scenario, timeout=1.0)


@pytest.mark.parametrize("threaded", [False, True], ids=["poll-on-call", "threaded"])
def test_a_request_times_out_while_deliveries_keep_arriving(zctx: Ctx, threaded: bool) -> None:
    """The broker never answers but never falls silent either: every loop step has
    something to read (the steps that skip the timers), and still the session's timers
    run and the request fails with ``RequestTimeout``, not the driver's backstop."""
    fake = FakeBroker(zctx)
    stop = threading.Event()
    sent: list[int] = []

    def chatter() -> None:
        rid, _info = fake.accept()
        n = 0
        while not stop.is_set():
            frame = tmqp.Frame(
                message_type=MessageType.QUEUE,
                message_id=f"d{n}",
                target="orders",
                content_type=1,
                payload=b"x",
            )
            fake.send(rid, tmqp.encode(frame)[0])
            n += 1
            stop.wait(0.002)  # pacing: a delivery every few milliseconds, not a sync
        sent.append(n)

    thread = threading.Thread(target=chatter, name="chatty-broker")
    thread.start()
    try:
        with Client(fake.endpoint, context=zctx, timeout=0.5, threaded=threaded) as client:
            with pytest.raises(RequestTimeout) as info:
                client.channels()
            assert "no answer" in str(info.value)
            first = client.receive(timeout=10)
            assert first is not None and first.frame.message_id == "d0"
    finally:
        stop.set()
        thread.join(10)
        fake.sock.close(linger=0)
    assert sent and sent[0] > 1
