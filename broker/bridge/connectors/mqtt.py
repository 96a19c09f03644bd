"""MQTT connector (paho-mqtt, MQTT 5, QoS 1) — ``pip install 'zerohub[bridges]'``.

* Publishes at QoS 1; the PUBACK (a success reason code) is the remote's acceptance, an
  error reason code a refusal (published again).
* Subscribes the inbound topic filters at QoS 1 with manual acknowledgements: the PUBACK
  for a remote message is sent only when the bridge says so (after the local broker
  accepted it).  ``Receive Maximum`` = the window bounds what the remote sends unacked.
* A persistent session (clean start off, ``Session Expiry Interval`` = ``session_expiry``)
  under a stable client id: messages for the bridge wait on the remote while it is away.
* A new paho client per connection: nothing paho buffered survives a drop; the bridge
  core publishes again what was not accepted.
"""

from __future__ import annotations

import time
from typing import Any

from broker.bridge.config import RemoteUrl, Route
from broker.bridge.connectors import Sink
from broker.bridge.errors import ConnectorError, MissingLibrary
from broker.bridge.events import RemoteAccepted, RemoteMessage, RemoteRefused

try:
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties
except ImportError:  # pragma: no cover - depends on the install
    mqtt = None  # type: ignore[assignment]

#: Seconds between MQTT PINGREQs (the remote drops us after 1.5 x this of silence).
DEFAULT_KEEPALIVE = 30
#: Seconds the remote keeps the bridge's session (subscriptions, queued messages) after a drop.
DEFAULT_SESSION_EXPIRY = 86_400


class MqttConnector:
    def __init__(
        self,
        url: RemoteUrl,
        routes: tuple[Route, ...],
        *,
        client_id: str,
        window: int,
        keepalive: int = DEFAULT_KEEPALIVE,
        session_expiry: int = DEFAULT_SESSION_EXPIRY,
    ) -> None:
        if mqtt is None:
            raise MissingLibrary("the MQTT bridge needs paho-mqtt: pip install 'zerohub[bridges]'")
        self.url = url
        self.inbound = routes
        self.client_id = client_id
        self.window = window
        self.keepalive = keepalive
        self.session_expiry = session_expiry
        self._client: Any = None
        self._sink: Sink | None = None
        self._generation = 0
        self._mids: dict[int, int] = {}
        self._lost: str | None = None
        self._connack: Any = None

    # -- the connection ----------------------------------------------------------------

    def open(self, sink: Sink, generation: int, timeout: float) -> None:
        self._sink, self._generation = sink, generation
        self._mids = {}
        self._lost = None
        self._connack = None
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=self.client_id,
            protocol=mqtt.MQTTv5,
            manual_ack=True,
            reconnect_on_failure=False,
        )
        client.max_inflight_messages_set(self.window)
        if self.url.username:
            client.username_pw_set(self.url.username, self.url.password)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_publish = self._on_publish
        client.on_message = self._on_message
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = self.session_expiry
        props.ReceiveMaximum = min(self.window, 65535)
        self._client = client
        try:
            client.connect(
                self.url.host,
                self.url.port,
                keepalive=self.keepalive,
                clean_start=False,
                properties=props,
            )
        except OSError as exc:
            self._drop()
            raise ConnectorError(f"{self.url.redacted()}: {exc.strerror or exc}")
        deadline = time.monotonic() + timeout
        while self._connack is None:
            self._loop(deadline)
        if self._connack.is_failure:
            self._drop()
            raise ConnectorError(f"{self.url.redacted()} refused the connection: {self._connack}")
        self._subscribe(deadline)

    def _subscribe(self, deadline: float) -> None:
        if not self.inbound:
            return
        topics = [(route.remote, mqtt.SubscribeOptions(qos=1)) for route in self.inbound]
        granted: list[Any] = []
        self._client.on_subscribe = lambda c, u, mid, codes, props: granted.extend(codes)
        rc, _ = self._client.subscribe(topics)
        if rc != mqtt.MQTT_ERR_SUCCESS:
            self._drop()
            raise ConnectorError(f"subscribe failed: {mqtt.error_string(rc)}")
        while not granted:
            self._loop(deadline)
        refused = [r.remote for r, code in zip(self.inbound, granted, strict=False) if code >= 128]
        if refused:
            self._drop()
            raise ConnectorError(f"the remote refused the subscription to {', '.join(refused)}")

    def _loop(self, deadline: float) -> None:
        if time.monotonic() >= deadline:
            self._drop()
            raise ConnectorError(f"{self.url.redacted()} did not answer in time")
        rc = self._client.loop(0.05)
        if rc != mqtt.MQTT_ERR_SUCCESS or self._lost is not None:
            reason = self._lost or mqtt.error_string(rc)
            self._drop()
            raise ConnectorError(f"{self.url.redacted()}: {reason}")

    def pump(self, timeout: float) -> None:
        rc = self._client.loop(timeout)
        if rc != mqtt.MQTT_ERR_SUCCESS or self._lost is not None:
            raise ConnectorError(self._lost or mqtt.error_string(rc))

    def close(self) -> None:
        self._drop(graceful=True)

    def _drop(self, graceful: bool = False) -> None:
        client, self._client = self._client, None
        if client is None:
            return
        if graceful and self._lost is None:
            client.disconnect()
            client.loop(0.05)
        # paho keeps the socket until the next loop notices; close it now
        sock = client.socket()
        if sock is not None:
            sock.close()

    # -- traffic -----------------------------------------------------------------------

    def publish(self, token: int, remote: str, payload: bytes, resent: bool = False) -> None:
        info = self._client.publish(remote, payload, qos=1)
        if info.rc not in (mqtt.MQTT_ERR_SUCCESS, mqtt.MQTT_ERR_NO_CONN):
            raise ConnectorError(f"publish to {remote!r} failed: {mqtt.error_string(info.rc)}")
        self._mids[info.mid] = token

    def ack(self, ref: Any) -> None:
        mid, qos = ref
        if self._client is not None:
            self._client.ack(mid, qos)

    # -- paho callbacks (on this thread, inside loop()) --------------------------------

    def _on_connect(self, client: Any, userdata: Any, flags: Any, code: Any, props: Any) -> None:
        self._connack = code

    def _on_disconnect(
        self, client: Any, userdata: Any, flags: Any, code: Any, props: Any
    ) -> None:
        self._lost = f"disconnected ({code})"

    def _on_publish(self, client: Any, userdata: Any, mid: int, code: Any, props: Any) -> None:
        token = self._mids.pop(mid, None)
        if token is None or self._sink is None:
            return
        if code is not None and code.is_failure:
            self._sink(RemoteRefused(token, self._generation, str(code)))
        else:
            self._sink(RemoteAccepted(token, self._generation))

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        route = self._route_of(message.topic)
        if self._sink is not None:
            headers = (("Bridge-Topic", message.topic),) if message.topic else ()
            ref = (message.mid, message.qos)
            self._sink(RemoteMessage(route, message.payload, ref, self._generation, headers))

    def _route_of(self, topic: str) -> Route | None:
        for route in self.inbound:
            if mqtt.topic_matches_sub(route.remote, topic):
                return route
        return None
