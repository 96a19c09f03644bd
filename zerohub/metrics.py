"""Prometheus metrics of the hub: ``GET /metrics`` on a loopback HTTP port.

Custom collectors (``prometheus_client``) read the services' live counters when a
scraper asks (:mod:`zerohub.status`): nothing is counted on the file server's or the
broker's hot paths for metrics' sake.  Off by default; ``zerohub serve --metrics``
(or ``[metrics] enabled = true``) serves on ``127.0.0.1:9464``.

Families (``_total`` ones are counters, the rest gauges):

FILEMQ (``zerohub_filemq_``): ``index_entries{mount}``, ``index_bytes{mount}``, ``clients``,
``sent_files_total``, ``sent_bytes_total``, ``resyncs_total`` (subscriptions
answered), ``rescans_total``, ``watcher_overflows_total``, and per subscriber
``subscriber_queued_files{client}`` (its lag: files queued for it, not sent yet).

Broker (``zerohub_broker_``): ``peers``, ``clients``, ``channels``, ``queues``,
``messages``, ``pending_acks``, ``in_flight``, ``pending_requests``, ``routers``;
``received_total`` (pushes), ``sent_total``, ``deliveries_total``, ``acks_total``,
``nacks_total``, ``timeouts_total``, ``removed_total``,
``dropped_deliveries_total``, ``errors_total``; per queue
``queue_messages{channel,queue}`` and ``queue_unacked{channel,queue}``, the counters
``queue_published_total{channel,queue}`` (pushed into it) and
``queue_delivered_total{channel,queue}`` (sent out of it; ``rate()`` of both are the
console's per-queue rates), per channel
``channel_consumers{channel}``; and the transport's ``frames_total{direction}`` and
``transport_events_total{event}`` (``refused``, ``bad_frames``, ``expired``,
``dropped_out``... by reason).  ``zerohub_broker_up`` is 0 when the statistics could
not be read at that scrape.

Federation (``zerohub_federation_``, when the hub's broker federates):
``forwarded_total``, ``confirmed_total``, ``forward_failures_total``,
``refused_by_peer_total``, ``received_total``, ``duplicates_total``, ``loops_total``,
``refused_total``, ``dropped_total``, ``bad_messages_total``, ``pending``, per linked
broker ``peer_up{peer}`` and ``peer_in_flight{peer}``.  File events
(``zerohub_file_events_``, with ``[files] events``): ``published_total``,
``dropped_total``, ``buffered``.

The broker's durable log (``zerohub serve --data DIR``, ``zerohub_store_``): gauges
``segments``, ``disk_bytes``, ``live_bytes``, ``live_records``, ``index_bytes``,
``pending_records``, ``recovered_records``, ``damaged``, ``compacting``; counters
``fsyncs_total``, ``fsync_seconds_total`` (their ratio is the mean fsync latency),
``batches_total`` and ``batch_records_total`` (their ratio is the mean group commit
size), ``compactions_total``.

Per-subscriber and per-queue series are capped at ``zerohub.status.MAX_LISTED`` each
(the most lagging / deepest first).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from broker.server.server import Server
from broker.store.log import LogStore
from filemq.live import LiveFileServer
from zerohub.httpd import HttpServer, Response
from zerohub.status import broker_status, files_status

__all__ = [
    "BrokerCollector",
    "FilesCollector",
    "LinksCollector",
    "StoreCollector",
    "exposition",
    "metrics_server",
    "registry",
]


class FilesCollector(Collector):
    """The FILEMQ server's figures, read at scrape time."""

    def __init__(self, live: LiveFileServer) -> None:
        self.live = live

    def collect(self) -> Iterator[Metric]:
        s = files_status(self.live)
        p = "zerohub_filemq_"
        index = GaugeMetricFamily(
            p + "index_entries", "Entries in a mount's index", labels=["mount"]
        )
        size = GaugeMetricFamily(
            p + "index_bytes", "Bytes of the files in a mount's index", labels=["mount"]
        )
        for mount in s["mounts"]:
            index.add_metric([mount["at"]], mount["files"])
            size.add_metric([mount["at"]], mount["bytes"])
        yield index
        yield size
        yield GaugeMetricFamily(p + "clients", "Clients with a session", value=s["clients"])
        for key, about in (
            ("sent_files", "Whole files sent to clients"),
            ("sent_bytes", "File content bytes sent to clients"),
            ("resyncs", "Subscriptions answered (each a resync of the client's path)"),
            ("rescans", "Rescans of published trees (asked, periodic or after an overflow)"),
            ("watcher_overflows", "Watcher queue overflows (each rescans every mount)"),
        ):
            yield CounterMetricFamily(p + key, about, value=s[key])
        lag = GaugeMetricFamily(
            p + "subscriber_queued_files",
            "Files queued for a subscriber, not sent yet (its lag)",
            labels=["client"],
        )
        for sub in s["subscribers"]:
            lag.add_metric([sub["client"]], sub["queued"])
        yield lag


_GAUGES = (
    ("peers", "Connections past the handshake"),
    ("clients", "Clients connected to the engine"),
    ("channels", "Channels"),
    ("queues", "Queues in all channels"),
    ("messages", "Messages waiting in all queues"),
    ("pending_acks", "Deliveries waiting for an acknowledgement"),
    ("in_flight", "Deliveries in consumers' flow-control windows"),
    ("pending_requests", "Direct requests waiting for a response"),
    ("routers", "Routers"),
)
_COUNTERS = (
    ("received", "Messages pushed into queues"),
    ("sent", "Messages sent out of queues"),
    ("deliveries", "Deliveries to consumers"),
    ("acks", "Acknowledgements from consumers"),
    ("nacks", "Negative acknowledgements from consumers"),
    ("timeouts", "Acknowledgements that timed out"),
    ("removed", "Messages removed from queues (purged, expired)"),
    ("dropped_deliveries", "Deliveries dropped (the consumer was gone)"),
    ("errors", "Errors the engine answered"),
)


class BrokerCollector(Collector):
    """The broker's figures (``Server.stats``), read at scrape time."""

    def __init__(self, server: Server, read: Callable[[], dict[str, Any]] | None = None) -> None:
        self.server = server
        #: How the figures are read (the hub shares one read with its console).
        self.read = read or (lambda: broker_status(server))

    def collect(self) -> Iterator[Metric]:
        s = self.read()
        p = "zerohub_broker_"
        ok = "error" not in s
        yield GaugeMetricFamily(p + "up", "1 if the statistics could be read", value=int(ok))
        if not ok:
            return
        for key, about in _GAUGES:
            yield GaugeMetricFamily(p + key, about, value=s[key])
        for key, about in _COUNTERS:
            yield CounterMetricFamily(p + key, about, value=s[key])
        server = s["server"]
        frames = CounterMetricFamily(p + "frames", "Frames", labels=["direction"])
        frames.add_metric(["in"], server.get("frames_in", 0))
        frames.add_metric(["out"], server.get("frames_out", 0))
        yield frames
        events = CounterMetricFamily(
            p + "transport_events", "Transport events by kind (refused...)", labels=["event"]
        )
        for name, value in sorted(server.items()):
            if name not in ("frames_in", "frames_out") and isinstance(value, int):
                events.add_metric([name], value)
        yield events
        labels = ("channel", "queue")
        depth = Rows(p + "queue_messages", "Messages in a queue", "gauge", labels)
        unacked = Rows(
            p + "queue_unacked", "Deliveries of a queue not acknowledged yet", "gauge", labels
        )
        published = Rows(p + "queue_published", "Messages pushed into a queue", "counter", labels)
        delivered = Rows(
            p + "queue_delivered", "Messages sent out of a queue to consumers", "counter", labels
        )
        add_depth, add_unacked = depth.rows.append, unacked.rows.append
        add_published, add_delivered = published.rows.append, delivered.rows.append
        for q in s["queue_list"]:  # one pass, four families
            names = (q["channel"], str(q["queue"]))
            add_depth((names, q["messages"]))
            add_unacked((names, q["unacked"]))
            add_published((names, q["received"]))
            add_delivered((names, q["sent"]))
        yield depth
        yield unacked
        yield published
        yield delivered
        consumers = Rows(p + "channel_consumers", "Consumers of a channel", "gauge", ("channel",))
        consumers.rows.extend(((c["name"],), c["consumers"]) for c in s["channel_list"])
        yield consumers


class Rows(Metric):
    """A gauge or counter family of many label sets (per queue, per channel), kept as
    rows of (label values, value): the hub's writer (:func:`exposition`) writes them
    straight from the rows (each label set's text kept from the last scrape); their
    ``samples``, what ``generate_latest`` and other readers of a registry see, are made
    only when asked for."""

    def __init__(self, name: str, documentation: str, kind: str, labels: tuple[str, ...]):
        super().__init__(name, documentation, kind)
        self.label_names = labels
        self.rows: list[tuple[tuple[str, ...], float]] = []

    @property
    def samples(self) -> list[Sample]:
        name = self.name + "_total" if self.type == "counter" else self.name
        names = self.label_names
        return [Sample(name, dict(zip(names, v, strict=True)), x) for v, x in self.rows]

    @samples.setter
    def samples(self, _samples: list[Sample]) -> None:
        """(``Metric.__init__`` sets an empty list: the rows stand for it.)"""


#: What a :class:`LinksCollector` reads: the federation's and the file events'
#: statistics at scrape time (None when that part is off).
StatsSource = Callable[[], dict[str, Any] | None]


class LinksCollector(Collector):
    """The broker federation's counters (``zerohub_federation_``) and the file events'
    (``zerohub_file_events_``), read at scrape time."""

    _FEDERATION_COUNTERS = (
        ("forwarded", "Forwards sent to linked brokers, resends included"),
        ("confirmed", "Forwards a linked broker confirmed"),
        ("forward_failures", "Forwards that failed and were sent again"),
        ("refused_by_peer", "Forwards a linked broker refused for good"),
        ("received", "Messages from linked brokers pushed locally"),
        ("duplicates", "Messages from linked brokers already seen (dropped)"),
        ("loops", "Messages that had passed this broker already (dropped)"),
        ("refused", "Messages from linked brokers refused"),
        ("dropped", "Deliveries without acknowledge dropped: max pending reached"),
        ("bad_messages", "Malformed federation messages from peers"),
    )

    def __init__(self, federation: StatsSource, events: StatsSource) -> None:
        self.federation = federation
        self.events = events

    def collect(self) -> Iterator[Metric]:
        fed = self.federation()
        if fed is not None:
            p = "zerohub_federation_"
            for name, about in self._FEDERATION_COUNTERS:
                yield CounterMetricFamily(p + name, about, value=fed[name])
            yield GaugeMetricFamily(p + "pending", "Deliveries waiting for peers",
                                    value=fed["pending"])  # fmt: skip
            up = GaugeMetricFamily(p + "peer_up", "1 when a linked broker answers",
                                   labels=["peer"])  # fmt: skip
            flight = GaugeMetricFamily(p + "peer_in_flight", "Forwards in flight",
                                       labels=["peer"])  # fmt: skip
            for peer, state in sorted(fed["peers"].items()):
                up.add_metric([peer], int(state["up"]))
                flight.add_metric([peer], state["in_flight"])
            yield up
            yield flight
        events = self.events()
        if events is not None:
            p = "zerohub_file_events_"
            yield CounterMetricFamily(p + "published", "File events the broker took",
                                      value=events["published"])  # fmt: skip
            yield CounterMetricFamily(p + "dropped", "File events dropped (buffer full)",
                                      value=events["dropped"])  # fmt: skip
            yield GaugeMetricFamily(p + "buffered", "File events waiting for the broker",
                                    value=events["buffered"])  # fmt: skip


_STORE_GAUGES = (
    ("segments", "segments", "Segment files of the log"),
    ("disk_bytes", "disk_bytes", "Bytes of the segment files"),
    ("live_bytes", "live_bytes", "Bytes of the records still live"),
    ("live_records", "live_records", "Records still live (saved messages not removed)"),
    ("index_bytes", "index_bytes", "Bytes of memory the log's index takes"),
    ("pending", "pending_records", "Records waiting for the writer"),
    ("recovered_records", "recovered_records", "Records recovered when the store opened"),
)
_STORE_COUNTERS = (
    ("syncs", "fsyncs", "fsyncs of segment files"),
    ("batches", "batches", "Write batches (group commits)"),
    ("batch_records", "batch_records", "Records written in batches (/ batches: mean group size)"),
    ("sync_seconds", "fsync_seconds", "Seconds spent in fsyncs after batches (/ fsyncs: latency)"),
    ("compactions", "compactions", "Segments compacted (and deleted)"),
)


class StoreCollector(Collector):
    """The broker's durable log (``LogStore.stats()``), read at scrape time."""

    def __init__(self, store: LogStore) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        s = self.store.stats()
        p = "zerohub_store_"
        for key, name, about in _STORE_GAUGES:
            yield GaugeMetricFamily(p + name, about, value=getattr(s, key))
        yield GaugeMetricFamily(p + "damaged", "Damage found at recovery", value=len(s.damage))
        yield GaugeMetricFamily(
            p + "compacting", "1 while a compaction runs or is due", value=int(s.compacting)
        )
        for key, name, about in _STORE_COUNTERS:
            yield CounterMetricFamily(p + name, about, value=getattr(s, key))


def registry(
    files: LiveFileServer | None,
    broker: Server | None,
    store: LogStore | None = None,
    *,
    broker_read: Callable[[], dict[str, Any]] | None = None,
    links: LinksCollector | None = None,
) -> CollectorRegistry:
    """A registry of the hub's collectors only (no process or platform collectors);
    ``broker_read`` reads the broker's figures (default: ``broker_status(broker)``)."""
    out = CollectorRegistry(auto_describe=False)
    if files is not None:
        out.register(FilesCollector(files))
    if broker is not None:
        out.register(BrokerCollector(broker, broker_read))
    if store is not None:
        out.register(StoreCollector(store))
    if links is not None:
        out.register(links)
    return out


def _label_value(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return value


def exposition(metrics: CollectorRegistry) -> bytes:
    """The registry in Prometheus' text format, as ``generate_latest`` writes it.

    A leaner writer for what the hub's collectors yield (gauges and counters, label
    names that need no escaping, no timestamps): ``generate_latest`` validates and
    escapes every label name of every sample again.  Anything else (another family
    type, a timestamp, a label name to escape) is left to ``generate_latest``.
    """
    families = list(metrics.collect())
    out = _write(families)
    return out if out is not None else generate_latest(metrics)


#: Label sets already written, as their text (``{k="v",...}``): a scrape writes the same
#: thousands of per-queue label sets as the one before.  Emptied past _LABEL_CACHE_MAX.
_label_texts: dict[tuple[tuple[str, str], ...], str] = {}
_LABEL_CACHE_MAX = 50_000


def _number(value: float) -> str:
    """``floatToGoString``, quicker for the integers most samples are (below 10**6: Go
    writes larger ones with an exponent, as the library does)."""
    if type(value) is int and -(10**15) < value < 1_000_000:
        return f"{value}.0"
    return floatToGoString(value)


def _labels(labels: dict[str, str]) -> str | None:
    key = tuple(labels.items())
    text = _label_texts.get(key)
    if text is None:
        if any(not _LABEL_NAME.fullmatch(k) for k in labels):
            return None
        pairs = sorted(key) if len(key) > 1 else key
        text = "{" + ",".join(f'{k}="{_label_value(v)}"' for k, v in pairs) + "}"
        if len(_label_texts) >= _LABEL_CACHE_MAX:
            _label_texts.clear()
        _label_texts[key] = text
    return text


def _write(families: list[Metric]) -> bytes | None:
    out: list[str] = []
    append = out.append
    number = _number
    texts = _label_texts
    for family in families:
        kind = family.type
        if kind not in ("counter", "gauge"):
            return None
        name = family.name + "_total" if kind == "counter" else family.name
        about = family.documentation.replace("\\", "\\\\").replace("\n", "\\n")
        append(f"# HELP {name} {about}\n# TYPE {name} {kind}\n")
        if type(family) is Rows:
            if not _write_rows(family, name, append):
                return None
            continue
        for sample in family.samples:
            if sample.timestamp is not None or sample.exemplar is not None:
                return None
            labels = sample.labels
            if not labels:
                append(f"{sample.name} {number(sample.value)}\n")
                continue
            text = texts.get(tuple(labels.items())) or _labels(labels)
            if text is None:
                return None
            append(f"{sample.name}{text} {number(sample.value)}\n")
    return "".join(out).encode("utf-8")


def _write_rows(family: Rows, name: str, append: Callable[[str], None]) -> bool:
    """The lines of a :class:`Rows` family; False if a label name needs escaping."""
    names = family.label_names
    texts = _row_texts.get(names)
    if texts is None:
        if any(not _LABEL_NAME.fullmatch(k) for k in names):
            return False
        texts = _row_texts[names] = {}
    order = sorted(range(len(names)), key=names.__getitem__)
    number = _number
    for values, value in family.rows:
        text = texts.get(values)
        if text is None:
            pairs = ",".join(f'{names[i]}="{_label_value(values[i])}"' for i in order)
            text = "{" + pairs + "}"
            if len(texts) >= _LABEL_CACHE_MAX:
                texts.clear()
            texts[values] = text
        append(f"{name}{text} {number(value)}\n")
    return True


#: The label texts of :class:`Rows` families, per tuple of label names, by label values.
_row_texts: dict[tuple[str, ...], dict[tuple[str, ...], str]] = {}

_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def metrics_server(address: tuple[str, int], metrics: CollectorRegistry) -> HttpServer:
    """An :class:`HttpServer` answering ``/metrics`` (and ``/`` with a pointer to it)."""

    def scrape() -> Response:
        return Response(exposition(metrics), CONTENT_TYPE_LATEST)

    def index() -> Response:
        return Response(b"zerohub metrics: /metrics\n")

    return HttpServer("metrics", address, {"/metrics": scrape, "/": index})
