"""A small HTTP front door on loopback: the hub's metrics and web console use it.

:class:`HttpServer` answers ``GET``/``HEAD`` for a fixed set of paths (a route returns
a :class:`Response`); anything else is a 404 or 405, a malformed request a 400, and
the server goes on serving.  Limits, each with a default: ``max_connections`` (64)
connections served at once (more are closed at once), ``timeout`` (10 s) for a peer
to send its request (a client that sends nothing, or a byte at a time, is dropped),
the standard library's 64 KiB request line and 100 header lines.  Requests whose
``Host`` is not the address the server listens on (or ``localhost``) get a 421: a web
page elsewhere cannot read the hub's status through a rebound DNS name.

``POST`` goes to a separate table of actions (a :class:`Request` in, a
:class:`Response` out).  Before an action runs: a request whose ``Origin`` is another
site's (or whose ``Sec-Fetch-Site`` says ``cross-site``/``same-site``) is refused
with a 403 (a page elsewhere cannot make the visitor's browser act: cross-site request
forgery); a body must have a ``Content-Length`` of at most ``max_body`` octets
(default 64 KiB; 411 and 413 otherwise).  The action itself checks whatever else it
needs (the console's token).

``bind()`` opens the socket (an address in use fails there, before the hub does any
work), ``start()`` serves on a daemon thread, ``stop()`` ends it and closes every
socket.  Routes run on the connection's thread: they must be safe to call from there.
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["HttpError", "HttpServer", "Request", "Response"]

log = logging.getLogger(__name__)

#: Connections served at once; one more is closed without an answer.
DEFAULT_MAX_CONNECTIONS = 64
#: Seconds a peer has to send its request (and between reads of it).
DEFAULT_TIMEOUT = 10.0
#: Octets of a POST body read at most.
DEFAULT_MAX_BODY = 64 * 1024

_SECURITY_HEADERS = (
    ("X-Content-Type-Options", "nosniff"),
    ("Cache-Control", "no-store"),
    ("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'"),
)


class HttpError(OSError):
    """The HTTP endpoint could not be opened (address in use, not allowed...)."""


@dataclass(frozen=True, slots=True)
class Response:
    """What a route answers."""

    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    status: int = 200


@dataclass(frozen=True, slots=True)
class Request:
    """A POST an action answers (headers with lower-case names)."""

    path: str
    headers: Mapping[str, str]
    body: bytes


Route = Callable[[], Response]
Action = Callable[[Request], Response]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True  # (SO_REUSEADDR: TIME_WAIT only; a live listener still fails)

    def __init__(self, address: tuple[str, int], owner: HttpServer) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.owner = owner
        self.slots = threading.BoundedSemaphore(owner.max_connections)
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.owner.refused += 1
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("%s: error serving %s", self.owner.name, client_address, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.0"

    def setup(self) -> None:
        self.request.settimeout(self.server.owner.timeout)  # what StreamRequestHandler's
        super().setup()  # class attribute ``timeout`` does, per server

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_POST(self) -> None:
        owner = self.server.owner
        if not owner.actions:  # a server without actions has no POST at all
            self.send_error(501, f"Unsupported method ({self.command!r})")
            return
        path = self.path.partition("?")[0]
        response = self._refusal(path)
        if response is None:
            try:
                response = self._act(path)
            except Exception:
                log.exception("%s: %s failed", owner.name, path)
                response = Response(b"internal error\n", status=500)
        self._send(response, body=True)

    def _refusal(self, path: str) -> Response | None:
        """Why a POST is refused before its action runs (None: it is not)."""
        owner = self.server.owner
        if not owner.host_allowed(self.headers.get("Host")):
            return Response(b"misdirected request\n", status=421)
        if path not in owner.actions:
            status = 405 if path in owner.routes else 404
            return Response(b"no such action\n", status=status)
        if not owner.origin_allowed(self.headers.get("Origin"), self.headers.get("Host")):
            return Response(b"cross-origin request refused\n", status=403)
        if (self.headers.get("Sec-Fetch-Site") or "").lower() in ("cross-site", "same-site"):
            return Response(b"cross-site request refused\n", status=403)
        return None

    def _act(self, path: str) -> Response:
        owner = self.server.owner
        raw = self.headers.get("Content-Length")
        if raw is None or not raw.strip().isdigit():
            return Response(b"Content-Length required\n", status=411)
        size = int(raw)
        if size > owner.max_body:
            return Response(f"body over {owner.max_body} octets\n".encode(), status=413)
        body = self.rfile.read(size)
        if len(body) < size:
            return Response(b"body cut short\n", status=400)
        headers = {name.lower(): value for name, value in self.headers.items()}
        return owner.actions[path](Request(path, headers, body))

    def _answer(self, *, body: bool) -> None:
        owner = self.server.owner
        path = self.path.partition("?")[0]
        if not owner.host_allowed(self.headers.get("Host")):
            response = Response(b"misdirected request\n", status=421)
        elif path not in owner.routes:
            status = 405 if path in owner.actions else 404
            response = Response(b"not found\n", status=status)
        else:
            try:
                response = owner.routes[path]()
            except Exception:
                log.exception("%s: %s failed", owner.name, path)
                response = Response(b"internal error\n", status=500)
        self._send(response, body=body)

    def _send(self, response: Response, *, body: bool) -> None:
        owner = self.server.owner
        owner.served += 1
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(response.body)))
        for name, value in _SECURITY_HEADERS:
            self.send_header(name, value)
        self.end_headers()
        if body:
            self.wfile.write(response.body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s: %s %s", self.server.owner.name, self.address_string(), format % args)


class HttpServer:
    """Serve ``routes`` (path -> route) on ``address`` (``(host, port)``; port 0: any)."""

    def __init__(
        self,
        name: str,
        address: tuple[str, int],
        routes: Mapping[str, Route],
        *,
        actions: Mapping[str, Action] | None = None,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        timeout: float = DEFAULT_TIMEOUT,
        max_body: int = DEFAULT_MAX_BODY,
    ) -> None:
        if max_connections < 1 or timeout <= 0 or max_body < 1:
            raise ValueError("max_connections, timeout and max_body must be positive")
        self.name = name
        self.address = address
        self.routes = dict(routes)
        #: POST paths and what answers them.
        self.actions = dict(actions or {})
        self.max_body = max_body
        #: Called by stop() once the socket is closed (what the routes used: a client).
        self.on_stop: list[Callable[[], object]] = []
        self.max_connections = max_connections
        self.timeout = timeout
        #: Requests answered, and connections closed unanswered (over max_connections).
        self.served = 0
        self.refused = 0
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._hosts: frozenset[str] = frozenset()

    @property
    def url(self) -> str:
        host, port = self.bound
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    @property
    def bound(self) -> tuple[str, int]:
        """The address listened on (the port resolved); before bind(), the one asked for."""
        if self._server is None:
            return self.address
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def bind(self) -> tuple[str, int]:
        """Open the listening socket (idempotent); HttpError if it cannot be opened."""
        if self._server is None:
            host, port = self.address
            try:
                self._server = _Server((host, port), self)
            except OSError as exc:
                why = "address in use" if exc.errno == errno.EADDRINUSE else exc.strerror or exc
                raise HttpError(f"{self.name}: cannot listen on {host}:{port}: {why}") from None
            host, port = self.bound
            names = {host, "localhost", "127.0.0.1", "[::1]" if ":" in host else host}
            self._hosts = frozenset(f"{n}:{port}" for n in names) | frozenset(names)
        return self.bound

    def host_allowed(self, host: str | None) -> bool:
        """A request's Host header names this server (HTTP/1.0 may send none)."""
        return host is None or host.lower() in self._hosts

    def origin_allowed(self, origin: str | None, host: str | None) -> bool:
        """A request's ``Origin`` is this server's own (or absent: not sent by a page).

        The origin must be ``http://`` and name the host the request was sent to (an
        allowed ``Host``): a page served here calling its own actions.
        """
        if origin is None:
            return True
        scheme, sep, rest = origin.strip().lower().partition("://")
        if scheme != "http" or not sep or rest in ("", "null"):
            return False
        if host is None:
            return self.host_allowed(rest)
        return rest == host.strip().lower() and self.host_allowed(rest)

    def start(self) -> str:
        """Bind if needed and serve on a daemon thread; the base URL."""
        self.bind()
        assert self._server is not None
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._server.serve_forever,
                kwargs={"poll_interval": 0.2},
                name=f"zerohub-{self.name}",
                daemon=True,
            )
            self._thread.start()
        return self.url

    def stop(self) -> None:
        """Stop serving and close the socket (idempotent)."""
        server, self._server = self._server, None
        if server is None:
            return
        if self._thread is not None:
            server.shutdown()
            self._thread.join()
            self._thread = None
        server.server_close()
        for close in self.on_stop:
            close()
