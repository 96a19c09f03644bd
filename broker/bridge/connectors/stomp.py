"""STOMP 1.2 connector (stomp.py) — ``pip install 'zerohub[bridges]'``.

* Publishes with a ``receipt`` header; the RECEIPT is the remote's acceptance, an ERROR
  naming the receipt a refusal (published again).  Messages go ``persistent:true``; a copy
  sent again carries ``zerohub-resent:true``.  (RabbitMQ sends the RECEIPT of a SEND once
  its publisher confirm came: a persistent message to a durable queue is on disk.)
* A remote MESSAGE flagged ``redelivered:true`` (RabbitMQ) is pushed locally with
  ``Bridge-Redelivered: true``: the only inbound copies that can be duplicates.
* Subscribes the inbound destinations with ``ack:client-individual``: a remote message is
  ACKed (its ``ack`` header) only when the bridge says so (after the local broker took
  it); an ACK for a message of an older connection is not sent (the remote redelivers).
  The remote's ``credit``/``activemq.prefetchSize`` is asked to be the window.
* A new stomp.py connection per connect: its receiver thread reports to the sink only.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from typing import Any

from broker.bridge.config import RemoteUrl, Route
from broker.bridge.connectors import Sink
from broker.bridge.core import RESENT_HEADER
from broker.bridge.errors import ConnectorError, MissingLibrary
from broker.bridge.events import RemoteAccepted, RemoteMessage, RemoteRefused

try:
    import stomp
    from stomp.exception import StompException
except ImportError:  # pragma: no cover - depends on the install
    stomp = None

#: Heart-beats (milliseconds) asked of and offered to the remote.
HEARTBEAT_MS = 10_000
#: Seconds ``close`` waits for stomp.py's receiver thread to end.
CLOSE_WAIT = 5.0


class StompConnector:
    def __init__(self, url: RemoteUrl, routes: tuple[Route, ...], *, window: int) -> None:
        if stomp is None:
            raise MissingLibrary("the STOMP bridge needs stomp.py: pip install 'zerohub[bridges]'")
        self.url = url
        self.inbound = routes
        self.window = window
        self._conn: Any = None
        self._sink: Sink | None = None
        self._generation = 0
        self._receipts: dict[str, int] = {}  # receipt id -> bridge token
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._lost: str | None = None
        self._routes = {r.remote: r for r in routes}
        self._host: str | None = None  # the CONNECT host header the server took

    def open(self, sink: Sink, generation: int, timeout: float) -> None:
        self._sink = sink
        self._generation = generation
        self._receipts = {}
        self._lost = None
        hosts = self._host_headers()
        for n, host in enumerate(hosts):
            self._lost = None
            try:
                self._conn = self._open(host, generation, timeout)
            except _Refused:
                if n == len(hosts) - 1:
                    raise
                continue
            self._host = host  # the one this server takes: first next time
            return

    def _host_headers(self) -> list[str]:
        """The CONNECT ``host`` headers (virtual host) to try, in order: the URL's
        /VHOST when it names one; else the server's host name (as STOMP 1.2 says), then
        "/" (RabbitMQ refuses a virtual host it does not know, its default is "/")."""
        if self.url.vhost_named:
            return [self.url.vhost]
        names = [self.url.host, "/"]
        if self._host in names:
            names.remove(self._host)
            names.insert(0, self._host)
        return names

    def _open(self, host: str, generation: int, timeout: float) -> Any:
        conn = stomp.Connection12(
            [(self.url.host, self.url.port)],
            heartbeats=(HEARTBEAT_MS, HEARTBEAT_MS),
            reconnect_attempts_max=1,
            timeout=timeout,
            vhost=host,
            auto_decode=False,  # payloads stay octets
        )
        conn.set_listener("bridge", _Listener(self, generation))
        try:
            conn.connect(self.url.username, self.url.password, wait=True)
            for n, route in enumerate(self.inbound):
                conn.subscribe(route.remote, id=f"bridge-{n}", ack="client-individual",
                               headers={"credit": str(self.window),
                                        "activemq.prefetchSize": str(self.window)})  # fmt: skip
        except OSError as exc:
            self._close(conn)
            raise ConnectorError(f"STOMP {self.url.redacted()}: {exc}") from None
        except StompException as exc:
            self._close(conn)
            raise _Refused(f"STOMP {self.url.redacted()} (host {host!r}): {exc}") from None
        if not conn.is_connected():
            self._close(conn)
            raise _Refused(f"STOMP {self.url.redacted()} (host {host!r}): connection refused")
        return conn

    def publish(self, token: int, remote: str, payload: bytes, resent: bool = False) -> None:
        receipt = f"r{next(self._ids)}"
        with self._lock:
            self._receipts[receipt] = token
        headers = {"receipt": receipt, "persistent": "true"}
        if resent:
            headers[RESENT_HEADER] = "true"
        try:
            self._conn.send(remote, payload, headers=headers)
        except (StompException, OSError) as exc:
            raise ConnectorError(f"STOMP send: {exc}") from None

    def ack(self, ref: Any) -> None:
        generation, ack_id = ref
        if generation != self._generation or self._conn is None:
            return  # the connection it came on is gone: the remote delivers it again
        try:
            self._conn.ack(ack_id)
        except (StompException, OSError) as exc:
            raise ConnectorError(f"STOMP ack: {exc}") from None

    def pump(self, timeout: float) -> None:
        time.sleep(timeout)  # stomp.py's receiver thread does the reading
        if self._lost is not None or self._conn is None or not self._conn.is_connected():
            raise ConnectorError(f"STOMP connection lost: {self._lost or 'disconnected'}")

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._close(conn)

    @staticmethod
    def _close(conn: Any) -> None:
        """DISCONNECT if connected; in any case close the socket and let stomp.py's
        receiver thread end (a refused CONNECT leaves it running otherwise)."""
        try:
            if conn.is_connected():
                conn.disconnect()
        except (StompException, OSError):
            pass
        transport = conn.transport
        with contextlib.suppress(Exception):  # stomp.py closing a dead socket
            transport.disconnect_socket()
        thread = getattr(transport, "io_thread", None)
        if thread is not None and thread is not threading.current_thread():
            thread.join(CLOSE_WAIT)

    # -- from stomp.py's receiver thread ---------------------------------------------------

    def _receipt(self, receipt: str, generation: int) -> None:
        with self._lock:
            token = self._receipts.pop(receipt, None)
        if token is not None and self._sink is not None:
            self._sink(RemoteAccepted(token, generation))

    def _error(self, headers: dict[str, str], body: Any, generation: int) -> None:
        receipt = headers.get("receipt-id")
        with self._lock:
            token = self._receipts.pop(receipt, None) if receipt else None
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body)
        reason = headers.get("message") or text[:200] or "ERROR frame"
        if token is not None and self._sink is not None:
            self._sink(RemoteRefused(token, generation, reason))
        else:
            self._lost = reason  # an ERROR ends a STOMP connection

    def _message(self, headers: dict[str, str], body: Any, generation: int) -> None:
        destination = headers.get("destination", "")
        route = self._routes.get(destination)
        if route is None and len(self.inbound) == 1:
            route = self.inbound[0]  # a server that rewrites the destination header
        ack_id = headers.get("ack") or headers.get("message-id", "")
        payload = body if isinstance(body, bytes) else str(body).encode()
        extra = tuple((k, v) for k, v in headers.items() if k in ("message-id", "destination"))
        ours = [("Stomp-" + k, v) for k, v in extra]
        if headers.get("redelivered", "").lower() == "true":  # RabbitMQ: may be a duplicate
            ours.append(("Bridge-Redelivered", "true"))
        if self._sink is not None:
            self._sink(RemoteMessage(route, payload, (generation, ack_id), generation,
                                     tuple(ours)))  # fmt: skip


class _Refused(ConnectorError):
    """The server answered, but did not take the CONNECT (e.g. its virtual host)."""


class _Listener:
    def __init__(self, connector: StompConnector, generation: int) -> None:
        self.connector = connector
        self.generation = generation

    def on_receipt(self, frame: Any) -> None:
        self.connector._receipt(frame.headers.get("receipt-id", ""), self.generation)

    def on_error(self, frame: Any) -> None:
        self.connector._error(frame.headers, frame.body or b"", self.generation)

    def on_message(self, frame: Any) -> None:
        self.connector._message(frame.headers, frame.body, self.generation)

    def on_disconnected(self) -> None:
        if self.generation == self.connector._generation:
            self.connector._lost = "disconnected"
