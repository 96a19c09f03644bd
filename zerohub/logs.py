"""Logging of the hub: one setting for both services (``filemq.*`` and ``broker.*``).

``text`` lines are ``LEVEL logger: message``, as every zerohub command prints them;
``json`` lines are one object each (``time`` in UTC ISO 8601, ``level``, ``logger``,
``message``, and ``error`` with the exception's type and text when there is one), for
a log collector.  ``file``: appended to instead of stderr (created if missing; a file
that cannot be opened is an error before anything runs).
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from pathlib import Path

__all__ = ["JsonFormatter", "configure"]

TEXT_FORMAT = "%(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            out["error"] = f"{type(exc).__name__}: {exc}"
        return json.dumps(out, ensure_ascii=False, default=str)


def configure(level: int, fmt: str = "text", file: Path | None = None) -> logging.Handler:
    """Send every logger's records at ``level`` and above to stderr or ``file``, as
    ``fmt`` (``text`` or ``json``); replaces the root logger's handlers.  OSError if
    ``file`` cannot be opened."""
    handler: logging.Handler
    if file is None:
        handler = logging.StreamHandler(sys.stderr)
    else:
        handler = logging.FileHandler(file, encoding="utf-8")
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    elif fmt == "text":
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    else:
        raise ValueError(f"unknown log format {fmt!r}")
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(level)
    return handler
