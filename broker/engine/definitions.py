"""Channel, queue, router and durable subscription definitions kept in the store, so
that a restart recreates them.

Names: ``channel/<channel name>`` holds the channel's options as JSON
(``ChannelOptions.to_json``); ``queue/<queue id>/<channel name>`` the queue's
(``ChannelQueueOptions.to_json``) -- the id first, as a channel name may hold a ``/``;
``router/<name>`` a router with its bindings (``Router.to_json``); ``dsub/<id>`` a
durable subscription (``broker.engine.dsubs``); ``creator/<kind>/<key>`` the user that
created a channel, queue or durable subscription (``broker.engine.quotas``).
The registry writes a definition when a channel or queue is created or updated and
forgets it when it is removed; a store that does not outlive the process ignores them.
A failing store write is counted as an engine error: the live broker goes on.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from broker.store import Store

log = logging.getLogger("broker.engine.definitions")

CHANNEL_PREFIX = "channel/"
QUEUE_PREFIX = "queue/"
ROUTER_PREFIX = "router/"
DSUB_PREFIX = "dsub/"
#: Federation ids the engine took (``broker.engine.federated``).
FEDSEEN_PREFIX = "fedseen/"
#: Creators of what the per-user quotas count (``broker.engine.quotas``).
CREATOR_PREFIX = "creator/"
#: Prefixes read by their own owners (:meth:`Definitions.saved_under`), not by ``saved``.
_OTHER_PREFIXES = (ROUTER_PREFIX, DSUB_PREFIX, FEDSEEN_PREFIX, CREATOR_PREFIX)


def channel_name(name: str) -> str:
    return CHANNEL_PREFIX + name


def queue_name(channel: str, queue_id: int) -> str:
    return f"{QUEUE_PREFIX}{queue_id}/{channel}"


def _json(options: dict[str, Any]) -> bytes:
    return json.dumps(options, sort_keys=True, separators=(",", ":")).encode()


class Definitions:
    """Writes definitions through ``store``; errors go to ``on_error(where, exc)``."""

    __slots__ = ("on_error", "store")

    def __init__(self, store: Store, on_error: Callable[[str, Exception], None]) -> None:
        self.store = store
        self.on_error = on_error

    def channel(self, name: str, options: dict[str, Any]) -> None:
        self._put(channel_name(name), _json(options))

    def queue(self, channel: str, queue_id: int, options: dict[str, Any]) -> None:
        self._put(queue_name(channel, queue_id), _json(options))

    def forget_channel(self, name: str) -> None:
        self._delete(channel_name(name))

    def forget_queue(self, channel: str, queue_id: int) -> None:
        self._delete(queue_name(channel, queue_id))

    def router(self, name: str, definition: dict[str, Any]) -> None:
        self._put(ROUTER_PREFIX + name, _json(definition))

    def forget_router(self, name: str) -> None:
        self._delete(ROUTER_PREFIX + name)

    def dsub(self, sub_id: str, definition: dict[str, Any]) -> None:
        self._put(DSUB_PREFIX + sub_id, _json(definition))

    def forget_dsub(self, sub_id: str) -> None:
        self._delete(DSUB_PREFIX + sub_id)

    def creator(self, held: str, user: str) -> None:
        self._put(CREATOR_PREFIX + held, user.encode())  # (the text alone: no JSON to make)

    def forget_creator(self, held: str) -> None:
        self._delete(CREATOR_PREFIX + held)

    def creators(self) -> dict[str, str]:
        """The kept creators: held entity key -> user (``broker.engine.quotas``)."""
        found: dict[str, str] = {}
        for name, value in self.store.definitions().items():
            if name.startswith(CREATOR_PREFIX):
                try:
                    found[name[len(CREATOR_PREFIX) :]] = bytes(value).decode()
                except UnicodeDecodeError:
                    log.warning("definition %r is not UTF-8: ignored", name)
        return found

    def saved_under(self, prefix: str) -> dict[str, Any]:
        """The kept definitions named ``prefix`` + key, as key -> parsed JSON (one that
        is not JSON is logged and skipped)."""
        found: dict[str, Any] = {}
        for name, value in self.store.definitions().items():
            if name.startswith(prefix):
                try:
                    found[name[len(prefix) :]] = json.loads(value)
                except ValueError:
                    log.warning("definition %r is not JSON: ignored", name)
        return found

    def saved(self) -> tuple[dict[str, bytes], dict[tuple[str, int], bytes]]:
        """The kept channel options by name and queue options by (channel, id)."""
        channels: dict[str, bytes] = {}
        queues: dict[tuple[str, int], bytes] = {}
        for name, value in self.store.definitions().items():
            if name.startswith(CHANNEL_PREFIX):
                channels[name[len(CHANNEL_PREFIX) :]] = value
            elif name.startswith(QUEUE_PREFIX):
                qid, _, channel = name[len(QUEUE_PREFIX) :].partition("/")
                if qid.isdigit() and channel:
                    queues[(channel, int(qid))] = value
                    continue
                log.warning("unknown definition %r ignored", name)
            elif not name.startswith(_OTHER_PREFIXES):
                log.warning("unknown definition %r ignored", name)
        return channels, queues

    def _put(self, name: str, value: bytes) -> None:
        try:
            self.store.put_definition(name, value)
        except Exception as exc:
            self.on_error("store.put_definition", exc)

    def _delete(self, name: str) -> None:
        try:
            self.store.delete_definition(name)
        except Exception as exc:
            self.on_error("store.delete_definition", exc)
