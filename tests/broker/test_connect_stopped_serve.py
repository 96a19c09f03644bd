"""A plain client connecting to a ``broker serve`` process that is stopped (SIGSTOP), or
killed, in the middle of the handshake: the blocking and the asyncio client.

A stopped broker's kernel still accepts the connection, so the client's greeting goes
unanswered until the client's handshake timer ends that connection and libzmq dials
again.  Stopped for good: the connect ends at its own timeout with "no answer ... within
the timeout"; resumed: the connect succeeds; killed mid-handshake (the kernel resets the
connection: a hang-up) and started again on its port: the connect succeeds.

Was (adv13, session 13): the timer's failure without detail, and the reset of a killed
broker, read as "the server requires CURVE": ``connect()`` failed at once with a false
``AccessRefused``.  The handshake timer is shortened through the client's context
(libzmq's default is 30 s) where the test needs it to expire; the test knows a dial
ended when the client dials another TCP connection.  The real "requires CURVE":
``test_server_curve.py``; the rules: ``tests/zerohub/test_handshake_watch.py``.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable

import pytest
import zmq
import zmq.asyncio

from broker.client.aio import AsyncClient
from broker.client.blocking import Client, ConnectError
from tests.broker.test_durable_serve import Broker
from tests.polling import WAIT, wait_until
from tests.zerohub.support import dialled_ports, stop_process

Ctx = zmq.Context[zmq.Socket[bytes]]
#: (endpoint, handshake timer in ms or None for libzmq's, connect timeout) -> the outcome
Connect = Callable[[str, int | None, float], str]

#: The client's ZMTP handshake timer (ms) where it must expire while the broker is stopped.
_HANDSHAKE_IVL_MS = 200
#: A connect timeout no loaded machine reaches when the broker answers (a broker's
#: restart alone took 25-35 s at load 40-60).
_LONG = WAIT * 12


def _blocking(endpoint: str, handshake_ms: int | None, timeout: float) -> str:
    """A blocking client's connect on a context of its own."""
    ctx: Ctx = zmq.Context()
    if handshake_ms is not None:
        ctx.setsockopt(zmq.HANDSHAKE_IVL, handshake_ms)
    try:
        with Client(endpoint, context=ctx, timeout=timeout).connect() as c:
            return "connected" if c.connected else "not connected"
    finally:
        ctx.term()


def _asyncio(endpoint: str, handshake_ms: int | None, timeout: float) -> str:
    """An asyncio client's connect on an asyncio context of its own."""
    actx = zmq.asyncio.Context()
    if handshake_ms is not None:
        actx.setsockopt(zmq.HANDSHAKE_IVL, handshake_ms)

    async def main() -> str:
        async with AsyncClient(endpoint, context=actx, timeout=timeout) as c:
            return "connected" if c.connected else "not connected"

    try:
        return asyncio.run(main())
    finally:
        actx.term()


CLIENTS = pytest.mark.parametrize("connect", [_blocking, _asyncio], ids=["blocking", "asyncio"])


class Attempt:
    """``connect`` run in a thread; its outcome (a string or the exception raised)."""

    def __init__(
        self, connect: Connect, endpoint: str, handshake_ms: int | None, timeout: float
    ) -> None:
        self.outcome: list[BaseException | str] = []

        def run() -> None:
            try:
                self.outcome.append(connect(endpoint, handshake_ms, timeout))
            except BaseException as exc:  # (kept for the assertion)
                self.outcome.append(exc)

        self.thread = threading.Thread(target=run)
        self.thread.start()

    def result(self, timeout: float) -> BaseException | str:
        self.thread.join(timeout)
        assert not self.thread.is_alive()
        return self.outcome[0]


def _port(broker: Broker) -> int:
    return int(broker.endpoint.rsplit(":", 1)[1])


@CLIENTS
def test_a_broker_stopped_past_the_connect_timeout_is_no_answer_not_curve(
    served: Broker, connect: Connect
) -> None:
    assert served.proc is not None
    before = dialled_ports(_port(served))
    stop_process(served.proc)
    try:
        with pytest.raises(ConnectError) as refused:
            connect(served.endpoint, _HANDSHAKE_IVL_MS, 10 * _HANDSHAKE_IVL_MS / 1000)
    finally:
        served.proc.send_signal(signal.SIGCONT)
    assert type(refused.value) is ConnectError  # (not AccessRefused)
    assert str(refused.value) == f"no answer from {served.endpoint} within the timeout"
    # the timer ended at least one handshake (libzmq dialled again)
    assert len(dialled_ports(_port(served)) - before) >= 2


@CLIENTS
def test_a_plain_connect_outlives_a_broker_stopped_mid_handshake(
    served: Broker, connect: Connect
) -> None:
    assert served.proc is not None
    port = _port(served)
    before = dialled_ports(port)
    stop_process(served.proc)
    try:
        attempt = Attempt(connect, served.endpoint, _HANDSHAKE_IVL_MS, _LONG)
        seen: set[int] = set()

        def redialled() -> bool:
            seen.update(dialled_ports(port) - before)
            return len(seen) >= 2 or bool(attempt.outcome)

        assert wait_until(redialled, WAIT * 3)
    finally:
        served.proc.send_signal(signal.SIGCONT)
    assert attempt.result(_LONG + WAIT) == "connected"


@CLIENTS
def test_a_broker_killed_mid_handshake_then_restarted_is_connected_to(
    served: Broker, connect: Connect
) -> None:
    """The kill resets the connection the stopped broker's kernel accepted: the client
    sees its handshake hung up on once, then refused dials until the broker is back."""
    assert served.proc is not None
    port = _port(served)
    before = dialled_ports(port)
    stop_process(served.proc)
    attempt = Attempt(connect, served.endpoint, None, _LONG)  # (libzmq's 30 s timer)
    assert wait_until(lambda: bool(dialled_ports(port) - before) or bool(attempt.outcome))
    served.kill()  # (SIGKILL ends a stopped process too)
    served.start()  # (seconds: the reset reached the client long before)
    assert attempt.result(_LONG + WAIT) == "connected"
