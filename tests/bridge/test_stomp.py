"""The STOMP bridge against zerohub's own STOMP door (``broker serve --stomp``): real
processes, both ways, acknowledged end to end."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest
import zmq

from broker.client.blocking import Client, Message
from tests.broker.test_cli import start_serve
from tests.polling import wait_until
from tests.ports import free_port

pytest.importorskip("stomp", reason="stomp.py not installed ([bridges])")

Ctx = zmq.Context[zmq.Socket[bytes]]
WAIT = 30.0


@pytest.fixture
def zctx() -> Iterator[Ctx]:
    ctx: Ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


@pytest.fixture
def brokers() -> Iterator[tuple[str, str, str]]:
    """(local TMQP endpoint, remote TMQP endpoint, remote STOMP URL)."""
    local = f"tcp://127.0.0.1:{free_port()}"
    remote = f"tcp://127.0.0.1:{free_port()}"
    stomp_port = free_port()
    procs = [
        start_serve("--bind", local),
        start_serve("--bind", remote, "--stomp", f"tcp://127.0.0.1:{stomp_port}"),
    ]
    yield local, remote, f"stomp://127.0.0.1:{stomp_port}"
    for p in procs:
        p.send_signal(signal.SIGTERM)
        p.wait(20)
        assert p.stderr is not None
        p.stderr.close()


def _consumers(client: Client, channel: str) -> int:
    try:
        return int(client.channel_info(channel)["ActiveClients"])
    except Exception:
        return 0


def test_stomp_bridge_both_ways_through_zerohubs_stomp_door(
    brokers: tuple[str, str, str], zctx: Ctx
) -> None:
    local_ep, remote_ep, url = brokers
    bridge = subprocess.Popen(
        [sys.executable, "-m", "broker", "bridge", "stomp", "--url", url, "--connect", local_ep,
         "--map", "out:orders/1=/queue/shipped", "--map", "in:back/2=/queue/returns"],
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        with (
            Client(local_ep, context=zctx, timeout=10) as local,
            Client(remote_ep, context=zctx, timeout=10) as remote,
        ):
            shipped: list[Message] = []

            def take(m: Message) -> None:
                shipped.append(m)
                remote.ack(m)

            remote.on_message(take)
            assert wait_until(lambda: _consumers(remote, "returns") >= 1, WAIT)  # subscribed
            remote.join("shipped")
            back: list[Message] = []
            local.create_queue("back", 2, {"Status": "Push"})
            local.on_message(back.append)
            local.join("back")
            assert wait_until(lambda: _consumers(local, "orders") >= 1, WAIT)
            for i in range(20):
                local.push("orders", 1, f"o{i}", ack=True)
            want = {f"o{i}".encode() for i in range(20)}
            assert wait_until(lambda: {bytes(m.payload) for m in shipped} >= want, WAIT)
            # acknowledged locally only once the remote's RECEIPT came
            assert wait_until(lambda: local.queue_info("orders", 1)["Acks"] == 20, WAIT)
            for i in range(20):
                remote.push("returns", 0, f"r{i}", ack=True)
            want = {f"r{i}".encode() for i in range(20)}
            assert wait_until(lambda: {bytes(m.payload) for m in back} >= want, WAIT), (
                remote.queue_info("returns", 0),
                [bytes(m.payload) for m in back],
            )
            # the bridge ACKed them on the STOMP side: nothing left unacknowledged there
            assert wait_until(lambda: remote.queue_info("returns", 0)["Acks"] == 20, WAIT), sorted(
                remote.queue_info("returns", 0).items()
            )
        bridge.send_signal(signal.SIGTERM)
        assert bridge.wait(20) == 0
        assert bridge.stderr is not None and b"Traceback" not in bridge.stderr.read()
    finally:
        if bridge.poll() is None:
            bridge.kill()
            bridge.wait(10)
        if bridge.stderr is not None:
            bridge.stderr.close()
