"""The hub's web console: one HTML page and a small script, on a loopback HTTP port.

``GET /`` is the page, ``GET /console.js`` and ``/console.css`` its script and style,
and ``GET /api/status`` the hub's status as JSON (:mod:`zerohub.status`: mounts,
subscribers and their lag, broker totals, channels and queues with their depth).  The
page fetches the JSON every ``refresh`` seconds and draws it with DOM text nodes
(names a client chose, a queue called ``<script>``, show as text).  No build step,
nothing loaded from elsewhere (the Content-Security-Policy allows the hub's own
origin only: no inline script or style either).

Off by default; ``zerohub serve --console`` (or ``[console] enabled = true``) serves on
``127.0.0.1:9465``.  It only reads: no action changes the broker yet.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from importlib import resources
from typing import Any

from zerohub.httpd import HttpServer, Response

__all__ = ["console_server"]


def _asset(name: str) -> bytes:
    return resources.files(__package__).joinpath("static", name).read_bytes()


def console_server(
    address: tuple[str, int], status: Callable[[], dict[str, Any]], *, refresh: float = 2.0
) -> HttpServer:
    """An :class:`HttpServer` for the console; ``status()`` gives the JSON's content."""
    page = _asset("index.html").replace(b"{{refresh_ms}}", str(int(refresh * 1000)).encode())
    script = _asset("console.js")
    style = _asset("console.css")

    def api_status() -> Response:
        body = json.dumps(status(), sort_keys=True, separators=(",", ":"), default=str)
        return Response(body.encode("utf-8"), "application/json")

    routes = {
        "/": lambda: Response(page, "text/html; charset=utf-8"),
        "/console.js": lambda: Response(script, "text/javascript; charset=utf-8"),
        "/console.css": lambda: Response(style, "text/css; charset=utf-8"),
        "/api/status": api_status,
    }
    return HttpServer("console", address, routes)
