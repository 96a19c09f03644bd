"""What a mirror holding exactly what the server has says in its ICANHAZ.

A no-change resync is the common request (every ``filemq sync`` of an unchanged
tree).  Its ICANHAZ carries the mirror's whole resync cache (name -> SHA-1) and,
from a ``META`` client, an ``ATTRS`` line per file and folder: for 100,000 files
~7 MiB and ~3 MiB that the server decoded into dicts and compared entry by entry
(~1 s of CPU on a loaded machine) to queue nothing.  A mirror sends them in
name order straight from its loaded index, so the server can write the same
octets from its own index once (kept until an entry changes: ``FileIndex.memo``)
and compare them whole (a memcmp).  Equal octets are the same entries the planning
loop would have compared, one by one, and found equal: nothing to send, nothing to
delete.  Anything else (another order, one SHA-1 or mode that differs, a name the
mirror leaves out) is not equal and is planned as before: the check can only skip
work that would have queued nothing.

A mirror with patterns (``FILTER``, ``filemq.filters``) holds and describes only the
names they admit: its octets are compared with the same encodings made without the
names they leave out (``left_out``: the files, once per index version and pattern
list; folders are tested each time).  Patterns that leave out nothing the server has
(the usual ``--exclude '*.tmp'``) compare with the encodings of the whole index.

Pure functions of an index: no sockets, no files read.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from operator import itemgetter

from filemq.filters import Filters
from filemq.index import NODE_DIR, FileIndex
from filemq.meta import Kind, attr_dir, attr_file, local_mode
from zproto.runtime import enc_hash

__all__ = ["attrs_match", "attrs_texts", "cache_octets", "left_out"]

_NONE: frozenset[str] = frozenset()

_SLICE = 4096  # ATTRS lines joined at a time (a list of every line: ~100 octets a file)


class _InOrder(Mapping[str, str]):
    """An index's digests read in name order for ``enc_hash`` (its count and items):
    one pair at a time, never a dict or a list of every pair (100,000 files: ~20 MiB)."""

    def __init__(self, index: FileIndex, skip: frozenset[str] = _NONE) -> None:
        self._index = index
        self._skip = skip  # names left out (a subset of the index's)

    def __len__(self) -> int:
        return len(self._index) - len(self._skip)

    def items(self) -> Iterator[tuple[str, str]]:  # type: ignore[override]
        pairs = self._index.ordered_digests()
        if self._skip:
            skip = self._skip
            return (pair for pair in pairs if pair[0] not in skip)
        return pairs

    def __getitem__(self, key: str) -> str:
        entry = self._index.get(key)
        if entry is None or key in self._skip:
            raise KeyError(key)
        return entry.sha1

    def __iter__(self) -> Iterator[str]:
        return map(itemgetter(0), self.items())


def left_out(index: FileIndex, filters: Filters) -> frozenset[str]:
    """The files of ``index`` that a mirror's ``filters`` leave out (names relative to
    the index's root, where that mirror's DEST is)."""
    excluded = filters.excluded_path
    return frozenset(name for name, _mode, _mtime in index.stamps() if excluded(name))


def cache_octets(index: FileIndex, skip: frozenset[str] = _NONE) -> bytes:
    """The ICANHAZ ``cache`` field as encoded (count first) by a mirror that holds
    every file of ``index`` as it is but those in ``skip``, names relative to the
    index's root, in order."""
    return enc_hash(_InOrder(index, skip))


def _file_text(index: FileIndex, mask: int, skip: frozenset[str] = _NONE) -> str | None:
    """The file lines of that mirror's ``ATTRS`` (None: an entry whose mode is not known
    yet, a version 1 index, which a mirror leaves out)."""
    heads: dict[int, str] = {}
    for mode in {mode for _name, mode, _mtime in index.stamps()}:
        if mode < 0:
            return None
        heads[mode] = attr_file(local_mode(mode, mask, Kind.FILE), 0)[:-1]
    stamps = index.stamps(True)
    if skip:
        stamps = (stamp for stamp in stamps if stamp[0] not in skip)
    lines = (f"{name}\t{heads[mode]}{mtime}" for name, mode, mtime in stamps)
    slices = []
    while chunk := "\n".join(itertools.islice(lines, _SLICE)):
        slices.append(chunk)
    return "\n".join(slices)


def attrs_texts(
    index: FileIndex, mask: int, filters: Filters | None = None, skip: frozenset[str] = _NONE
) -> tuple[str, str] | None:
    """That mirror's ``ATTRS`` option in two parts: the file lines (kept in the index's
    memo) and the folder lines after them (made each time: folders are not in the memo).
    With ``filters`` (that mirror's patterns), the files in ``skip`` (``left_out``) and
    the folders the patterns leave out are not in them.  None when no mirror can say
    it: the index has links (a mirror describes links only with ``--links``, and a
    server offers them differently by policy) or entries whose mode is not known."""
    nodes = index.nodes()
    if any(node.kind != NODE_DIR for node in nodes.values()):
        return None
    key = ("attrs", mask, *((filters.lines,) if skip and filters is not None else ()))
    files = index.memo(key, lambda: _file_text(index, mask, skip))
    if files is None:
        return None
    names = sorted(nodes)
    if filters is not None:
        names = [name for name in names if not filters.excluded_path(name, True)]
    folders = "\n".join(
        f"{name}\t{attr_dir(local_mode(nodes[name].mode, mask, Kind.DIR))}" for name in names
    )
    return files, folders


def attrs_match(text: str, expected: tuple[str, str]) -> bool:
    """Is ``text`` (an ``ATTRS`` option) the file lines then the folder lines?"""
    files, folders = expected
    if not (files and folders):
        return text == files + folders
    return (
        len(text) == len(files) + 1 + len(folders)
        and text.startswith(files)
        and text[len(files)] == "\n"
        and text.endswith(folders)
    )
