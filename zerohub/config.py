"""The hub's configuration: one TOML file for ``zerohub serve --config FILE``.

One schema, typed frozen dataclasses: :class:`HubConfig` holds a table each for the
file server (:class:`FilesConfig`, ``[files]`` with ``[[files.publish]]`` mounts), the
broker (:class:`BrokerConfig`, ``[broker]``; its resource limits are the ``[limits]``
table of ``broker serve --config``, the fields of ``broker.engine.limits.Limits``), the
metrics endpoint (:class:`MetricsConfig`, ``[metrics]``), the web console
(:class:`ConsoleConfig`, ``[console]``) and logging (:class:`LoggingConfig`,
``[logging]``).  ``examples/hub.toml`` shows every key with its default.

Without a file the hub runs on the same embedded loopback defaults as before
(``zerohub.main`` builds the same objects from the command line).

Validation happens before anything is opened: an unknown key, a value of the wrong
type, a number out of range, an endpoint that is malformed, a published directory that
does not exist or a virtual path that leaves the root is a :class:`ConfigError` naming
the key (``files.publish[1].dir``) and, best effort, its line in the file.  ``tomllib``
gives no positions, so :func:`key_line` scans the text for the key under its table
header; a key it cannot place (inside an inline table spread over lines, say) is
reported without a line number.  Relative paths in the file are relative to the
file's own directory.
"""

from __future__ import annotations

import dataclasses
import math
import re
import tomllib
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker.engine.limits import Limits, LimitsError
from filemq.engine import DEFAULT_CHUNK_SIZE
from filemq.engine import DEFAULT_ENDPOINT as FILES_ENDPOINT
from filemq.paths import UnsafePathError, virtual_path
from zerohub import zmqkit
from zerohub.cli import UsageError, check_endpoint

__all__ = [
    "BROKER_ENDPOINT",
    "CONSOLE_ADDRESS",
    "METRICS_ADDRESS",
    "BrokerConfig",
    "ConfigError",
    "ConsoleConfig",
    "FilesConfig",
    "HubConfig",
    "LoggingConfig",
    "MetricsConfig",
    "PublishConfig",
    "key_line",
    "load",
    "parse",
]

#: Where the broker listens unless told otherwise (as ``broker serve``).
BROKER_ENDPOINT = "tcp://127.0.0.1:5680"
#: The metrics endpoint's address when it is switched on without one (Prometheus'
#: registered default port for exporters of this kind).
METRICS_ADDRESS = "127.0.0.1:9464"
#: The web console's address when it is switched on without one.
CONSOLE_ADDRESS = "127.0.0.1:9465"

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
LOG_FORMATS = ("text", "json")


class ConfigError(UsageError):
    """A configuration value is wrong: names the key and, when known, the file and line."""

    def __init__(self, key: str, message: str, *, path: str | None = None, line: int = 0):
        where = path or "config"
        if line:
            where += f":{line}"
        super().__init__(f"{where}: {key}: {message}" if key else f"{where}: {message}")
        self.key = key
        self.line = line


def _meta(
    *, low: float | None = None, high: float | None = None, choices: Sequence[str] = ()
) -> dict[str, Any]:
    return {"low": low, "high": high, "choices": tuple(choices)}


@dataclass(frozen=True, slots=True)
class PublishConfig:
    """One ``[[files.publish]]`` entry: a local directory published at a virtual path."""

    dir: Path
    at: str = "/"


@dataclass(frozen=True, slots=True)
class FilesConfig:
    """``[files]``: the FILEMQ server (the options of ``filemq serve``, same defaults)."""

    bind: str = FILES_ENDPOINT
    publish: tuple[PublishConfig, ...] = ()
    curve_secret: Path | None = None
    allow: Path | None = None
    insecure: bool = False
    wire: str = field(default="spec", metadata=_meta(choices=("spec", "czmq")))
    chunk_size: int = field(default=DEFAULT_CHUNK_SIZE, metadata=_meta(low=1, high=64 << 20))
    deny: tuple[str, ...] = ()
    client_ttl: float = field(default=30.0, metadata=_meta(low=0.1))
    max_clients: int = field(default=10_000, metadata=_meta(low=1))
    rescan: float = field(default=0.0, metadata=_meta(low=0))
    #: Bytes per second for all clients together (0: no cap).
    bwlimit: int = field(default=0, metadata=_meta(low=0))
    watch: bool = True
    poll: bool = False
    poll_interval: float = field(default=1.0, metadata=_meta(low=0.01))
    settle: float = field(default=0.05, metadata=_meta(low=0))
    #: Where the indexes persist ("" = $XDG_STATE_HOME/filemq); ``state = false``: nowhere.
    state_dir: Path | None = None
    state: bool = True
    #: gitignore lines every mount leaves out (``!PATTERN`` takes one back).
    exclude: tuple[str, ...] = ()
    exclude_from: tuple[Path, ...] = ()
    links: bool = True
    #: ``CHANNEL[/QUEUE]`` of the hub's own broker that gets a JSON event per file change
    #: (``filemq.broker_events``); "" = off.
    events: str = ""
    #: Events held while the broker does not take them; beyond it they are dropped.
    events_buffer: int = field(default=10_000, metadata=_meta(low=1))
    #: With a CURVE broker: the events client's ``.key_secret`` (its public key in the
    #: broker's ``allow`` folder).
    events_secret: Path | None = None


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """``[broker]``: the broker's front end (its limits are the top-level ``[limits]``)."""

    bind: str = BROKER_ENDPOINT
    curve_secret: Path | None = None
    allow: Path | None = None
    insecure: bool = False
    node_name: str = "zerohub"
    max_frame_size: int = field(default=16 << 20, metadata=_meta(low=4096, high=1 << 30))
    ping_interval: float = field(default=5.0, metadata=_meta(low=0.05))
    peer_timeout: float = field(default=15.0, metadata=_meta(low=0.1))
    max_connections: int = field(default=11_000, metadata=_meta(low=1))
    #: Keep the broker's saved messages and definitions in this folder (the durable
    #: log, as ``broker serve --data``); none: in memory only.
    data: Path | None = None


@dataclass(frozen=True, slots=True)
class FederationConfig:
    """``[federation]``: links of the hub's broker to other brokers (``broker serve
    --link``, ``broker.federation``); off unless ``links`` or ``federate``.  With a CURVE
    broker ``secret`` is also the federation client's key on it (allow its public key)."""

    links: tuple[str, ...] = ()
    federate: bool = False
    #: "" = kept in nothing: a random id per run (``broker serve --broker-id``).
    broker_id: str = ""
    depth: int = field(default=-1, metadata=_meta(low=-1))
    accept: tuple[str, ...] = ("*",)
    server_key: Path | None = None
    secret: Path | None = None


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    """``[metrics]``: Prometheus text on ``http://ADDRESS/metrics`` (off by default)."""

    enabled: bool = False
    address: str = METRICS_ADDRESS


@dataclass(frozen=True, slots=True)
class ConsoleConfig:
    """``[console]``: the web console on ``http://ADDRESS/`` (off by default)."""

    enabled: bool = False
    address: str = CONSOLE_ADDRESS
    #: Seconds between the page's refreshes.
    refresh: float = field(default=2.0, metadata=_meta(low=0.2, high=3600))
    #: The token actions need (``X-Zerohub-Token``); empty: a new one is made at each
    #: start and printed.  At least 16 characters.
    token: str = ""
    #: The ``Client-Token`` the console's broker connection presents: the broker's
    #: authorization decides what its actions may do.  Empty: none.
    broker_token: str = ""
    #: With a CURVE broker (``broker.curve_secret``): the console's own client
    #: certificate (``NAME.key_secret``, e.g. from ``zerohub keys``/``broker keygen``);
    #: its public half (``NAME.key``) must be in ``broker.allow``.  Without it the
    #: console of a CURVE broker shows the status but refuses actions (503).
    curve_secret: Path | None = None


@dataclass(frozen=True, slots=True)
class LoggingConfig:
    """``[logging]``: one setting for both services (``filemq.*`` and ``broker.*``)."""

    level: str = field(default="info", metadata=_meta(choices=LOG_LEVELS))
    format: str = field(default="text", metadata=_meta(choices=LOG_FORMATS))
    #: Append to this file instead of stderr.
    file: Path | None = None


@dataclass(frozen=True, slots=True)
class HubConfig:
    """The whole configuration (see the module docstring)."""

    files: FilesConfig = field(default_factory=FilesConfig)
    broker: BrokerConfig = field(default_factory=BrokerConfig)
    limits: Limits = field(default_factory=Limits)
    federation: FederationConfig = field(default_factory=FederationConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    console: ConsoleConfig = field(default_factory=ConsoleConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    #: The file it came from (None: the command line's defaults).
    source: Path | None = None


_SECTIONS: dict[str, type] = {
    "files": FilesConfig,
    "broker": BrokerConfig,
    "limits": Limits,
    "federation": FederationConfig,
    "metrics": MetricsConfig,
    "console": ConsoleConfig,
    "logging": LoggingConfig,
}


# -- line numbers (best effort) --------------------------------------------------------

_HEADER = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(?:#.*)?$")


def _bare(part: str) -> str:
    part = part.strip()
    if len(part) >= 2 and part[0] == part[-1] and part[0] in "\"'":
        return part[1:-1]
    return part


def key_line(text: str, key: str) -> int:
    """The line (1-based) where dotted ``key`` is set in TOML ``text``; 0 if not found.

    ``files.publish[1].dir`` is the ``dir =`` line of the second ``[[files.publish]]``
    table; a whole table (``metrics``) is its header line.  Best effort: a key inside
    an inline table or set with a dotted name is found when it starts its own line.
    """
    parts = [p for p in re.split(r"\.(?![^\[]*\])", key) if p]
    steps: list[tuple[str, int | None]] = []
    for p in parts:
        m = re.fullmatch(r"(.+?)\[(\d+)\]", p)
        steps.append((m.group(1), int(m.group(2))) if m else (p, None))
    names = [n for n, _ in steps]
    lines = text.splitlines()
    # the header of the deepest table the key lives in, counting [[array]] occurrences
    best_table, best_line = 0, 0
    for depth in range(len(steps), 0, -1):
        table = names[:depth]
        wanted = steps[depth - 1][1]
        seen = -1
        for number, line in enumerate(lines, 1):
            m = _HEADER.match(line)
            if not m:
                continue
            if [_bare(x) for x in m.group(1).split(".")] == table:
                seen += 1
                if wanted is None or seen == wanted:
                    best_table, best_line = depth, number
                    break
        if best_line:
            break
    rest = names[best_table:]
    if not rest:
        return best_line
    # the key's own line, between its table's header and the next header
    first = rest[0]
    pattern = re.compile(r"^\s*(?:\"|')?" + re.escape(first) + r"(?:\"|')?\s*[.=]")
    for number in range(best_line + 1 if best_line else 1, len(lines) + 1):
        line = lines[number - 1]
        if best_line and _HEADER.match(line):
            break
        if not best_line and _HEADER.match(line):
            break  # top-level keys come before the first header
        if pattern.match(line):
            return number
    return best_line


# -- checking values against the schema --------------------------------------------------


class _Checker:
    def __init__(self, text: str, path: str | None, base: Path) -> None:
        self.text = text
        self.path = path
        self.base = base

    def fail(self, key: str, message: str) -> ConfigError:
        return ConfigError(key, message, path=self.path, line=key_line(self.text, key))

    def section(self, cls: type, table: Any, where: str) -> Any:
        if not isinstance(table, dict):
            raise self.fail(where, f"expected a table, not {_kind(table)}")
        hints = typing.get_type_hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(table) - set(fields))
        if unknown:
            known = ", ".join(sorted(fields))
            raise self.fail(f"{where}.{unknown[0]}", f"unknown key (known: {known})")
        values = {
            name: self.value(hints[name], value, f"{where}.{name}", fields[name].metadata)
            for name, value in table.items()
        }
        return cls(**values)

    def value(self, hint: Any, value: Any, key: str, meta: Mapping[str, Any]) -> Any:
        origin = typing.get_origin(hint)
        args = typing.get_args(hint)
        if origin in (typing.Union, types.UnionType):
            inner = next(a for a in args if a is not type(None))
            return self.value(inner, value, key, meta)
        if origin is tuple:
            if not isinstance(value, list):
                raise self.fail(key, f"expected an array, not {_kind(value)}")
            return tuple(
                self.value(args[0], item, f"{key}[{i}]", meta) for i, item in enumerate(value)
            )
        if hint is PublishConfig:
            return self.publish(value, key)
        if hint is bool:
            if not isinstance(value, bool):
                raise self.fail(key, f"expected true or false, not {_kind(value)}")
            return value
        if hint is int or hint is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise self.fail(key, f"expected a number, not {_kind(value)}")
            if hint is int and not isinstance(value, int):
                raise self.fail(key, f"expected a whole number, not {value!r}")
            if not math.isfinite(value):
                raise self.fail(key, f"expected a finite number, not {value!r}")
            low, high = meta.get("low"), meta.get("high")
            if low is not None and value < low:
                raise self.fail(key, f"must be at least {low:g}, not {value!r}")
            if high is not None and value > high:
                raise self.fail(key, f"must be at most {high:g}, not {value!r}")
            return hint(value)
        if hint is str or hint is Path:
            if not isinstance(value, str):
                raise self.fail(key, f"expected a string, not {_kind(value)}")
            choices = meta.get("choices") or ()
            if choices and value not in choices:
                raise self.fail(key, f"must be one of {', '.join(choices)}, not {value!r}")
            if hint is Path:
                if not value:
                    raise self.fail(key, "expected a path, not an empty string")
                return self.base / Path(value).expanduser()
            return value
        raise AssertionError(f"no check for {hint!r}")  # a schema field without one

    def publish(self, value: Any, key: str) -> PublishConfig:
        if isinstance(value, dict) and "dir" not in value:
            raise self.fail(key, 'needs dir = "DIRECTORY"')
        entry: PublishConfig = self.section(PublishConfig, value, key)
        if not entry.dir.is_dir():
            what = "does not exist" if not entry.dir.exists() else "is not a directory"
            raise self.fail(f"{key}.dir", f"{entry.dir} {what}")
        try:
            at = virtual_path(entry.at)
        except UnsafePathError as exc:
            raise self.fail(f"{key}.at", str(exc)) from None
        return PublishConfig(entry.dir, at)

    def limits(self, table: Any) -> Limits:
        if not isinstance(table, dict):
            raise self.fail("limits", f"expected a table, not {_kind(table)}")
        known = {f.name for f in dataclasses.fields(Limits)}
        for name, value in table.items():  # each one alone: the error names its key
            if name not in known:
                names = ", ".join(sorted(known))
                raise self.fail(f"limits.{name}", f"unknown key (known: {names})")
            try:
                Limits.from_mapping({name: value})
            except LimitsError as exc:
                message = str(exc).removeprefix("limits: ").removeprefix(f"{name} ")
                raise self.fail(f"limits.{name}", message) from None
        return Limits.from_mapping(table)


def _kind(value: Any) -> str:
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string"}
    names.update({list: "an array", dict: "a table"})
    return names.get(type(value), type(value).__name__)


def parse(text: str, *, path: str | None = None, base: Path | None = None) -> HubConfig:
    """The configuration in TOML ``text`` (``path`` names it in errors; relative paths
    are taken from ``base``, default the current directory); ConfigError if wrong."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        m = re.search(r"\(at line (\d+), column \d+\)", message)
        line = int(m.group(1)) if m else 0
        raise ConfigError("", f"not valid TOML: {message}", path=path, line=line) from None
    checker = _Checker(text, path, base or Path())
    unknown = sorted(set(data) - set(_SECTIONS))
    if unknown:
        known = ", ".join(_SECTIONS)
        raise checker.fail(unknown[0], f"unknown table (known: {known})")
    parts: dict[str, Any] = {}
    for name, cls in _SECTIONS.items():
        if name not in data:
            continue
        if cls is Limits:
            parts[name] = checker.limits(data[name])
        else:
            parts[name] = checker.section(cls, data[name], name)
    config = HubConfig(**parts, source=Path(path) if path else None)
    return check(config, checker)


def check(config: HubConfig, checker: _Checker | None = None) -> HubConfig:
    """The checks across keys (endpoints, pairs of keys); ConfigError naming one."""
    checker = checker or _Checker("", None, Path())
    files, broker = config.files, config.broker
    for key, endpoint in (("files.bind", files.bind), ("broker.bind", broker.bind)):
        try:
            check_endpoint(endpoint, bind=True)
        except UsageError as exc:
            raise checker.fail(key, str(exc)) from None
    for name, part in (("files", files), ("broker", broker)):
        if (part.curve_secret is None) != (part.allow is None):
            raise checker.fail(f"{name}.curve_secret", f"{name}.allow must be set with it")
        try:
            zmqkit.check_bind(
                part.bind, curve=part.curve_secret is not None, insecure=part.insecure
            )
        except zmqkit.SecurityError as exc:
            message = str(exc).replace(
                "pass --curve-secret/--allow, or --insecure",
                "set curve_secret and allow, or insecure = true",
            )
            raise checker.fail(f"{name}.bind", message) from None
    if not files.publish:
        raise checker.fail("files.publish", "publish at least one directory ([[files.publish]])")
    seen: dict[str, int] = {}
    for i, entry in enumerate(files.publish):
        if entry.at in seen:
            raise checker.fail(
                f"files.publish[{i}].at", f"{entry.at} is published twice (entry {seen[entry.at]})"
            )
        seen[entry.at] = i
    for key, address in (
        ("metrics.address", config.metrics.address),
        ("console.address", config.console.address),
    ):
        try:
            split_address(address)
        except ValueError as exc:
            raise checker.fail(key, str(exc)) from None
    _check_patterns(files, checker)
    metrics, console = config.metrics, config.console
    if console.token and (len(console.token) < 16 or not console.token.isprintable()):
        raise checker.fail("console.token", "must be at least 16 printable characters")
    if (
        metrics.enabled
        and console.enabled
        and metrics.address == console.address
        and not metrics.address.endswith(":0")
    ):
        raise checker.fail("console.address", f"{console.address} is the metrics address too")
    if console.curve_secret is not None and broker.curve_secret is None:
        raise checker.fail(
            "console.curve_secret", "only with a CURVE broker (set broker.curve_secret)"
        )
    for i, virtual in enumerate(files.deny):
        try:
            virtual_path(virtual)
        except UnsafePathError as exc:
            raise checker.fail(f"files.deny[{i}]", str(exc)) from None
    return config


def _check_patterns(files: FilesConfig, checker: _Checker) -> None:
    from filemq.filters import FilterError, Filters, read_pattern_file

    for i, path in enumerate(files.exclude_from):
        try:
            read_pattern_file(path)
        except (FilterError, OSError) as exc:
            raise checker.fail(f"files.exclude_from[{i}]", str(exc)) from None
    for i, line in enumerate(files.exclude):
        try:
            Filters([line])
        except FilterError as exc:
            raise checker.fail(f"files.exclude[{i}]", str(exc)) from None


_LOOPBACK = ("127.", "::1", "localhost")


def split_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) on a loopback host; ValueError if not.

    The HTTP endpoints have no authentication yet: they listen on loopback only.
    """
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT (e.g. {METRICS_ADDRESS}), not {text!r}")
    if not host.startswith(_LOOPBACK):
        raise ValueError(f"{host} is not a loopback address (no authentication yet)")
    return host, int(port)


def load(path: str | Path) -> HubConfig:
    """The configuration in the TOML file ``path``; ConfigError (a usage error) if wrong."""
    file = Path(path)
    try:
        raw = file.read_bytes()
    except OSError as exc:
        raise ConfigError("", f"cannot read it: {exc.strerror}", path=str(path)) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError("", f"not UTF-8 ({exc.reason})", path=str(path)) from None
    return parse(text, path=str(path), base=file.parent)
