"""What the console's buttons do: broker operations, each asked as a broker client would.

The console is no way around the broker's authorization: every change (create or
delete a channel or queue, set a queue's status, purge a queue) is a TMQP server
operation sent to the broker's own endpoint by a client connected with the console's
``broker_token`` as its ``Client-Token``, so the engine's authorizer decides exactly as
it does for any other client (a refusal comes back as a 401 and is shown as such).
A CURVE broker admits the console's connection like any client's: with the console's
own certificate (``[console] curve_secret``), whose public key the broker's ``allow``
folder must hold; without one, actions answer 503 saying so.
Browsing a queue is the broker's ``QUEUE_BROWSE`` operation (``broker.sequence``: the
messages it holds, oldest sequence number first, none taken; the ``browse`` action).
A queue's trash (what left it without being consumed: expired, past its put-back limit,
nacked and not put back) is listed the same way with its reasons (``trash``), pushed
back into the queue (``trash-resubmit``) or emptied (``trash-purge``), all of it or the
messages whose sequence numbers the request lists (``"sequences": [3, 7]``, at most
:data:`BROWSE_LIMIT`); listing needs the broker's browse permission, the other two its
trash permission.

:class:`ConsoleActions` takes a request (a JSON object: ``{"action": NAME, ...}``),
checks its fields and answers a JSON-able dict; anything wrong is an
:class:`ActionError` with an HTTP status.  The broker connection is opened at the
first action and kept (one at a time: a lock); ``close()`` ends it (the hub does, before
it stops the broker).
"""

from __future__ import annotations

import base64
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

import zmq

from broker.client.blocking import Client
from broker.client.errors import ClientError, RemoteError
from broker.engine.options import status_name
from broker.protocol import QueueStatus
from broker.sequence import FROM_FIRST

__all__ = ["BROWSE_LIMIT", "PREVIEW_OCTETS", "ActionError", "ConsoleActions"]

#: The header a trashed message carries: why it left its queue.
_TRASH_REASON = "Trash-Reason"

#: Messages a browse shows at most (the first ones the queue holds, oldest first).
BROWSE_LIMIT = 100
#: Octets of a browsed message's payload shown (the size is always given).
PREVIEW_OCTETS = 1024
#: Channel names longer than this are refused before they reach the broker.
_MAX_NAME = 256


class ActionError(Exception):
    """An action refused or failed; ``status`` is the HTTP status to answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _http_status(error: RemoteError) -> int:
    if error.code in (400, 401, 404):
        return error.code
    if error.code in (481,):  # already created
        return 409
    return 502


def _channel(request: Mapping[str, Any]) -> str:
    name = request.get("channel")
    if not isinstance(name, str) or not name or len(name) > _MAX_NAME:
        raise ActionError(400, f"channel must be a name of 1 to {_MAX_NAME} characters")
    return name


def _queue(request: Mapping[str, Any]) -> int:
    raw = request.get("queue")
    if isinstance(raw, str) and raw.strip().isdigit():
        raw = int(raw)
    if not isinstance(raw, int) or isinstance(raw, bool) or not 0 <= raw <= 65535:
        raise ActionError(400, "queue must be a queue id (0 to 65535)")
    return raw


def _status(request: Mapping[str, Any]) -> str:
    raw = request.get("status")
    names = {status_name(s).lower(): status_name(s) for s in QueueStatus}
    if not isinstance(raw, str) or raw.strip().lower() not in names:
        raise ActionError(400, f"status must be one of: {', '.join(sorted(names.values()))}")
    return names[raw.strip().lower()]


def _limit(request: Mapping[str, Any]) -> int:
    raw = request.get("limit", 20)
    if not isinstance(raw, int) or isinstance(raw, bool) or raw < 1:
        raise ActionError(400, "limit must be a positive whole number")
    return min(raw, BROWSE_LIMIT)


def _sequences(request: Mapping[str, Any]) -> list[int] | None:
    raw = request.get("sequences")
    if raw is None:
        return None
    if (
        not isinstance(raw, list)
        or not raw
        or len(raw) > BROWSE_LIMIT
        or any(not isinstance(n, int) or isinstance(n, bool) or not 1 <= n < 2**63 for n in raw)
    ):
        raise ActionError(
            400, f"sequences must be a list of 1 to {BROWSE_LIMIT} sequence numbers (1 or more)"
        )
    return raw


def _text(payload: bytes) -> dict[str, Any]:
    shown = payload[:PREVIEW_OCTETS]
    try:
        return {"text": shown.decode("utf-8")}
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(shown).decode("ascii")}


class ConsoleActions:
    """The console's actions on one broker (see the module docstring).

    ``endpoint()`` is the broker's bound endpoint (known once it started); ``context`` is
    the hub's ZeroMQ context.
    """

    def __init__(
        self,
        endpoint: Callable[[], str | None],
        context: zmq.Context[Any],
        *,
        broker_token: str | None = None,
        timeout: float = 10.0,
        server_key: str | os.PathLike[str] | None = None,
        curve_secret: str | os.PathLike[str] | None = None,
        unavailable: str | None = None,
    ) -> None:
        self._endpoint = endpoint
        self._context = context
        self._token = broker_token or None
        #: CURVE (a CURVE broker): the broker's public key file (a ``.key_secret`` file
        #: holds it too) and the console's client certificate.
        self._server_key = server_key
        self._curve_secret = curve_secret
        #: Why actions cannot be done at all (503), e.g. no key for a CURVE broker.
        self._unavailable = unavailable
        self._timeout = timeout
        self._lock = threading.Lock()
        self._client: Client | None = None
        self._closed = False
        self._table: dict[str, Callable[[Client, Mapping[str, Any]], dict[str, Any]]] = {
            "create-channel": self._create_channel,
            "delete-channel": self._delete_channel,
            "create-queue": self._create_queue,
            "delete-queue": self._delete_queue,
            "set-status": self._set_status,
            "purge": self._purge,
            "browse": self._browse,
            "trash": self._trash,
            "trash-resubmit": self._trash_resubmit,
            "trash-purge": self._trash_purge,
        }

    @property
    def names(self) -> list[str]:
        """The actions there are."""
        return sorted(self._table)

    def run(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """Do what ``request`` asks; ActionError if it is refused or fails."""
        name = request.get("action")
        action = self._table.get(name) if isinstance(name, str) else None
        if action is None:
            raise ActionError(400, f"action must be one of: {', '.join(self.names)}")
        with self._lock:
            client = self._connected()
            try:
                return action(client, request)
            except RemoteError as exc:
                raise ActionError(_http_status(exc), f"the broker refused: {exc}") from None
            except ClientError as exc:
                self._drop()
                raise ActionError(502, f"the broker did not answer: {exc}") from None

    def close(self) -> None:
        """End the broker connection (idempotent); actions fail afterwards."""
        with self._lock:
            self._closed = True
            self._drop()

    # -- the connection ----------------------------------------------------------------

    def _connected(self) -> Client:
        if self._closed:
            raise ActionError(503, "the console is stopping")
        if self._unavailable is not None:
            raise ActionError(503, self._unavailable)
        if self._client is not None and self._client.connected:
            return self._client
        self._drop()
        endpoint = self._endpoint()
        if endpoint is None:
            raise ActionError(503, "the broker is not serving")
        client = Client(
            endpoint,
            context=self._context,
            name="zerohub-console",
            client_type="console",
            token=self._token,
            timeout=self._timeout,
            linger=0.0,
            server_key=self._server_key,
            curve_secret=self._curve_secret,
        )
        try:
            client.connect()
        except ClientError as exc:
            raise ActionError(502, f"cannot connect to the broker: {exc}") from None
        self._client = client
        return client

    def _drop(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()

    # -- the actions -------------------------------------------------------------------

    def _create_channel(self, client: Client, request: Mapping[str, Any]) -> dict[str, Any]:
        channel = _channel(request)
        client.create_channel(channel)
        return {"done": f"channel {channel} created"}

    def _delete_channel(self, client: Client, request: Mapping[str, Any]) -> dict[str, Any]:
        channel = _channel(request)
        client.delete_channel(channel)
        return {"done": f"channel {channel} deleted"}

    def _create_queue(self, client: Client, request: Mapping[str, Any]) -> dict[str, Any]:
        channel, queue = _channel(request), _queue(request)
        options = {"Status": _status(request)} if "status" in request else None
        client.create_queue(channel, queue, options)
        return {"done": f"queue {channel}/{queue} created"}

    def _delete_queue(self, client: Client, request: Mapping[str, Any]) -> dict[str, Any]:
        channel, queue = _channel(request), _queue(request)
        client.delete_queue(channel, queue)
        return {"done": f"queue {channel}/{queue} deleted"}

    def _set_status(self, client: Client, request: Mapping[str, Any]) -> dict[str, Any]:
        channel, queue, status = _channel(request), _queue(request), _status(request)
        client.update_queue(channel, queue, {"Status": status})
        return {"done": f"queue {channel}/{queue} is {status}"}

    def _purge(self, client: Client, request: Mapping[str, Any]) -> dict[str, Any]:
        channel, queue = _channel(request), _queue(request)
        answer = client.purge_queue(channel, queue)
        removed = int(answer.get("Removed", 0)) if isinstance(answer, dict) else 0
        return {"done": f"queue {channel}/{queue} purged: {removed} removed", "removed": removed}

    def _browse(self, client: Client, request: Mapping[str, Any]) -> dict[str, Any]:
        channel, queue, limit = _channel(request), _queue(request), _limit(request)
        held = client.browse(channel, queue, FROM_FIRST, limit)
        messages = [_shown(entry) for entry in held[:limit]]
        shown = f"{len(messages)} message(s) of {channel}/{queue} shown, none taken"
        return {"done": shown, "channel": channel, "queue": queue, "messages": messages}

    def _trash(self, client: Client, request: Mapping[str, Any]) -> dict[str, Any]:
        channel, queue, limit = _channel(request), _queue(request), _limit(request)
        trashed = client.trash_list(channel, queue, 0, limit)
        messages = [_shown(entry) for entry in trashed[:limit]]
        shown = f"{len(messages)} message(s) in the trash of {channel}/{queue} shown"
        return {
            "done": shown,
            "channel": channel,
            "queue": queue,
            "trash": True,
            "messages": messages,
        }

    def _trash_resubmit(self, client: Client, request: Mapping[str, Any]) -> dict[str, Any]:
        channel, queue, chosen = _channel(request), _queue(request), _sequences(request)
        done = int(client.trash_resubmit(channel, queue, chosen))
        what = f"{done} message(s) of the trash of {channel}/{queue} pushed back into it"
        return {"done": what, "resubmitted": done}

    def _trash_purge(self, client: Client, request: Mapping[str, Any]) -> dict[str, Any]:
        channel, queue, chosen = _channel(request), _queue(request), _sequences(request)
        done = int(client.trash_purge(channel, queue, chosen))
        return {"done": f"{done} message(s) of the trash of {channel}/{queue} removed",
                "purged": done}  # fmt: skip


def _shown(entry: Any) -> dict[str, Any]:
    """A browsed or trashed message as the page shows it."""
    m = entry.message
    payload = bytes(m.payload)
    headers = [list(pair) for pair in m.headers if pair[0] != _TRASH_REASON]
    out = {
        "sequence": entry.sequence,
        "id": m.message_id,
        "producer": m.source,
        "high_priority": m.high_priority,
        "size": len(payload),
        "headers": headers,
        **_text(payload),
    }
    reason = m.header(_TRASH_REASON) if m.headers else None
    if reason is not None:
        out["reason"] = reason
    return out
