"""The MQTT bridge against a real mosquitto and a real zerohub Server (loopback, temp dirs).

Delivery is at-least-once: the tests count distinct payloads (duplicates are allowed
after a restart, losses never).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from broker.bridge.config import Direction, Route, Settings, parse_url
from broker.bridge.runner import Bridge
from broker.client.blocking import Client
from broker.server.server import Server
from tests.bridge.peers import Mosquitto
from tests.polling import wait_until

mqtt = pytest.importorskip("paho.mqtt.client", reason="paho-mqtt not installed ([bridges])")
from broker.bridge.connectors.mqtt import MqttConnector  # noqa: E402

Ctx = zmq.Context[zmq.Socket[bytes]]
WAIT = 30.0

OUT = Route(Direction.OUT, "orders", 1, "zh/orders")
IN = Route(Direction.IN, "sensors", 2, "zh/sensors/#")


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[Mosquitto]:
    peer = Mosquitto(tmp_path)
    peer.start()
    yield peer
    if peer.process.proc is not None:
        peer.resume()  # a test that paused it may have failed before resuming it
    peer.stop()


class RemoteClient:
    """A plain MQTT peer (its own paho thread): a persistent QoS 1 subscriber/publisher."""

    def __init__(self, port: int, client_id: str, subscribe: str | None = None) -> None:
        self.got: list[bytes] = []
        self.lock = threading.Lock()
        self.ready = threading.Event()
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=False
        )
        self.client.reconnect_delay_set(0.05, 0.5)

        def on_connect(c: Any, u: Any, flags: Any, code: Any, props: Any) -> None:
            if subscribe is not None:
                c.subscribe(subscribe, qos=1)  # ready once the SUBACK is in
            else:
                self.ready.set()

        def on_message(c: Any, u: Any, message: Any) -> None:
            with self.lock:
                self.got.append(message.payload)

        self.client.on_connect = on_connect
        self.client.on_message = on_message
        self.client.on_subscribe = lambda *a: self.ready.set()
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        assert self.ready.wait(WAIT)

    def distinct(self) -> set[bytes]:
        with self.lock:
            return set(self.got)

    def publish(self, topic: str, payload: bytes) -> None:
        self.client.publish(topic, payload, qos=1).wait_for_publish(WAIT)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def connected(bridge: Bridge) -> Bridge:
    """Wait until the bridge is connected (and subscribed): a message published before
    that has no subscriber on the remote and is dropped there."""
    assert wait_until(lambda: bridge.stats()["connected"] == 1, WAIT)
    return bridge


def make_bridge(
    zctx: Ctx, server: Server, mosquitto: Mosquitto, *routes: Route, **kw: Any
) -> Bridge:
    settings = Settings(routes=routes, backoff=(0.05, 0.5), **kw)
    connector = MqttConnector(
        parse_url(mosquitto.url, "mqtt"),
        settings.routes_of(Direction.IN),
        client_id="zh-bridge-test",
        window=settings.window,
    )
    assert server.endpoint is not None
    return Bridge(
        settings, connector, server.endpoint, context=zctx, client_options={"timeout": 5.0}
    )


def _ins(bridge: Bridge) -> str:
    return " ".join(f"{k}={v}" for k, v in bridge.stats().items() if k.startswith("in_") and v)


def consume(client: Client, count: int, timeout: float = WAIT) -> set[bytes]:
    got: set[bytes] = set()
    for message in client.consume(timeout=timeout):
        got.add(message.payload)
        client.ack(message)
        if len(got) >= count:
            break
    return got


def test_local_to_mqtt_round_trip(
    zctx: Ctx, server: Server, mosquitto: Mosquitto, local: Client
) -> None:
    remote = RemoteClient(mosquitto.port, "downstream", "zh/orders")
    try:
        with make_bridge(zctx, server, mosquitto, OUT) as bridge:
            sent = {f"order {i}".encode() for i in range(300)}
            for payload in sorted(sent):
                local.push("orders", 1, payload, ack=True)
            assert wait_until(lambda: remote.distinct() == sent, WAIT)
            assert wait_until(lambda: bridge.stats()["out_accepted"] == 300, WAIT)
            assert wait_until(lambda: local.queue_info("orders", 1)["Acks"] == 300, WAIT)
            assert local.queue_info("orders", 1)["RequestAcknowledge"] is True
    finally:
        remote.close()


def test_mqtt_to_local_round_trip(
    zctx: Ctx, server: Server, mosquitto: Mosquitto, local: Client
) -> None:
    local.create_queue("sensors", 2, {"Status": "Push"})
    local.join("sensors")
    with make_bridge(zctx, server, mosquitto, IN) as bridge:
        connected(bridge)
        remote = RemoteClient(mosquitto.port, "upstream")
        try:
            sent = {f"reading {i}".encode() for i in range(200)}
            for payload in sorted(sent):
                remote.publish(f"zh/sensors/{len(payload) % 3}", payload)
            assert consume(local, len(sent)) == sent
            assert wait_until(lambda: bridge.stats()["in_accepted"] >= 200, WAIT)
        finally:
            remote.close()


def test_window_bounds_what_is_in_flight_while_the_remote_stops_accepting(
    zctx: Ctx, server: Server, mosquitto: Mosquitto, local: Client
) -> None:
    remote = RemoteClient(mosquitto.port, "downstream", "zh/orders")
    try:
        with make_bridge(zctx, server, mosquitto, OUT, window=10) as bridge:
            local.push("orders", 1, b"warm-up", ack=True)
            assert wait_until(lambda: bridge.stats()["out_accepted"] == 1, WAIT)
            mosquitto.pause()  # SIGSTOP: no PUBACK any more
            # (a push with ack waits for the bridge's ack: the queue requests acks)
            for i in range(200):
                local.push("orders", 1, f"m{i}".encode())
            assert wait_until(lambda: local.queue_info("orders", 1)["Messages"] == 190, WAIT)
            assert wait_until(lambda: bridge.stats()["out_in_flight"] == 10, WAIT)
            info = local.queue_info("orders", 1)
            # nothing acknowledged while the remote accepts nothing; the rest waits locally
            assert bridge.stats()["out_accepted"] == 1 and info["Acks"] == 1
            assert info["InFlight"] == 10
            mosquitto.resume()
            expected = {b"warm-up"} | {f"m{i}".encode() for i in range(200)}
            assert wait_until(lambda: remote.distinct() == expected, WAIT)
            assert wait_until(lambda: local.queue_info("orders", 1)["Acks"] == 201, WAIT)
    finally:
        remote.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["term", "kill"])
def test_remote_restart_mid_stream_loses_nothing_outbound(
    zctx: Ctx, server: Server, mosquitto: Mosquitto, local: Client, sig: int
) -> None:
    remote = RemoteClient(mosquitto.port, "downstream", "zh/orders")
    try:
        with make_bridge(zctx, server, mosquitto, OUT, window=20) as bridge:
            sent = [f"o{i}".encode() for i in range(400)]
            for payload in sent[:200]:
                local.push("orders", 1, payload)
            assert wait_until(lambda: bridge.stats()["out_accepted"] >= 50, WAIT)
            # the downstream's session is on disk (else a kill -9 forgets its subscription)
            assert wait_until(mosquitto.saved, WAIT)
            mosquitto.stop(sig)  # mid-stream: some accepted, some in flight, some queued
            for payload in sent[200:]:
                local.push("orders", 1, payload)
            assert wait_until(lambda: bridge.stats()["connected"] == 0, WAIT)
            mosquitto.start()
            # After SIGTERM mosquitto saved everything it accepted: nothing may be missing.
            # After SIGKILL it loses what it accepted (PUBACK) since its last autosave (1 s):
            # its own durability, not the bridge's.  What was pushed after the kill went
            # through the bridge alone (held, then published to the new process): all of it.
            expected = set(sent) if sig == signal.SIGTERM else set(sent[200:])
            assert wait_until(lambda: expected <= remote.distinct(), WAIT), (
                f"missing {len(expected - remote.distinct())}: {bridge.stats()}"
            )
            assert wait_until(lambda: local.queue_info("orders", 1)["Acks"] == 400, WAIT)
            stats = bridge.stats()
            assert stats["connects"] == 2 and stats["disconnects"] == 1
            assert stats["out_in_flight"] == 0
    finally:
        remote.close()


def test_remote_messages_are_acked_only_after_the_local_broker_took_them(
    zctx: Ctx, server: Server, mosquitto: Mosquitto, local: Client
) -> None:
    local.create_queue("sensors", 2, {"Status": "Stopped"})  # refuses every push
    first = make_bridge(zctx, server, mosquitto, IN, window=5)
    first.start()
    connected(first)
    remote = RemoteClient(mosquitto.port, "upstream")
    try:
        sent = {f"r{i}".encode() for i in range(100)}
        for payload in sorted(sent):
            remote.publish("zh/sensors/a", payload)
        assert wait_until(lambda: first.stats()["in_refused"] >= 5, WAIT)
        stats = first.stats()
        assert stats["in_accepted"] == 0 and stats["in_in_flight"] == 5  # window 5 held
        first.stop()  # held messages were never acked to mosquitto: it keeps them
        mosquitto.stop()  # a graceful restart in between, too
        mosquitto.start()
        local.update_queue("sensors", 2, {"Status": "Push"})
        local.join("sensors")
        with make_bridge(zctx, server, mosquitto, IN, window=5) as second:
            got = consume(local, len(sent))
            assert got == sent, (sorted(sent - got), _ins(first), _ins(second))
    finally:
        remote.close()
        first.stop()


def test_oversized_remote_message_is_dead_lettered_and_the_bridge_goes_on(
    zctx: Ctx, server: Server, mosquitto: Mosquitto, local: Client
) -> None:
    local.create_queue("sensors", 2, {"Status": "Push"})
    local.create_queue("dead", 9, {"Status": "Pull"})
    local.join("sensors")
    bridge = make_bridge(
        zctx, server, mosquitto, IN, max_message_size=1000, dead_letter=("dead", 9)
    )
    with bridge:
        connected(bridge)
        remote = RemoteClient(mosquitto.port, "upstream")
        try:
            remote.publish("zh/sensors/x", b"x" * 5000)
            remote.publish("zh/sensors/x", b"after")
            assert consume(local, 1) == {b"after"}
            assert wait_until(lambda: bridge.stats()["dead_lettered"] == 1, WAIT), bridge.stats()
            local.join("dead")
            assert wait_until(lambda: local.queue_info("dead", 9)["Messages"] == 1, WAIT)
            [record] = local.pull("dead", 9)
            described = record.json()
            assert described["size"] == 5000 and "over the limit of 1000" in described["reason"]
            assert described["route"] == str(IN)
            assert wait_until(lambda: bridge.stats()["in_accepted"] == 1, WAIT)
            assert bridge.running and bridge.stats()["in_in_flight"] == 0
        finally:
            remote.close()


class GarbagePeer:
    """A TCP 'broker' that answers every connection with garbage and hangs up."""

    def __init__(self, reply: bytes) -> None:
        import socket

        self.reply = reply
        self.accepted = 0
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.listener.settimeout(0.1)
        self.port = self.listener.getsockname()[1]
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="garbage-peer")
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            with conn:
                self.accepted += 1
                conn.sendall(self.reply)

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(5)
        self.listener.close()


@pytest.mark.parametrize(
    "reply",
    [
        b"\xff" * 64,  # not a packet type
        b"\x20\x7f" + b"\x00" * 3,  # CONNACK claiming 127 octets, then the peer hangs up
        b"\x20\x03\x00\x00\xff",  # CONNACK with a bad properties length
        b"\x30\x05\x00\x09abc",  # PUBLISH before CONNACK, topic length past the end
    ],
    ids=["no-type", "short", "bad-props", "publish-first"],
)
def test_garbage_from_the_remote_is_a_failed_connection_and_the_bridge_retries(
    zctx: Ctx, server: Server, local: Client, reply: bytes
) -> None:
    peer = GarbagePeer(reply)
    try:
        settings = Settings(routes=(OUT, IN), backoff=(0.02, 0.1), connect_timeout=1.0)
        connector = MqttConnector(
            parse_url(f"mqtt://127.0.0.1:{peer.port}", "mqtt"),
            settings.routes_of(Direction.IN),
            client_id="garbage",
            window=settings.window,
        )
        assert server.endpoint is not None
        with Bridge(settings, connector, server.endpoint, context=zctx) as bridge:
            local.push("orders", 1, b"kept")
            assert wait_until(lambda: bridge.stats()["connect_failures"] >= 3, WAIT)
            assert bridge.running and bridge.failure is None
            assert bridge.stats()["connects"] == 0 and bridge.stats()["out_accepted"] == 0
            info = local.queue_info("orders", 1)
            assert info["Acks"] == 0  # the message waits: never acked without a remote
    finally:
        peer.close()
