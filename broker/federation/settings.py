"""Federation settings: link specs (``--link``), the broker id, limits and their defaults.

A link spec is ``tcp://HOST:PORT[?mode=both|out|in&channels=PATTERN,PATTERN]``:

* ``mode=both`` (default): messages flow both ways over the link;
* ``mode=out``: this broker only forwards to the remote (a Twino "slave" to its
  "master"); it never asks the remote for messages;
* ``mode=in``: this broker only takes messages from the remote;
* ``channels``: shell patterns (``fnmatch``) of the channel names the link carries, both
  ways (default ``*``);
* ``key``: the remote broker's public key file (CURVE), when it is not the one of
  ``--link-server-key``.

The broker accepting links limits them with ``accept`` patterns (``--link-accept``,
default ``*``): channels a link peer may publish into or ask messages from.  The link
connection itself is a broker client: with CURVE, its key must be in the remote's
``--allow`` directory, as for any client.
"""

from __future__ import annotations

import fnmatch
import re
import secrets
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from broker.federation.errors import ConfigError

#: Depth of a message published without a ``Depth`` header (-1: unlimited, 0: local only).
DEFAULT_DEPTH = -1
#: Federation message ids remembered to drop a second copy (oldest forgotten first).
DEFAULT_SEEN_WINDOW = 65_536
#: Forwards in flight (sent, not yet confirmed) per link peer.
DEFAULT_WINDOW = 100
#: Messages held for link peers (waiting for a window slot or a reconnect), all peers
#: together; beyond it a message that needs no acknowledge is dropped (and counted), one
#: that needs one stays unacknowledged on its queue.  Also the prefetch the federation
#: client joins channels with (the engine hands it at most this many per queue at once).
DEFAULT_MAX_PENDING = 10_000
#: A peer's messages waiting for an answer here (being pushed into the local broker);
#: beyond, a forward is refused busy (a flooding peer; honest ones keep to their window).
DEFAULT_PEER_IN_FLIGHT = 1_000
#: Linked brokers known at once (a peer is remembered, with its interest, once heard).
DEFAULT_MAX_PEERS = 64
#: Seconds between two interest exchanges on a link.
DEFAULT_EXCHANGE_INTERVAL = 0.5
#: Seconds without an interest exchange after which a link peer counts as down.
DEFAULT_PEER_TIMEOUT = 5.0
#: First and largest delay (seconds) before a failed forward is sent again.
DEFAULT_RETRY = (0.2, 5.0)
#: Seconds a forward or a local push may wait for its answer.
DEFAULT_ANSWER_TIMEOUT = 10.0

#: Broker ids: short, printable, no separator of the Hops header.
BROKER_ID = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
#: The file under ``--data`` that keeps a generated broker id across restarts.
ID_FILE = "broker-id"


class LinkMode(IntEnum):
    BOTH = 0
    OUT = 1  # forward to the remote only
    IN = 2  # take from the remote only

    @property
    def sends(self) -> bool:
        return self is not LinkMode.IN

    @property
    def receives(self) -> bool:
        return self is not LinkMode.OUT


def channel_allowed(patterns: tuple[str, ...], channel: str) -> bool:
    return any(fnmatch.fnmatchcase(channel, p) for p in patterns)


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """One ``--link``: where to connect and what the link carries."""

    endpoint: str
    mode: LinkMode = LinkMode.BOTH
    channels: tuple[str, ...] = ("*",)
    server_key: str | None = None

    def carries(self, channel: str) -> bool:
        return channel_allowed(self.channels, channel)


def parse_link(text: str) -> LinkSpec:
    """``tcp://HOST:PORT[?mode=...&channels=...]`` -> LinkSpec (``ConfigError`` if bad)."""
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"--link {text!r}: {exc}") from None
    if parts.scheme != "tcp" or not parts.hostname or port is None or parts.path:
        raise ConfigError(f"--link wants tcp://HOST:PORT[?mode=..&channels=..], got {text!r}")
    options = parse_qs(parts.query, keep_blank_values=True)
    unknown = set(options) - {"mode", "channels", "key"}
    if unknown:
        raise ConfigError(f"--link {text!r}: unknown option {sorted(unknown)[0]!r}")
    mode = LinkMode.BOTH
    if "mode" in options:
        name = options["mode"][-1]
        try:
            mode = LinkMode[name.upper()]
        except KeyError:
            raise ConfigError(f"--link {text!r}: mode is both, out or in, not {name!r}") from None
    channels: tuple[str, ...] = ("*",)
    if "channels" in options:
        channels = tuple(p for p in options["channels"][-1].split(",") if p)
        if not channels:
            raise ConfigError(f"--link {text!r}: channels= names no pattern")
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    key = options["key"][-1] if "key" in options else None
    return LinkSpec(f"tcp://{host}:{port}", mode, channels, key or None)


def check_broker_id(value: str) -> str:
    if not BROKER_ID.match(value):
        raise ConfigError(f"broker id must be 1-64 of A-Z a-z 0-9 _ . -, got {value!r}")
    return value


def seen_file_for(data: str | None) -> str | None:
    """The seen window's file under ``data`` (None without a data directory)."""
    from broker.federation.seen import SEEN_FILE

    if data and data != "none":
        return str(Path(data) / SEEN_FILE)
    return None


def broker_id_for(explicit: str | None, data: str | None) -> str:
    """The broker's id: ``explicit``, else the one kept in ``data/broker-id`` (made on
    first use), else a random one for this process only."""
    if explicit:
        return check_broker_id(explicit)
    if data and data != "none":
        path = Path(data) / ID_FILE
        try:
            return check_broker_id(path.read_text().strip())
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise ConfigError(f"cannot read {path}: {exc}") from None
        value = f"b-{secrets.token_hex(6)}"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(value + "\n")
            tmp.replace(path)
        except OSError as exc:
            raise ConfigError(f"cannot write {path}: {exc}") from None
        return value
    return f"b-{secrets.token_hex(6)}"


@dataclass(frozen=True, slots=True)
class FederationSettings:
    """Everything the federation needs (defaults: the constants above)."""

    broker_id: str
    links: tuple[LinkSpec, ...] = ()
    accept: tuple[str, ...] = ("*",)
    default_depth: int = DEFAULT_DEPTH
    seen_window: int = DEFAULT_SEEN_WINDOW
    window: int = DEFAULT_WINDOW
    max_pending: int = DEFAULT_MAX_PENDING
    peer_in_flight: int = DEFAULT_PEER_IN_FLIGHT
    max_peers: int = DEFAULT_MAX_PEERS
    exchange_interval: float = DEFAULT_EXCHANGE_INTERVAL
    peer_timeout: float = DEFAULT_PEER_TIMEOUT
    retry: tuple[float, float] = DEFAULT_RETRY
    answer_timeout: float = DEFAULT_ANSWER_TIMEOUT
    #: CURVE: the remote brokers' public key file and this side's secret key file.
    server_key: str | None = None
    curve_secret: str | None = None
    #: The file keeping the seen window across restarts (``broker.federation.seen``;
    #: ``federation-seen`` under ``--data``); None: memory only.
    seen_file: str | None = None

    def __post_init__(self) -> None:
        check_broker_id(self.broker_id)
        if self.default_depth < -1:
            raise ConfigError(f"depth is -1 (unlimited) or more, got {self.default_depth}")
        for name in ("seen_window", "window", "max_pending", "max_peers", "peer_in_flight"):
            if getattr(self, name) < 1:
                raise ConfigError(f"federation {name} must be at least 1")
        if not 0 < self.exchange_interval < self.peer_timeout:
            raise ConfigError("federation wants 0 < exchange interval < peer timeout")
        for link in self.links:
            key = link.server_key or self.server_key
            if (key is None) != (self.curve_secret is None):
                raise ConfigError("a link's server key (key= or --link-server-key) and "
                                  "--link-secret go together")  # fmt: skip
