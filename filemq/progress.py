"""What a mirror shows while it receives: a live bar on a terminal, log lines otherwise.

``Progress(stream)`` is fed by ``filemq.client``: ``plan(files, bytes)`` when a
resync says what it will send (the ``resync-files``/``resync-bytes`` headers,
``filemq.engine``), ``data(n)`` per chunk written, ``file(...)`` per file placed,
``pause()`` when a resync is complete, ``done()`` at the end.

* ``stream`` is a terminal: a ``tqdm`` bar on it, redrawn at most every 0.1 s --
  files done/planned, bytes done/planned (SI units), percentage, rate and ETA
  (bytes and rate only when the server sent no plan).  The bar is made at the
  first byte received (a sync with nothing to fetch draws nothing and does not
  import ``tqdm``) and closed at ``pause()``/``done()``, so log lines that follow
  are not drawn over.  Without ``tqdm`` installed, one redrawn plain line.
* otherwise (a pipe, a file, a service's journal): while data flows, one log
  line (INFO, logger ``filemq.progress``) every ``every`` seconds (default 5)
  with the same figures; each file placed while live is logged at INFO (DEBUG
  during a resync), as before.

Nothing here touches the JSON events (``--json``) on stdout.
"""

from __future__ import annotations

import logging
import time
from typing import Any, TextIO

__all__ = ["PLAIN_EVERY", "Progress", "describe"]

log = logging.getLogger(__name__)
client_log = logging.getLogger("filemq.client")

#: Seconds between two progress lines when the output is not a terminal.
PLAIN_EVERY = 5.0
_REDRAW = 0.1  # seconds between two redraws of the bar
_MiB = 1 << 20


def _duration(seconds: float) -> str:
    seconds = int(seconds + 0.5)
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}:{seconds:02d}"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}"


def describe(files: int, total_files: int, done: int, total: int, elapsed: float) -> str:
    """``3/10 files, 460.0/1024.0 MiB (45%), 400.0 MiB/s, ETA 1 s`` (no totals: no ETA)."""
    rate = done / elapsed if elapsed > 0 else 0.0
    if total_files and total:
        eta = f", ETA {_duration((total - done) / rate)}" if rate > 0 and done < total else ""
        return (
            f"{files}/{total_files} files, {done / _MiB:.1f}/{total / _MiB:.1f} MiB "
            f"({100 * min(done, total) // total}%), {rate / _MiB:.1f} MiB/s{eta}"
        )
    return f"{files} files, {done / _MiB:.1f} MiB, {rate / _MiB:.1f} MiB/s"


class Progress:
    """Files, bytes, rate, ETA of a mirror's transfers (see the module doc)."""

    def __init__(
        self, stream: TextIO | None, *, every: float = PLAIN_EVERY, bar: bool = True
    ) -> None:
        self.stream = stream
        self.tty = stream is not None and stream.isatty()
        self.every = every
        self._use_bar = bar
        self.start = time.monotonic()
        self.files = 0
        self.bytes = 0
        self.total_files = 0
        self.total_bytes = 0
        self._bar: Any = None
        self._plain_line = False  # (no tqdm) a plain line is drawn and needs a newline
        self._drawn = 0.0
        self._logged = time.monotonic()

    def plan(self, files: int, size: int) -> None:
        """A resync will send ``files`` files of ``size`` bytes (added to what is planned)."""
        self.total_files += files
        self.total_bytes += size
        if self._bar is not None:
            self._bar.total = self.total_bytes
            self._describe_bar()

    def data(self, size: int) -> None:
        self.bytes += size
        now = time.monotonic()
        if self.tty:
            if self._bar is None and not self._plain_line:
                self._open_bar()
            if self._bar is not None:
                self._bar.update(size)  # (tqdm redraws at most every _REDRAW s)
            elif now - self._drawn > _REDRAW:
                self._drawn = now
                self._draw_plain(now)
        elif now - self._logged >= self.every:
            self._logged = now
            log.info("progress: %s", self.summary(now))

    def file(self, name: str, size: int, *, live: bool) -> None:
        """One file placed: counted; a log line when not on a terminal."""
        self.files += 1
        if self._bar is not None:
            self._describe_bar()
        if not self.tty:
            level = logging.INFO if live else logging.DEBUG
            if client_log.isEnabledFor(level):  # (one call per file when not logged)
                client_log.log(level, "received %s (%d bytes)", name, size)

    def summary(self, now: float | None = None) -> str:
        elapsed = (time.monotonic() if now is None else now) - self.start
        return describe(self.files, self.total_files, self.bytes, self.total_bytes, elapsed)

    def pause(self) -> None:
        """A resync is complete: close the bar (a later transfer opens a new one)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self._plain_line and self.stream is not None:
            self._draw_plain(time.monotonic())
            self.stream.write("\n")
            self.stream.flush()
            self._plain_line = False

    def done(self) -> None:
        self.pause()

    # -- terminal ---------------------------------------------------------------------

    def _open_bar(self) -> None:
        try:
            if not self._use_bar:
                raise ImportError
            from tqdm import tqdm  # (only here: ~30 ms, for a sync that moves data)
        except ImportError:
            self._plain_line = True
            return
        tqdm.monitor_interval = 0  # no monitor thread: the bar is updated often enough
        self._bar = tqdm(
            total=self.total_bytes or None,
            unit="B",
            unit_scale=True,  # (SI: kB, MB, GB, as its labels say)
            file=self.stream,
            mininterval=_REDRAW,
            dynamic_ncols=True,
            leave=True,
        )
        self._describe_bar()

    def _describe_bar(self) -> None:
        files = f"{self.files}/{self.total_files}" if self.total_files else str(self.files)
        self._bar.set_description_str(f"{files} files", refresh=False)

    def _draw_plain(self, now: float) -> None:
        assert self.stream is not None
        self.stream.write(f"\r{self.summary(now)}   ")
        self.stream.flush()
