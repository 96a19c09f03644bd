"""Shared vocabulary of the FILEMQ protocol engines (sans-IO; no zmq here).

The engines themselves live in ``engine_server`` (one ``ServerSession`` per
connected client) and ``engine_client`` (``ClientSession``).  Both take decoded
frames and a clock value and return actions; only ``server.py`` and
``client.py`` touch sockets and files.

Conventions this implementation adds on top of spec 35 (all within the wire
format, so other FILEMQ peers can ignore them):

* **Filenames** in CHEEZBURGER are full virtual paths with a leading '/'
  (as the reference implementation sends them).  A client maps them under its
  DEST by removing its subscription path.
* **End-to-end integrity**: the last chunk of a file (``eof=1``) carries the
  headers ``sha1`` (hex SHA-1 of the whole file), ``size`` and ``mtime_ns``.
* **Resync completion**: after the last operation of a RESYNC the server sends
  one marker CHEEZBURGER with ``operation=0`` (neither create nor delete), an
  empty filename, an empty chunk, ``eof=1`` and the headers ``resync=complete``
  and ``path=<subscription path>``.  It costs no credit.  A client that never
  sees it (an older peer) falls back to an idle timeout.
* **Deletes during RESYNC**: a ``cache`` entry under the subscription path that
  names no file on the server gets a delete operation, so a resynced mirror
  drops files the server no longer has.
* **Metadata** (``filemq.meta``): file modes on every last chunk (header
  ``mode``); for clients that ask (ICANHAZ option ``META``) folders, links and
  mode/mtime-only updates, their link policy (``LINKS``), their patterns
  (``FILTER``) and what their DEST holds (``ATTRS``).
* **Mirror DEST**: the client's ICANHAZ carries the option ``MIRROR-DEST``
  (machine, device, inode and real path of its DEST, ``filemq.loopguard``); a
  server on the same machine answers SRSLY when DEST is inside a directory it
  publishes under that subscription (the mirror would copy itself without end).
* **Version headers on the first chunk**: a file sent in several chunks carries
  ``sha1``, ``size`` and ``mtime_ns`` on its first chunk too, so a client knows
  which version it is receiving before the end (what a resumable partial file
  records).
* **Resume** (ICANHAZ option ``RESUME``): lines ``OFFSET SHA1 NAME`` (NAME a
  virtual path under the ICANHAZ path, SHA1 the whole file's digest of the version
  the client was receiving, OFFSET the bytes it holds, verified).  When the server
  sends that file and its current version has that SHA-1, it starts at OFFSET (the
  first chunk's ``offset``); otherwise at 0, which tells the client the file changed.
  A client accepts a first chunk at a non-zero offset only where it offered one.
* **Resync plan** (progress): the first operation a RESYNC queues carries the
  headers ``resync-files`` and ``resync-bytes`` (files and content bytes that
  resync is about to send).  A client may ignore them.
* **Listing** (ICANHAZ option ``LIST=1``, with ``RESYNC=1``): the server sends, for
  every file under the path, one CHEEZBURGER with ``operation=3`` (STAT): no
  content, ``eof=1``, the ``sha1``/``size``/``mtime_ns`` headers; then the completion
  marker.  A listing is not a subscription: no live changes follow.  Neither STAT
  nor the markers cost credit (each waits for credit >= 1 byte, as any chunk): a
  lister grants one byte, so a server that does not know ``LIST`` sends at most one
  byte of content before the lister stops.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from enum import IntEnum
from types import ModuleType

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_CREDIT_WINDOW",
    "DEFAULT_ENDPOINT",
    "HEADER_BYTES",
    "HEADER_FILES",
    "HEADER_MTIME",
    "HEADER_PATH",
    "HEADER_RESYNC",
    "HEADER_SHA1",
    "HEADER_SIZE",
    "OPTION_LIST",
    "OPTION_MIRROR_DEST",
    "OPTION_RESUME",
    "RESYNC_COMPLETE",
    "FilemqError",
    "LocalProtocolError",
    "Operation",
    "RemoteProtocolError",
    "Wire",
    "load_wire",
]

#: Where ``filemq serve`` binds by default (5670 is FILEMQ's IANA port; loopback only).
DEFAULT_ENDPOINT = "tcp://127.0.0.1:5670"
#: Bytes of file content per CHEEZBURGER, and the client's credit window.
#: Measured with ``python bench/bench_filemq.py --measure-defaults`` (one 512 MiB
#: file over loopback, separate server and client processes, best of 2, 2 shared
#: cores, noisy +-40%): chunk 64 KiB 0.61-1.19 s; 256 KiB 0.57-0.67 s; 1 MiB
#: 0.67-0.69 s (1.30 s with a 4 MiB window: only 4 chunks in flight); 4 MiB
#: 0.64-1.52 s.  256 KiB and 1 MiB are within noise of each other, plain and CURVE
#: (256 MiB over CURVE: 0.52-1.04 s for both).  1 MiB keeps per-message Python cost
#: lowest for big files and matches the reference's chunk size; a 16 MiB window
#: (16 chunks in flight, credit returned every 4 MiB) was as fast as 64 MiB and
#: bounds what one client can have queued.
DEFAULT_CHUNK_SIZE = 1 << 20
DEFAULT_CREDIT_WINDOW = 16 << 20

HEADER_SHA1 = "sha1"
HEADER_SIZE = "size"
HEADER_MTIME = "mtime_ns"
HEADER_RESYNC = "resync"
HEADER_PATH = "path"
HEADER_FILES = "resync-files"  # (first operation of a resync) files it will send
HEADER_BYTES = "resync-bytes"  # (first operation of a resync) content bytes it will send
RESYNC_COMPLETE = "complete"
OPTION_MIRROR_DEST = "MIRROR-DEST"  # ICANHAZ option: where the mirror writes (loopguard)
OPTION_RESUME = "RESUME"  # ICANHAZ option: "OFFSET SHA1 NAME" lines (partial files held)
OPTION_LIST = "LIST"  # ICANHAZ option: "1" asks for a listing (metadata only)


class Operation(IntEnum):
    """CHEEZBURGER operation codes (0 and 3 are this implementation's additions)."""

    MARKER = 0  # resync start/complete
    CREATE = 1
    DELETE = 2
    STAT = 3  # a listing entry: metadata only (ICANHAZ option LIST)


class FilemqError(Exception):
    """Root of the filemq error hierarchy."""


class LocalProtocolError(FilemqError):
    """We were asked to do something the protocol does not allow."""


class RemoteProtocolError(FilemqError):
    """The peer broke the protocol (bad offset, bad sequence, unexpected command)."""


@dataclass(frozen=True)
class Wire:
    """A FILEMQ wire variant: the codec module, its filename limit, how a file ends.

    ``empty_final_chunk``: the server ends every file with an extra zero-length
    chunk (``eof=1``, carrying the end-of-file headers) and sets ``eof=0`` on
    every data chunk.  That is how the reference C server ends a file, and its
    client closes a file only on a zero-length chunk (it ignores ``eof``): a
    server that ended a file on its last data chunk would have it write the
    next file into the previous file's handle.  On the spec wire the last data
    chunk carries ``eof=1`` and no empty chunk follows.
    """

    name: str
    codec: ModuleType
    max_name_octets: int
    empty_final_chunk: bool = False


_WIRES = {
    "spec": ("filemq.fmq_msg", 255, False),
    "czmq": ("filemq.fmq_msg_czmq", 0xFFFFFFFF, True),
}


def clip_reason(text: str, limit: int = 255) -> str:
    """``text`` cut to fit a 1-octet string field (SRSLY/RTFM reasons) in UTF-8.

    Reasons may quote what a peer sent, so their size in octets is not known.
    """
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", "ignore")


def load_wire(name: str = "spec") -> Wire:
    """``spec`` (RFC 35: 1-octet path/filename) or ``czmq`` (the C reference's longstr)."""
    try:
        module_name, limit, empty_final_chunk = _WIRES[name]
    except KeyError:
        raise LocalProtocolError(f"unknown wire variant {name!r} (spec or czmq)") from None
    try:
        codec = importlib.import_module(module_name)
    except ImportError as exc:
        raise LocalProtocolError(f"wire {name!r}: codec {module_name} missing: {exc}") from None
    return Wire(name, codec, limit, empty_final_chunk)
