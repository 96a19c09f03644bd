"""What the hub is doing, read from its live counters: one source for metrics and console.

:func:`files_status` reads a :class:`~filemq.live.LiveFileServer` (``FileServer.stats``)
and :func:`broker_status` a broker :class:`~broker.server.server.Server`
(``Server.stats``: the transport's counters and the engine's statistics, the figures
``broker stats`` prints).  Both are called from HTTP threads while the services run;
they only read, and a table changed during the read is read again (at most
``_TRIES`` times; then the figures it could not read are left out and ``error`` says
why).  Both return JSON-able dicts; lists are cut at a documented number of entries
(``truncated`` says how many were left out) so that a hub with many subscribers or
queues answers in bounded size.  The broker's connected clients (``client_list``) are
listed by the engine, at most ``Limits.max_listed_clients`` (500; oldest connections
first); ``clients_more`` says how many more are connected.
"""

from __future__ import annotations

import time
from typing import Any

from broker.server.server import Server
from filemq.live import LiveFileServer

__all__ = ["MAX_LISTED", "broker_status", "files_status"]

#: Subscribers, and queues, listed at most (the most lagging / deepest first).
MAX_LISTED = 1000
_TRIES = 5


def files_status(live: LiveFileServer) -> dict[str, Any]:
    """The file server's figures (see the module docstring)."""
    server = live.server
    stats = server.stats()
    now = time.monotonic()
    subscribers = sorted(stats.subscribers, key=lambda s: (-s.queued, s.client))
    mounts = [
        {
            "at": m.virtual,
            "dir": str(m.directory),
            "files": stats.index_files.get(m.virtual, 0),
            "bytes": _published_bytes(server.indexes.get(m.virtual)),
        }
        for m in server.mounts
    ]
    return {
        "endpoint": server.endpoint,
        "mounts": mounts,
        "files": sum(stats.index_files.values()),
        "bytes": sum(m["bytes"] for m in mounts),
        "clients": stats.clients,
        "sent_files": stats.sent_files,
        "sent_bytes": stats.sent_bytes,
        "resyncs": stats.resyncs,
        "rescans": stats.rescans,
        "watcher_overflows": live.overflows,
        "watching": live.publisher is not None,
        "subscribers": [
            {
                "client": s.client,
                "paths": list(s.paths),
                "queued": s.queued,
                "sent_files": s.sent_files,
                "sent_bytes": s.sent_bytes,
                "connected_s": round(max(0.0, now - s.connected_at), 1),
            }
            for s in subscribers[:MAX_LISTED]
        ],
        "truncated": max(0, len(subscribers) - MAX_LISTED),
    }


def _published_bytes(index: Any) -> int:
    """The size of the files a mount's index holds (a copy of its entries is summed)."""
    if index is None:
        return 0
    return sum(entry.size for entry in index)


_TOTALS = (
    "clients",
    "channels",
    "queues",
    "messages",
    "pending_acks",
    "in_flight",
    "pending_requests",
    "routers",
    "received",
    "sent",
    "deliveries",
    "acks",
    "nacks",
    "timeouts",
    "removed",
    "dropped_deliveries",
    "errors",
    "unmatched_acks",
)


def _broker_stats(server: Server) -> dict[str, Any]:
    error = "no statistics"
    for _ in range(_TRIES):
        try:
            stats = server.stats()
        except RuntimeError as exc:  # a table of the transport changed while copied
            error = str(exc)
            continue
        engine = stats.get("engine")
        if isinstance(engine, dict) and "error" not in engine:
            return stats
        error = str(engine.get("error")) if isinstance(engine, dict) else error
    return {"error": error}


def broker_status(server: Server) -> dict[str, Any]:
    """The broker's figures (see the module docstring)."""
    stats = _broker_stats(server)
    out: dict[str, Any] = {"endpoint": server.endpoint}
    if "error" in stats:
        out["error"] = stats["error"]
        return out
    engine: dict[str, Any] = stats["engine"]
    out["node"] = engine.get("node")
    out["peers"] = stats.get("peers", 0)
    out["server"] = dict(stats.get("server") or {})
    for key in _TOTALS:
        out[key] = int(engine.get(key) or 0)
    queues = []
    channels = []
    for channel in engine.get("channel_list") or ():
        channels.append({"name": channel["name"], "consumers": channel["consumers"]})
        for q in channel.get("queues") or ():
            queues.append(
                {
                    "channel": channel["name"],
                    "queue": q.get("Id"),
                    "status": q.get("Status"),
                    "messages": int(q.get("Messages") or 0) + int(q.get("PriorityMessages") or 0),
                    "unacked": int(q.get("PendingAcknowledges") or 0),
                    "received": int(q.get("ReceivedMessages") or 0),
                    "sent": int(q.get("SentMessages") or 0),
                    "consumers": channel["consumers"],
                }
            )
    queues.sort(key=lambda q: (-q["messages"], q["channel"], str(q["queue"])))
    channels.sort(key=lambda c: c["name"])
    out["channel_list"] = channels[:MAX_LISTED]
    out["queue_list"] = queues[:MAX_LISTED]
    out["truncated"] = max(0, len(queues) - MAX_LISTED) + max(0, len(channels) - MAX_LISTED)
    out["client_list"] = _client_rows(engine.get("client_list") or (), server.clock())
    # the engine lists at most Limits.max_listed_clients (oldest connections first)
    out["clients_more"] = max(0, out["clients"] - len(out["client_list"]))
    return out


def _client_rows(listed: Any, now: float) -> list[dict[str, Any]]:
    """The engine's ``client_list`` for the console: who, from where, since when
    (``connected_s``), in which channels, and its deliveries in flight."""
    return [
        {
            "id": c.get("Id"),
            "name": c.get("Name"),
            "type": c.get("Type"),
            "address": c.get("Address"),
            "connected_s": round(max(0.0, now - float(c.get("ConnectedAt") or now)), 1),
            "channels": list(c.get("Channels") or ()),
            "unacked": int(c.get("Unacked") or 0),
            "unsent": int(c.get("Unsent") or 0),
        }
        for c in listed
    ]
