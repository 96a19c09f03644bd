"""A plain client connecting to a ``broker serve`` process that is stopped (SIGSTOP) in
the middle of the handshake: the connect waits for it (libzmq dials again) and succeeds
once the broker runs again; it never claims the broker requires CURVE.

Was (adv13, seen under load): the handshake timed out while the broker was stopped, the
monitor reported a failure without detail, and ``read_monitor`` read that as "the server
requires CURVE": ``connect()`` failed at once with a false ``AccessRefused``.  The
client's handshake timer is shortened through its context (libzmq's default is 30 s) so
that it expires while the broker is stopped; the test knows it did when the client dials
a second TCP connection (libzmq dials again after a failed handshake).  The real "server
requires CURVE" answer: ``test_server_curve.py``, ``tests/zerohub/test_zmqkit.py``.
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

Ctx = zmq.Context[zmq.Socket[bytes]]

#: The client's ZMTP handshake timer (ms): expires while the broker is stopped.
_HANDSHAKE_IVL_MS = 200


def dialled_ports(server_port: int) -> set[int]:
    """The local ports of this machine's TCP connections to ``server_port`` on loopback
    (``/proc/net/tcp``: the client's side of each connection it dialled)."""
    ports = set()
    with open("/proc/net/tcp") as table:
        next(table)  # (the header)
        for row in table:
            local, remote = row.split()[1:3]
            if remote == f"0100007F:{server_port:04X}":
                ports.add(int(local.split(":")[1], 16))
    return ports


def _blocking(endpoint: str, zctx: Ctx) -> str:
    """A blocking client's connect (sockets of ``zctx``)."""
    with Client(endpoint, context=zctx, timeout=WAIT * 6).connect() as c:
        return "connected" if c.connected else "not connected"


def _asyncio(endpoint: str, _zctx: Ctx) -> str:
    """An asyncio client's connect, on its own asyncio context (same handshake timer)."""
    actx = zmq.asyncio.Context()
    actx.setsockopt(zmq.HANDSHAKE_IVL, _HANDSHAKE_IVL_MS)

    async def main() -> str:
        async with AsyncClient(endpoint, context=actx, timeout=WAIT * 6) as c:
            return "connected" if c.connected else "not connected"

    try:
        return asyncio.run(main())
    finally:
        actx.term()


@pytest.mark.parametrize("connect", [_blocking, _asyncio], ids=["blocking", "asyncio"])
def test_a_plain_connect_outlives_a_broker_stopped_mid_handshake(
    served: Broker, zctx: Ctx, connect: Callable[[str, Ctx], str]
) -> None:
    assert served.proc is not None
    port = int(served.endpoint.rsplit(":", 1)[1])
    zctx.setsockopt(zmq.HANDSHAKE_IVL, _HANDSHAKE_IVL_MS)  # (sockets made from now on)
    outcome: list[BaseException | str] = []

    def connect_once() -> None:
        try:
            outcome.append(connect(served.endpoint, zctx))
        except BaseException as exc:  # (kept for the assertion)
            outcome.append(exc)

    served.proc.send_signal(signal.SIGSTOP)
    try:
        worker = threading.Thread(target=connect_once)
        worker.start()
        seen: set[int] = set()

        def redialled() -> bool:
            seen.update(dialled_ports(port))
            return len(seen) >= 2 or bool(outcome)

        # the kernel accepts for the stopped broker: the greeting goes unanswered until the
        # client's handshake timer fails that connection and libzmq dials again
        assert wait_until(redialled, WAIT * 3)
    finally:
        served.proc.send_signal(signal.SIGCONT)
    worker.join(WAIT * 7)
    assert not worker.is_alive()
    assert outcome == ["connected"], outcome


def test_a_broker_stopped_past_the_connect_timeout_is_no_answer_not_curve(
    served: Broker, zctx: Ctx
) -> None:
    """Stopped for good: the connect ends at its own timeout with the true reason (the
    handshake timer fails every dial meanwhile).  Was: "requires CURVE" at the first."""
    assert served.proc is not None
    zctx.setsockopt(zmq.HANDSHAKE_IVL, _HANDSHAKE_IVL_MS)
    served.proc.send_signal(signal.SIGSTOP)
    try:
        client = Client(served.endpoint, context=zctx, timeout=10 * _HANDSHAKE_IVL_MS / 1000)
        with pytest.raises(ConnectError) as refused:
            client.connect()
    finally:
        served.proc.send_signal(signal.SIGCONT)
    assert type(refused.value) is ConnectError  # (not AccessRefused)
    assert str(refused.value) == f"no answer from {served.endpoint} within the timeout"
