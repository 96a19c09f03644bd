"""Bridge settings: routes (``--map``), the remote URL, the limits and their defaults.

A route is ``[out:|in:]LOCAL=REMOTE`` (the direction defaults to ``out``):

* ``out:CHANNEL/QUEUE=REMOTE``: the bridge joins the local CHANNEL (it becomes a consumer
  of every queue of the channel; QUEUE, made with ``RequestAcknowledge`` if missing, is the
  one the bridge expects producers to use) and publishes each message to REMOTE (an MQTT
  topic; for AMQP ``EXCHANGE/ROUTING_KEY`` or a queue name on the default exchange);
* ``in:CHANNEL/QUEUE=REMOTE``: the bridge subscribes to REMOTE (an MQTT topic filter, or an
  AMQP queue name) and pushes every message into the local queue CHANNEL/QUEUE.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import IntEnum
from urllib.parse import unquote, urlsplit

from broker.bridge.errors import ConfigError

#: Messages in flight per direction (sent, not yet accepted by the other side).
DEFAULT_WINDOW = 100
#: First and largest delay (seconds) between reconnect attempts; doubled after each failure.
DEFAULT_BACKOFF = (0.1, 10.0)
#: Seconds to wait for the remote broker to accept a connection.
DEFAULT_CONNECT_TIMEOUT = 5.0
#: Largest payload (octets) accepted from the remote side; larger ones are dead-lettered.
DEFAULT_MAX_MESSAGE_SIZE = 1024 * 1024

_CHANNEL = re.compile(r"^[A-Za-z0-9_.\-@:#*]+$")


class Direction(IntEnum):
    OUT = 1  # local queue -> remote
    IN = 2  # remote -> local queue


@dataclass(frozen=True, slots=True)
class Route:
    direction: Direction
    channel: str
    queue_id: int
    remote: str

    def __str__(self) -> str:
        side = "out" if self.direction is Direction.OUT else "in"
        return f"{side}:{self.channel}/{self.queue_id}={self.remote}"


def parse_route(text: str) -> Route:
    """``[out:|in:]CHANNEL/QUEUE=REMOTE`` -> Route (``ConfigError`` if malformed)."""
    direction = Direction.OUT
    body = text
    for prefix, value in (("out:", Direction.OUT), ("in:", Direction.IN)):
        if text.startswith(prefix):
            direction, body = value, text[len(prefix) :]
    local, sep, remote = body.partition("=")
    channel, slash, queue = local.partition("/")
    if not sep or not slash or not remote or not channel:
        raise ConfigError(f"--map wants [out:|in:]CHANNEL/QUEUE=REMOTE, got {text!r}")
    if not _CHANNEL.match(channel):
        raise ConfigError(f"bad local channel name {channel!r} in {text!r}")
    try:
        queue_id = int(queue)
    except ValueError:
        raise ConfigError(f"queue id must be a number 0..65535, got {queue!r} in {text!r}")
    if not 0 <= queue_id <= 65535:
        raise ConfigError(f"queue id must be a number 0..65535, got {queue!r} in {text!r}")
    if any(ord(c) < 32 for c in remote):
        raise ConfigError(f"control character in remote name {remote!r}")
    return Route(direction, channel, queue_id, remote)


@dataclass(frozen=True, slots=True)
class RemoteUrl:
    scheme: str
    host: str
    port: int
    username: str | None = None
    password: str | None = None
    vhost: str = "/"
    vhost_named: bool = False  # the URL has a /VHOST part (else vhost is the default "/")

    def redacted(self) -> str:
        user = f"{self.username}@" if self.username else ""
        return f"{self.scheme}://{user}{self.host}:{self.port}"


_DEFAULT_PORTS = {"mqtt": 1883, "amqp": 5672, "stomp": 61613}


def parse_url(text: str, scheme: str) -> RemoteUrl:
    """``SCHEME://[USER[:PASSWORD]@]HOST[:PORT][/VHOST]`` (``ConfigError`` if malformed)."""
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"bad URL {text!r}: {exc}")
    if parts.scheme != scheme:
        raise ConfigError(f"URL must start with {scheme}://, got {text!r}")
    if not parts.hostname:
        raise ConfigError(f"URL has no host: {text!r}")
    vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
    return RemoteUrl(
        scheme=scheme,
        host=parts.hostname,
        port=port or _DEFAULT_PORTS[scheme],
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password else None,
        vhost=vhost,
        vhost_named=len(parts.path) > 1,
    )


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything a bridge needs besides its connector (defaults: the constants above)."""

    routes: tuple[Route, ...]
    window: int = DEFAULT_WINDOW
    backoff: tuple[float, float] = DEFAULT_BACKOFF
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    dead_letter: tuple[str, int] | None = None

    def __post_init__(self) -> None:
        if not self.routes:
            raise ConfigError("a bridge needs at least one --map")
        if self.window < 1:
            raise ConfigError(f"window must be at least 1, got {self.window}")
        first, largest = self.backoff
        if not 0 < first <= largest:
            raise ConfigError(f"backoff wants 0 < FIRST <= MAX, got {first}, {largest}")
        if self.max_message_size < 1:
            raise ConfigError("max message size must be at least 1")

    def routes_of(self, direction: Direction) -> tuple[Route, ...]:
        return tuple(r for r in self.routes if r.direction is direction)
