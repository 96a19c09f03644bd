"""The options of the ``zerohub`` Spark data source, checked once on the driver.

Spark hands a data source its ``.option(key, value)`` pairs as text; names are matched
case-insensitively.  Every option has a documented default; a wrong one is an
:class:`OptionError` naming it, raised when the query is planned (before any task runs).

Connection (reader and writer):

==================  =========================  ==========================================
option              default                    meaning
==================  =========================  ==========================================
endpoint            ``tcp://127.0.0.1:5680``   the broker
channel             (required)                 the channel
queue               (required)                 the queue id in the channel (0..65535)
serverKey           none                       CURVE: the broker's public key file
clientCert          none                       CURVE: this client's secret key file
                                               (``NAME.key_secret``; with ``serverKey``)
timeout             ``10``                     seconds a request waits for its answer
==================  =========================  ==========================================

Reader: ``startingOffsets`` (``earliest``: the oldest message the queue holds, the
default; ``latest``: only messages pushed after the query started; or a sequence number:
from that one on), ``maxRowsPerTrigger`` (most sequence numbers per micro-batch; default
none: everything available), ``rowsPerPartition`` (sequence numbers per Spark partition,
default 10,000: a micro-batch of 50,000 is read by 5 tasks), ``browseLimit`` (most
messages per browse request, default and most 10,000; fewer once the broker's reply size
is seen to hold fewer), ``release`` (``true``: Spark's commit of a
micro-batch releases its messages on the broker; the queue needs ``AllowRelease``;
default ``false``).

Writer: ``channel`` and ``queue`` say where every row goes; without them, each row's
``channel``/``queue`` columns do (the options win when both are there, as the ``topic``
option of Spark's Kafka sink).  ``maxInFlight`` (pushes awaiting the broker's
acknowledge per task, default 1,000), ``writeId`` (the stem of the message ids a
write derives, at most 100 characters; default: a batch write draws a random one, shared
by every attempt of its tasks but not by another job; a streaming write uses the
query's id, kept in its checkpoint).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from broker.protocol import DEFAULT_ENDPOINT
from broker.sequence import MAX_BROWSE_LIMIT

__all__ = [
    "EARLIEST",
    "LATEST",
    "ConnectOptions",
    "OptionError",
    "ReadOptions",
    "WriteOptions",
]

EARLIEST = "earliest"
LATEST = "latest"
DEFAULT_TIMEOUT = 10.0
DEFAULT_ROWS_PER_PARTITION = 10_000
DEFAULT_MAX_IN_FLIGHT = 1_000
MAX_QUEUE_ID = 0xFFFF
_MAX_WRITE_ID = 100  # characters (message ids add ":BATCH:PARTITION:ROW")


class OptionError(ValueError):
    """An option of the zerohub data source is missing or wrong."""


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items() if v is not None}


def _required(options: dict[str, str], name: str) -> str:
    value = options.get(name.lower(), "").strip()
    if not value:
        raise OptionError(f"zerohub: option {name!r} is required")
    return value


def _int(
    options: dict[str, str], name: str, default: int | None, low: int, high: int
) -> int | None:
    text = options.get(name.lower())
    if text is None or text.strip() == "":
        return default
    try:
        value = int(text.strip())
    except ValueError:
        raise OptionError(f"zerohub: option {name!r} must be an integer, not {text!r}") from None
    if not low <= value <= high:
        raise OptionError(f"zerohub: option {name!r} must be {low}..{high}, not {value}")
    return value


def _bool(options: dict[str, str], name: str) -> bool:
    text = options.get(name.lower(), "false").strip().lower()
    if text not in ("true", "false"):
        raise OptionError(f"zerohub: option {name!r} must be true or false, not {text!r}")
    return text == "true"


@dataclass(frozen=True, slots=True)
class ConnectOptions:
    endpoint: str
    channel: str
    queue: int
    server_key: str | None
    client_cert: str | None
    timeout: float

    @classmethod
    def parse(cls, raw: Mapping[str, str], *, target: bool = True) -> ConnectOptions:
        """``target=False`` (the sink): ``channel`` and ``queue`` may be left out (each
        row's ``channel``/``queue`` columns then say where it goes): "" and -1."""
        from zerohub.cli import CommandError, check_endpoint

        options = _lower(raw)
        endpoint = options.get("endpoint", DEFAULT_ENDPOINT).strip()
        try:
            check_endpoint(endpoint)
        except CommandError as exc:
            raise OptionError(f"zerohub: option 'endpoint': {exc}") from None
        channel = _required(options, "channel") if target else options.get("channel", "").strip()
        queue = _int(options, "queue", None if target else -1, 0, MAX_QUEUE_ID)
        if queue is None:
            raise OptionError("zerohub: option 'queue' is required")
        server_key = options.get("serverkey") or None
        client_cert = options.get("clientcert") or None
        if (server_key is None) != (client_cert is None):
            raise OptionError("zerohub: options 'serverKey' and 'clientCert' go together")
        text = options.get("timeout", str(DEFAULT_TIMEOUT))
        try:
            timeout = float(text)
        except ValueError:
            raise OptionError(f"zerohub: option 'timeout' must be seconds, not {text!r}") from None
        if not timeout > 0:
            raise OptionError("zerohub: option 'timeout' must be above 0")
        return cls(endpoint, channel, queue, server_key, client_cert, timeout)


@dataclass(frozen=True, slots=True)
class ReadOptions:
    connect: ConnectOptions
    #: EARLIEST, LATEST, or the first sequence number to read
    starting: str | int
    max_rows_per_trigger: int | None
    rows_per_partition: int
    browse_limit: int
    release: bool

    @classmethod
    def parse(cls, raw: Mapping[str, str]) -> ReadOptions:
        options = _lower(raw)
        text = options.get("startingoffsets", EARLIEST).strip().lower()
        starting: str | int
        if text in (EARLIEST, LATEST):
            starting = text
        else:
            first = _int({"startingoffsets": text}, "startingOffsets", None, 1, 2**63 - 1)
            assert first is not None
            starting = first
        big = 2**31 - 1
        max_rows = _int(options, "maxRowsPerTrigger", None, 1, big)
        per_partition = _int(options, "rowsPerPartition", DEFAULT_ROWS_PER_PARTITION, 1, big)
        browse = _int(options, "browseLimit", MAX_BROWSE_LIMIT, 1, MAX_BROWSE_LIMIT)
        assert per_partition is not None and browse is not None
        return cls(
            ConnectOptions.parse(raw),
            starting,
            max_rows,
            per_partition,
            browse,
            _bool(options, "release"),
        )


@dataclass(frozen=True, slots=True)
class WriteOptions:
    connect: ConnectOptions
    max_in_flight: int
    write_id: str | None

    @classmethod
    def parse(cls, raw: Mapping[str, str]) -> WriteOptions:
        options = _lower(raw)
        in_flight = _int(options, "maxInFlight", DEFAULT_MAX_IN_FLIGHT, 1, 100_000)
        assert in_flight is not None
        write_id = options.get("writeid", "").strip() or None
        if write_id is not None and len(write_id) > _MAX_WRITE_ID:
            raise OptionError(f"zerohub: option 'writeId' is longer than {_MAX_WRITE_ID}")
        return cls(ConnectOptions.parse(raw, target=False), in_flight, write_id)
