"""The hub's web console: one HTML page and a small script, on a loopback HTTP port.

``GET /`` is the page, ``GET /console.js`` and ``/console.css`` its script and style,
and ``GET /api/status`` the hub's status as JSON (:mod:`zerohub.status`: mounts,
subscribers and their lag, broker totals, channels and queues with their depth and
rates).  The page fetches the JSON every ``refresh`` seconds and draws it with DOM text
nodes (names a client chose, a queue called ``<script>``, show as text) and inline SVG
charts.  No build step, nothing loaded from elsewhere (the Content-Security-Policy
allows the hub's own origin only: no inline script or style either).

Actions (:mod:`zerohub.console.actions`: create/delete a channel or queue, set a
queue's status, purge, browse) are ``POST /api/action`` with a JSON body
(``{"action": "purge", "channel": "orders", "queue": 1}``), and only with:

- the console's token in the ``X-Zerohub-Token`` header (``[console] token``, or one
  made at start and printed by ``zerohub serve`` as ``http://.../#token=...``: the
  page keeps it for the tab's life).  Without it, or with another: 401;
- ``Content-Type: application/json`` (415 otherwise: an HTML form cannot send it);
- no ``Origin`` of another site (403, :mod:`zerohub.httpd`): together with the custom
  header, which no page elsewhere may send here without a preflight the console never
  answers, this is the protection against cross-site request forgery.

Each change then goes to the broker as a client's operation would, under the broker's
own authorization (``[console] broker_token``).

Off by default; ``zerohub serve --console`` (or ``[console] enabled = true``) serves on
``127.0.0.1:9465``.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable
from importlib import resources
from typing import Any

from zerohub.console.actions import ActionError, ConsoleActions
from zerohub.httpd import HttpServer, Request, Response

__all__ = ["TOKEN_HEADER", "console_server"]

#: The request header carrying the console's token.
TOKEN_HEADER = "X-Zerohub-Token"


def _asset(name: str) -> bytes:
    return resources.files(__package__).joinpath("static", name).read_bytes()


def _json(value: Any, status: int = 200) -> Response:
    body = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return Response(body.encode("utf-8"), "application/json", status)


def _action_route(actions: ConsoleActions, token: str) -> Callable[[Request], Response]:
    expected = token.encode("utf-8")

    def act(request: Request) -> Response:
        given = request.headers.get(TOKEN_HEADER.lower(), "").strip().encode("utf-8")
        if not given or not hmac.compare_digest(given, expected):
            return _json({"error": f"the console's token is required ({TOKEN_HEADER})"}, 401)
        kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
        if kind != "application/json":
            return _json({"error": "the body must be application/json"}, 415)
        try:
            asked = json.loads(request.body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            return _json({"error": f"not JSON: {exc}"}, 400)
        if not isinstance(asked, dict):
            return _json({"error": "the body must be a JSON object"}, 400)
        try:
            return _json(actions.run(asked))
        except ActionError as exc:
            return _json({"error": exc.message}, exc.status)

    return act


def console_server(
    address: tuple[str, int],
    status: Callable[[], dict[str, Any]],
    *,
    refresh: float = 2.0,
    actions: ConsoleActions | None = None,
    token: str = "",
) -> HttpServer:
    """An :class:`HttpServer` for the console; ``status()`` gives the JSON's content.

    With ``actions`` and a ``token``, ``POST /api/action`` performs them (see the module
    docstring); without, the console only reads.
    """
    page = _asset("index.html").replace(b"{{refresh_ms}}", str(int(refresh * 1000)).encode())
    script = _asset("console.js")
    style = _asset("console.css")

    def api_status() -> Response:
        return _json(status())

    routes = {
        "/": lambda: Response(page, "text/html; charset=utf-8"),
        "/console.js": lambda: Response(script, "text/javascript; charset=utf-8"),
        "/console.css": lambda: Response(style, "text/css; charset=utf-8"),
        "/api/status": api_status,
    }
    posts = {}
    if actions is not None and token:
        posts["/api/action"] = _action_route(actions, token)
    server = HttpServer("console", address, routes, actions=posts)
    if actions is not None:
        server.on_stop.append(actions.close)
    return server
