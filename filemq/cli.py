"""``filemq`` command line: ``serve``, ``sync`` and ``keys new``.

Exit codes: 0 success; 1 the sync failed or ended with errors (refused names,
files that never verified, no server); 2 usage; 3 access refused (SRSLY, CURVE
handshake refused); 4 the server answered RTFM twice.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

import zmq

from filemq import security
from filemq.engine import DEFAULT_CHUNK_SIZE, DEFAULT_CREDIT_WINDOW, DEFAULT_ENDPOINT, FilemqError

# server and client are imported by their subcommand only (start-up time of `sync`)

log = logging.getLogger("filemq")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="filemq", description="FILEMQ v2 file distribution")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="publish directories")
    serve.add_argument("--bind", default=DEFAULT_ENDPOINT, help=f"default {DEFAULT_ENDPOINT}")
    serve.add_argument(
        "--publish",
        action="append",
        required=True,
        metavar="DIR[:/virtual/path]",
        help="directory to publish (repeatable; virtual path defaults to /)",
    )
    serve.add_argument("--curve-secret", metavar="SERVER.key_secret")
    serve.add_argument("--allow", metavar="DIR", help="folder of allowed client public keys")
    serve.add_argument("--insecure", action="store_true", help="allow plain text off loopback")
    serve.add_argument("--wire", choices=("spec", "czmq"), default="spec")
    serve.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE)
    serve.add_argument(
        "--deny",
        action="append",
        default=[],
        metavar="/virtual/prefix",
        help="refuse subscriptions to (and never send) this subtree",
    )
    serve.add_argument(
        "--client-ttl", type=float, default=30.0, help="forget clients silent this long (s)"
    )
    serve.add_argument(
        "--rescan",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="rescan published directories periodically (0: off)",
    )

    sync = sub.add_parser("sync", help="mirror a server path into DEST")
    sync.add_argument("endpoint")
    sync.add_argument("dest")
    sync.add_argument("--path", default="/", help="virtual path to mirror (default /)")
    sync.add_argument("--once", action="store_true", help="exit when DEST matches the server")
    sync.add_argument("--wire", choices=("spec", "czmq"), default="spec")
    sync.add_argument("--server-key", metavar="SERVER.key")
    sync.add_argument("--curve-secret", metavar="CLIENT.key_secret")
    sync.add_argument("--window", type=int, default=DEFAULT_CREDIT_WINDOW, help="credit bytes")
    sync.add_argument("--index", metavar="FILE", help="where to keep DEST's index")
    sync.add_argument("--no-index", action="store_true", help="do not keep an index")
    sync.add_argument(
        "--idle-timeout",
        type=float,
        default=10.0,
        help="--once: done after this long without messages if no marker",
    )
    sync.add_argument(
        "--timeout", type=float, default=10.0, help="seconds to wait for the server to answer"
    )
    sync.add_argument(
        "--retries", type=int, default=3, help="reconnects after protocol errors or timeouts"
    )

    keys = sub.add_parser("keys", help="CURVE certificates")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    new = keys_sub.add_parser("new", help="make NAME.key and NAME.key_secret")
    new.add_argument("name")
    new.add_argument("--dir", default=".")
    return parser


def _wait_for_signal() -> None:
    stop = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop.wait(0.5):
            pass
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _serve(args: argparse.Namespace) -> int:
    from filemq.server import FileServer, Mount

    if (args.curve_secret is None) != (args.allow is None):
        print("filemq serve: --curve-secret and --allow go together", file=sys.stderr)
        return 2
    mounts = [Mount.parse(spec) for spec in args.publish]
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    server = FileServer(
        context,
        mounts,
        endpoint=args.bind,
        wire=args.wire,
        curve_secret=args.curve_secret,
        allow_dir=args.allow,
        insecure=args.insecure,
        chunk_size=args.chunk_size,
        client_ttl=args.client_ttl,
        deny=args.deny,
        rescan_interval=args.rescan,
    )
    try:
        server.start()
        files = sum(len(index) for index in server.indexes.values())
        where = ", ".join(f"{m.directory} at {m.virtual}" for m in mounts)
        print(
            f"filemq: serving {where} on {server.endpoint} ({files} files)",
            file=sys.stderr,
            flush=True,
        )
        _wait_for_signal()
    finally:
        server.stop()
        context.term()
    return 0


def _sync(args: argparse.Namespace) -> int:
    from filemq.client import (
        SyncClient,
        SyncError,
        SyncRefused,
        SyncRejected,
        default_index_path,
    )

    if (args.curve_secret is None) != (args.server_key is None):
        print("filemq sync: --curve-secret and --server-key go together", file=sys.stderr)
        return 2
    index = None if args.no_index else (args.index or default_index_path(args.dest))
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    client = SyncClient(
        context,
        args.endpoint,
        args.dest,
        path=args.path,
        once=args.once,
        wire=args.wire,
        window=args.window,
        curve_secret=args.curve_secret,
        server_key=args.server_key,
        index_path=index,
        idle_timeout=args.idle_timeout,
        connect_timeout=args.timeout,
        max_retries=args.retries,
        progress=sys.stderr,
    )
    if not args.once:
        signal.signal(signal.SIGTERM, lambda signum, frame: client.stop())
        signal.signal(signal.SIGINT, lambda signum, frame: client.stop())
    try:
        result = client.run()
    except SyncRefused as exc:
        log.error("%s", exc)
        return 3
    except SyncRejected as exc:
        log.error("%s", exc)
        return 4
    except SyncError as exc:
        log.error("%s", exc)
        return 1
    finally:
        context.term()
    log.info(
        "%d files (%d bytes) received, %d deleted, %d refused, %d errors",
        result.files,
        result.bytes,
        result.deleted,
        result.refused,
        result.errors,
    )
    return 1 if result.errors or (args.once and not result.synced) else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    level = logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "serve":
            return _serve(args)
        if args.command == "sync":
            return _sync(args)
        public, secret = security.new_certificate(args.name, args.dir)
        print(f"{public}\n{secret}")
        return 0
    except (FilemqError, security.SecurityError, OSError, ValueError) as exc:
        print(f"filemq: {exc}", file=sys.stderr)
        return 1
