"""Where FILEMQ keeps its indexes between runs, and loading them safely.

The format of an index file is ``filemq.index`` 's business (documented and
versioned there); this module only decides *where* the files live and turns an
unusable file into "no index" (logged), so a corrupt or foreign file costs a
rehash, never a wrong answer.

* **Server** (``filemq serve``): one index per published mount, in
  ``STATE_DIR/server/<key>.idx`` where ``key`` is derived from the mount's real
  directory path and virtual path.  ``STATE_DIR`` is ``--state-dir``, by default
  ``$XDG_STATE_HOME/filemq`` (``~/.local/state/filemq`` when unset).
* **Mirror** (``filemq sync`` / ``filemq subscribe``): one index per DEST, by
  default ``$XDG_CACHE_HOME/filemq/mirrors/<key>.idx``
  (``filemq.client.default_index_path``); kept outside DEST so it is never
  mirrored or deleted with it.

An index is only trusted per file: an entry's SHA-1 is reused when the file's
``(size, mtime_ns, inode)`` still match, so a stale index (a crash after the
last save) only makes the next start hash the files that changed since.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

from filemq.filters import Filters
from filemq.index import FileIndex, IndexFormatError

__all__ = ["default_state_dir", "load_index", "path_key", "server_index_path", "server_state_dir"]

log = logging.getLogger(__name__)


def default_state_dir() -> Path:
    """``$XDG_STATE_HOME/filemq``, or ``~/.local/state/filemq``."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "filemq"


def path_key(ident: bytes) -> str:
    """The 20 hex digits naming an index file: the first of ``ident``'s SHA-1.

    CPython's own SHA-1 (``_sha1``) when it has one: ``hashlib``'s import initialises
    OpenSSL (~3 ms CPU, 3% of a no-change ``filemq sync`` of 10,000 files: issue 15,
    session 19) for a hash of one short name; the digest is the same, so are the names.
    (Files are hashed with ``hashlib``: OpenSSL's is the fast one for contents.)"""
    try:
        from _sha1 import sha1  # type: ignore[import-not-found]  # (CPython, no stub)
    except ImportError:  # (another interpreter: hashlib has it)
        from hashlib import sha1
    return sha1(ident).hexdigest()[:20]


def server_state_dir(state_dir: str | os.PathLike[str]) -> Path:
    """The folder where a server keeps its files under ``state_dir`` (never published)."""
    return Path(state_dir) / "server"


def server_index_path(
    state_dir: str | os.PathLike[str], directory: str | os.PathLike[str], virtual: str
) -> Path:
    """The index file of the mount publishing ``directory`` at ``virtual``."""
    ident = os.fsencode(os.path.realpath(directory)) + b"\0" + virtual.encode()
    return server_state_dir(state_dir) / f"{path_key(ident)}.idx"


def load_index(
    path: str | os.PathLike[str] | None,
    root: str | os.PathLike[str],
    *,
    exclude: Callable[[str], bool] | None = None,
    filters: Filters | None = None,
    tree: bool = False,
) -> FileIndex:
    """The index saved at ``path`` for ``root``, or an empty one (missing or unusable)."""
    if path is not None and os.path.exists(path):
        try:
            return FileIndex.load(path, root, exclude=exclude, filters=filters, tree=tree)
        except IndexFormatError as exc:
            log.warning("ignoring saved index (it will be rebuilt): %s", exc)
    return FileIndex(root, exclude=exclude, filters=filters, tree=tree)
