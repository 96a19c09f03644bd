"""Read a running hub's FILEMQ figures over its HTTP front doors (``filemq status URL``).

A FILEMQ server says nothing of its subscribers on the FILEMQ wire; the hub that runs it
(``zerohub serve``) publishes its figures on loopback HTTP.  :func:`files_status` asks
``URL/api/status`` (the web console: the whole picture) and, when that is not there,
``URL/metrics`` (the Prometheus endpoint: the same figures, see :mod:`zerohub.metrics`,
without the mounts' directories and the subscribers' paths).  The answer has the shape of
:func:`zerohub.status.files_status`.

This module imports neither ``filemq`` nor ``broker``: the ``filemq`` command line may
use it.  Errors: :class:`StatusError`, with ``refused`` set when the hub turned the
request away (HTTP 401, 403, 421).
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit

__all__ = ["MAX_ANSWER", "StatusError", "check_url", "files_status"]

#: Octets of an answer read at most (a status lists 1000 subscribers at most).
MAX_ANSWER = 16 << 20


class StatusError(Exception):
    """The status could not be read; ``refused``: the hub turned the request away."""

    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


def check_url(text: str) -> str:
    """``http://HOST:PORT`` (a path after it is ignored); ValueError if malformed."""
    parts = urlsplit(text)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "http" or not parts.hostname or port is None:
        raise ValueError(f"expected http://HOST:PORT (the hub's console or metrics), not {text!r}")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"http://{host}:{port}"


def _get(url: str, timeout: float) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            body = answer.read(MAX_ANSWER + 1)
            return answer.status, answer.headers.get("Content-Type", ""), body
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), b""
    except (TimeoutError, urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, TimeoutError | socket.timeout):
            reason = f"no answer within {timeout:g} s"
        raise StatusError(f"cannot read {url}: {reason}") from None


def _checked(url: str, status: int, body: bytes) -> None:
    if status in (401, 403, 421):
        raise StatusError(f"{url}: the hub refused the request (HTTP {status})", refused=True)
    if status != 200:
        raise StatusError(f"{url}: HTTP {status}")
    if len(body) > MAX_ANSWER:
        raise StatusError(f"{url}: the answer is over {MAX_ANSWER} octets")


def files_status(url: str, timeout: float = 10.0) -> dict[str, Any]:
    """The FILEMQ figures of the hub at ``url`` (see the module docstring)."""
    base = check_url(url)
    status, _kind, body = _get(base + "/api/status", timeout)
    if status != 404:
        _checked(base + "/api/status", status, body)
        try:
            files = json.loads(body)["files"]
        except (ValueError, KeyError, TypeError):
            raise StatusError(f"{base}/api/status: not a zerohub status") from None
        if not isinstance(files, dict):
            raise StatusError(f"{base}/api/status: not a zerohub status")
        return files
    status, _kind, body = _get(base + "/metrics", timeout)
    _checked(base + "/metrics", status, body)
    return _from_metrics(base, body)


def _from_metrics(base: str, body: bytes) -> dict[str, Any]:
    from prometheus_client.parser import text_string_to_metric_families

    try:
        samples = [
            (s.name, s.labels, s.value)
            for family in text_string_to_metric_families(body.decode("utf-8"))
            for s in family.samples
        ]
    except (ValueError, UnicodeDecodeError):
        raise StatusError(f"{base}/metrics: not Prometheus text") from None
    p = "zerohub_filemq_"
    plain = {
        name[len(p) :]: value
        for name, labels, value in samples
        if not labels and name.startswith(p)
    }
    if "clients" not in plain:
        raise StatusError(f"{base}/metrics: no FILEMQ figures (not a zerohub hub)")
    mounts: dict[str, dict[str, Any]] = {}
    subscribers = []
    for name, labels, value in samples:
        if name in (p + "index_entries", p + "index_bytes"):
            mount = mounts.setdefault(labels["mount"], {"at": labels["mount"], "dir": None})
            mount["files" if name.endswith("entries") else "bytes"] = int(value)
        elif name == p + "subscriber_queued_files":
            subscribers.append({"client": labels["client"], "queued": int(value)})

    def total(key: str) -> int:
        return int(plain.get(key + "_total", plain.get(key, 0)))

    listed = sorted(mounts.values(), key=lambda m: str(m["at"]))
    return {
        "mounts": listed,
        "files": sum(int(m.get("files", 0)) for m in listed),
        "bytes": sum(int(m.get("bytes", 0)) for m in listed),
        "clients": total("clients"),
        "sent_files": total("sent_files"),
        "sent_bytes": total("sent_bytes"),
        "resyncs": total("resyncs"),
        "rescans": total("rescans"),
        "watcher_overflows": total("watcher_overflows"),
        "subscribers": sorted(subscribers, key=lambda s: (-s["queued"], s["client"])),
    }
