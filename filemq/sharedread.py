"""Small files read once and shared by the clients of one round of sending.

A live change goes to every subscribed client: without sharing, the server opens,
checks and reads the same small file once per client (``open`` through
``filemq.paths``, ``fstat``, ``pread``, ``close``: most of the server's work per client
for a file of a few KiB).  :class:`SharedReads` keeps the content of the small files
read, keyed by the version they were read as -- ``(virtual name, size, mtime_ns,
inode, sha1)``: the identity the server checks with ``fstat`` before it reads, and the
digest the clients verify -- so the other clients of the same round reuse the bytes
read for the first.  The server empties it at the start of every round of sending
(``FileServer._pump``: at most ``_PUMP_BUDGET`` messages), so a file changed, removed
or made unreadable is looked at again (``fstat``, its permissions) as soon as
without sharing, give or take one round; and a new version has a new key anyway.

Bounded: files up to ``DEFAULT_MAX_FILE`` bytes (256 KiB), at most ``max_bytes`` in
all (default 8 MiB), the least recently used first out.
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_MAX_FILE", "SharedReads", "Version"]

#: Largest file kept (bytes).
DEFAULT_MAX_FILE = 256 << 10
#: Content kept in all (bytes).
DEFAULT_MAX_BYTES = 8 << 20

#: (virtual name, size, mtime_ns, inode, sha1) of the version read.
Version = tuple[str, int, int, int, str]


class SharedReads:
    """Content of the small files read this round, by version (see the module doc)."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._data: OrderedDict[Version, bytes] = OrderedDict()
        self._bytes = 0
        #: Reads saved (a client served from the shared copy).
        self.hits = 0

    def get(self, version: Version) -> bytes | None:
        data = self._data.get(version)
        if data is not None:
            self._data.move_to_end(version)
            self.hits += 1
        return data

    def put(self, version: Version, data: bytes) -> None:
        """Keep ``data``, the whole content of ``version``."""
        if len(data) > DEFAULT_MAX_FILE or len(data) != version[1] or version in self._data:
            return  # (a short read is not the version's content)
        self._data[version] = data
        self._bytes += len(data)
        while self._bytes > self.max_bytes:
            _old, dropped = self._data.popitem(last=False)
            self._bytes -= len(dropped)

    def clear(self) -> None:
        """A new round: everything is read (and checked) again."""
        if self._data:
            self._data.clear()
            self._bytes = 0

    def __len__(self) -> int:
        return len(self._data)
