"""Include/exclude patterns: which names a mount publishes and which a mirror takes.

Patterns are gitignore lines (the ``pathspec`` library's ``GitIgnoreSpec``), matched
against names relative to the root they filter (a published directory, or a mirror's
DEST, which is the subscription path on the server):

* ``--exclude P`` is the line ``P``; ``--include P`` is ``!P`` (a re-include);
  ``--exclude-from FILE`` reads FILE's lines as they are (``#`` comments, blank lines,
  ``!`` re-includes).  Lines apply in the order given, the last match wins (gitignore).
* ``P`` without a ``/`` matches at any depth; with a leading or inner ``/`` it is
  anchored to the root; a trailing ``/`` matches folders only.
* A folder that is excluded is not walked: nothing below it is published or taken, and
  a re-include below an excluded folder has no effect (as in git).

A name is checked with ``excluded(name, is_dir)`` while walking down (its folders were
checked on the way) or ``excluded_path(name, is_dir)`` on its own (every folder above
it is checked too): both give the same answer for the same tree.

Limits, so that patterns from a peer (a mirror sends its own to the server in the
ICANHAZ option ``FILTER``) cannot make matching slow: a pattern is at most
``MAX_PATTERN_CHARS`` characters and has at most ``MAX_STAR_RUNS`` runs of ``*``
(``*`` and ``**`` each count once; more would let Python's regex engine backtrack
for seconds on a long name); a ``FILTER`` option holds at most ``MAX_WIRE_PATTERNS``
lines and ``MAX_WIRE_CHARS`` characters.  A pattern breaking a rule, or one
``pathspec`` cannot parse, raises ``FilterError`` naming it (a command line
reports it as a usage error; a server answers SRSLY).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from typing import Any

from filemq.engine import FilemqError

__all__ = [
    "MAX_PATTERN_CHARS",
    "MAX_STAR_RUNS",
    "MAX_WIRE_CHARS",
    "MAX_WIRE_PATTERNS",
    "FilterError",
    "Filters",
    "read_pattern_file",
]

#: Characters in one pattern, at most.
MAX_PATTERN_CHARS = 1024
#: Runs of '*' in one pattern, at most (each is a backtracking point of the regex).
MAX_STAR_RUNS = 3
#: Lines of a FILTER option a server accepts from a mirror, at most.
MAX_WIRE_PATTERNS = 100
#: Characters of a FILTER option, at most.
MAX_WIRE_CHARS = 64 << 10
#: Size of a pattern file read by --exclude-from, at most.
MAX_FILE_BYTES = 1 << 20

_STAR_RUN = re.compile(r"\*+")
_NAMED = re.compile(r"\(\?P<\w+>")  # named groups of pathspec's regexes (clash when joined)
_FLOATING = "^(?:.+/)?"  # how pathspec starts the regex of a pattern that matches at any depth
_FOLDER_MEMO = 4096  # folders whose verdict excluded_path remembers (then it starts over)


def _joined(patterns: list[str]) -> Any:
    """One regex matching where any of ``patterns`` (pathspec's) matches, or None.

    Patterns matching at any depth share their ``^(?:.+/)?`` prefix, so the engine
    tries each split of the path once for all of them, not once per pattern.
    """
    floating = [p[len(_FLOATING) :] for p in patterns if p.startswith(_FLOATING)]
    anchored = [p[1:] if p.startswith("^") else p for p in patterns if not p.startswith(_FLOATING)]
    parts = []
    if floating:
        parts.append("(?:.+/)?(?:" + "|".join(f"(?:{p})" for p in floating) + ")")
    parts += [f"(?:{p})" for p in anchored]
    try:
        return re.compile(_NAMED.sub("(?:", "^(?:" + "|".join(parts) + ")"))
    except re.error:  # (a translation this joining does not expect: match one by one)
        return None


class FilterError(FilemqError, ValueError):
    """A pattern (or a file or option of patterns) cannot be used."""


def _check_line(line: str) -> None:
    if len(line) > MAX_PATTERN_CHARS:
        raise FilterError(f"pattern {line[:40]!r}...: longer than {MAX_PATTERN_CHARS} characters")
    if "\0" in line or "\n" in line or "\r" in line:
        raise FilterError(f"pattern {line[:80]!r}: NUL or line break in a pattern")
    if len(_STAR_RUN.findall(line)) > MAX_STAR_RUNS:
        raise FilterError(f"pattern {line[:80]!r}: more than {MAX_STAR_RUNS} runs of '*'")


class Filters:
    """A compiled list of gitignore lines (see the module doc); empty: nothing excluded."""

    def __init__(self, lines: Iterable[str] = ()) -> None:
        kept: list[str] = []
        for line in lines:
            line = line.rstrip("\n")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            _check_line(line)
            kept.append(line)
        self.lines: tuple[str, ...] = tuple(kept)
        self._rules: list[tuple[Any, bool]] = []  # (compiled regex, excludes?) in order
        if kept:
            import pathspec  # deferred: a sync without patterns never needs it

            try:
                spec = pathspec.GitIgnoreSpec.from_lines(kept)
            except Exception as exc:  # pathspec raises its own error classes (and ValueError)
                raise FilterError(f"bad pattern: {exc}") from None
            for pattern in spec.patterns:
                if pattern.include is None:
                    continue  # a line that matches nothing (pathspec's "null" pattern)
                regex = pattern.regex
                if not isinstance(regex, re.Pattern):
                    raise FilterError(f"pattern {pattern!r}: not a regular expression")
                self._rules.append((regex, bool(pattern.include)))
        # the usual case, excludes only: one regex, one match per name
        self._any: Any = None
        if self._rules and all(excludes for _r, excludes in self._rules):
            self._any = _joined([r.pattern for r, _e in self._rules])
        self._folders: dict[str, bool] = {}  # excluded_path's verdicts on folders

    def __bool__(self) -> bool:
        return bool(self._rules)

    def __repr__(self) -> str:
        return f"Filters({list(self.lines)!r})"

    def excluded(self, name: str, is_dir: bool = False) -> bool:
        """Is ``name`` itself excluded (its folders are taken as checked already)?"""
        if not self._rules:
            return False
        path = name + "/" if is_dir else name
        if self._any is not None:
            return self._any.match(path) is not None
        verdict = False
        for regex, excludes in self._rules:
            if regex.match(path) is not None:
                verdict = excludes
        return verdict

    def any_file_excluded(self, names: Iterable[str]) -> bool:
        """Is one of the files ``names`` ``excluded``?  With excludes only (one regex), its
        ``match`` is mapped over them at C level: no Python call per name (a refresh asks
        this of every folder's files)."""
        if self._any is not None:
            return any(map(self._any.match, names))
        return any(map(self.excluded, names))

    def excluded_path(self, name: str, is_dir: bool = False) -> bool:
        """Is ``name`` excluded, or any folder above it?"""
        if not self._rules:
            return False
        folder, _sep, _leaf = name.rpartition("/")
        if folder:
            verdict = self._folders.get(folder)
            if verdict is None:
                verdict = self.excluded_path(folder, True)
                if len(self._folders) >= _FOLDER_MEMO:
                    self._folders.clear()
                self._folders[folder] = verdict
            if verdict:
                return True
        return self.excluded(name, is_dir)

    def to_option(self) -> str:
        """The lines as one ICANHAZ option value ('\\n'-separated)."""
        return "\n".join(self.lines)

    @classmethod
    def from_option(cls, value: str) -> Filters:
        """Patterns a peer sent (option ``FILTER``), within the wire limits (the same
        text again is the same compiled object: a mirror sends it with every ICANHAZ)."""
        cached = _RECENT.get(value)
        if cached is not None:
            return cached
        if len(value) > MAX_WIRE_CHARS:
            raise FilterError(f"FILTER option longer than {MAX_WIRE_CHARS} characters")
        lines = value.split("\n") if value else []
        if len(lines) > MAX_WIRE_PATTERNS:
            raise FilterError(f"FILTER option with more than {MAX_WIRE_PATTERNS} patterns")
        filters = cls(lines)
        if len(_RECENT) >= _RECENT_MAX:
            _RECENT.pop(next(iter(_RECENT)))
        _RECENT[value] = filters
        return filters

    @classmethod
    def from_options(
        cls,
        ordered: Sequence[tuple[str, str]] = (),
        files: Sequence[str | os.PathLike[str]] = (),
    ) -> Filters:
        """From command line options: ``ordered`` is ``("exclude"|"include", pattern)`` in
        the order given; the lines of each ``--exclude-from`` file come first."""
        lines: list[str] = []
        for path in files:
            lines.extend(read_pattern_file(path))
        for kind, pattern in ordered:
            if kind == "include":
                lines.append("!" + pattern)
            elif pattern.startswith("!"):
                lines.append("\\" + pattern)  # an exclude of a name starting with '!'
            else:
                lines.append(pattern)
        return cls(lines)


def read_pattern_file(path: str | os.PathLike[str]) -> list[str]:
    """The lines of a pattern file (UTF-8, at most ``MAX_FILE_BYTES``); FilterError if not."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise FilterError(f"cannot read pattern file {os.fspath(path)}: {exc.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise FilterError(f"pattern file {os.fspath(path)}: larger than {MAX_FILE_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise FilterError(f"pattern file {os.fspath(path)}: not UTF-8 text") from None
    if "\0" in text:
        raise FilterError(f"pattern file {os.fspath(path)}: holds a NUL byte (not text)")
    return text.splitlines()


_RECENT: dict[str, Filters] = {}  # FILTER option text -> compiled (most recent last)
_RECENT_MAX = 64
