"""The broker side of FILEMQ file events: a broker client as ``filemq.broker_events``'
connection (the composition layer: ``filemq`` and ``broker`` do not import each other)."""

from __future__ import annotations

from typing import Any

import zmq

from broker.client.blocking import Client, RemoteError
from broker.protocol import ResultCode
from filemq.broker_events import BrokerEvents, Connector, EventTarget, Pusher

#: Seconds a connect or a push may take.
TIMEOUT = 5.0


def connector(target: EventTarget, context: zmq.Context[zmq.Socket[bytes]]) -> Connector:
    """Connects a broker client to ``target`` and makes its queue if missing."""

    def connect() -> Pusher:
        keys: dict[str, Any] = {}
        if target.server_key is not None:
            keys = {"server_key": target.server_key, "curve_secret": target.curve_secret}
        client = Client(target.endpoint, context=context, timeout=TIMEOUT, reconnect=False,
                        **keys)  # fmt: skip
        try:
            client.connect(timeout=TIMEOUT)
            try:
                client.create_queue(target.channel, target.queue_id)
            except RemoteError as exc:
                if exc.code != ResultCode.ALREADY_CREATED:
                    raise
        except BaseException:
            client.close(timeout=1.0)
            raise
        return client

    return connect


def publisher(
    target: EventTarget, origin: str, context: zmq.Context[zmq.Socket[bytes]]
) -> BrokerEvents:
    """A started event publisher pushing to ``target``."""
    return BrokerEvents(target, origin, connector(target, context)).start()
