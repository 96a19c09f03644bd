"""What a FILEMQ mirror reports as it applies changes: :class:`MirrorEvent`.

``filemq.client.SyncClient`` (and so ``filemq.subscriber.Subscriber`` and
``filemq subscribe --json``) emits one event per change applied to DEST:

=================== ==========================================================
``kind``            meaning
=================== ==========================================================
``create``          ``name`` was written (new or replaced), verified, renamed
                    into place; ``size`` and ``sha1`` describe it
``delete``          ``name`` was removed from DEST
``resync-complete`` DEST matched the server's ``path`` when the resync ended
                    (after every (re)connection); live changes follow
``disconnected``    the connection was lost or refused; ``detail`` says why; the
                    subscriber reconnects (with backoff) and resyncs
=================== ==========================================================

``name`` is relative to DEST ('/'-separated; empty for the last two kinds),
``path`` the local file (``create``/``delete``), ``time`` the wall-clock time
(``time.time()``) when the change was applied.  :meth:`MirrorEvent.to_json`
gives the ``--json`` line: one JSON object with these keys.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from enum import StrEnum

__all__ = ["EventKind", "MirrorEvent"]


class EventKind(StrEnum):
    CREATE = "create"
    DELETE = "delete"
    RESYNC_COMPLETE = "resync-complete"
    DISCONNECTED = "disconnected"


@dataclass(frozen=True, slots=True)
class MirrorEvent:
    """One change applied to a mirror (see the module doc for the kinds)."""

    kind: EventKind
    time: float
    name: str = ""
    path: str = ""
    size: int = 0
    sha1: str = ""
    detail: str = ""

    def to_json(self) -> str:
        """One line of ``filemq subscribe --json`` output (no newline)."""
        fields = asdict(self)
        fields["kind"] = str(self.kind)
        return json.dumps(fields, ensure_ascii=False, separators=(",", ":"))
