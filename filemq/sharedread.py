"""Small files read once and shared by every client that is sent them.

A live change goes to every subscribed client: without sharing, the server opens,
checks and reads the same small file once per client (``open`` through
``filemq.paths``, ``fstat``, ``pread``, ``close``: most of the server's work per client
for a file of a few KiB).  :class:`SharedReads` keeps the content of the last small
files read, keyed by the version they were read as -- ``(virtual name, size,
mtime_ns, inode, sha1)``: the identity the server checks with ``fstat`` before it
reads, and the digest the clients verify -- so the second to the last client reuse
the bytes read for the first.  A new version of a file has a new key: its content
is read again.  An entry is used for ``max_age`` seconds (default 2) after it was
read, so a file changed behind the server's back (no watcher) is read (and its
change found by ``fstat``) again soon; what a client gets is always a version that
existed, with its own SHA-1.

Bounded: files up to ``DEFAULT_MAX_FILE`` bytes (256 KiB), at most ``max_bytes`` in
all (default 8 MiB), the least recently used first out.
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["DEFAULT_MAX_AGE", "DEFAULT_MAX_BYTES", "DEFAULT_MAX_FILE", "SharedReads", "Version"]

#: Largest file kept (bytes).
DEFAULT_MAX_FILE = 256 << 10
#: Content kept in all (bytes).
DEFAULT_MAX_BYTES = 8 << 20
#: Seconds an entry is used after it was read.
DEFAULT_MAX_AGE = 2.0

#: (virtual name, size, mtime_ns, inode, sha1) of the version read.
Version = tuple[str, int, int, int, str]


class SharedReads:
    """Content of recently read small files, by version (see the module doc)."""

    def __init__(
        self, max_bytes: int = DEFAULT_MAX_BYTES, max_age: float = DEFAULT_MAX_AGE
    ) -> None:
        self.max_bytes = max_bytes
        self.max_age = max_age
        self._data: OrderedDict[Version, tuple[bytes, float]] = OrderedDict()
        self._bytes = 0
        #: Reads saved (a client served from the shared copy).
        self.hits = 0

    def get(self, version: Version, now: float) -> bytes | None:
        found = self._data.get(version)
        if found is None:
            return None
        data, read_at = found
        if now - read_at > self.max_age:
            self._forget(version)
            return None
        self._data.move_to_end(version)
        self.hits += 1
        return data

    def put(self, version: Version, data: bytes, now: float) -> None:
        """Keep ``data``, the whole content of ``version`` read at ``now``."""
        if len(data) > DEFAULT_MAX_FILE or len(data) != version[1]:
            return  # (a short read: not the version's content)
        self._forget(version)
        self._data[version] = (data, now)
        self._bytes += len(data)
        while self._bytes > self.max_bytes:
            _old, (dropped, _at) = self._data.popitem(last=False)
            self._bytes -= len(dropped)

    def _forget(self, version: Version) -> None:
        found = self._data.pop(version, None)
        if found is not None:
            self._bytes -= len(found[0])

    def __len__(self) -> int:
        return len(self._data)
