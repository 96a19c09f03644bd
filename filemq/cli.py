"""``filemq`` command line: ``serve``, ``sync``, ``subscribe`` and ``keys new``.

``serve`` watches what it publishes (inotify; ``--poll`` for a polling
observer, ``--no-watch`` for none) and pushes each complete file to subscribed
clients at once.  Its indexes persist in ``--state-dir`` (default
``$XDG_STATE_HOME/filemq``, see ``filemq.state``; ``--no-state`` for none).
``subscribe`` is the mirror daemon: it runs until SIGTERM/SIGINT (exit 0),
reconnecting and resyncing as needed; ``--json`` prints one JSON object per
applied change on stdout (``filemq.events``).

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
from pathlib import Path
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
    serve.add_argument("--no-watch", action="store_true", help="do not watch for changes")
    serve.add_argument(
        "--settle",
        type=float,
        default=0.05,
        metavar="SECONDS",
        help="a file still open for writing is published after this long unchanged",
    )
    serve.add_argument("--poll", action="store_true", help="poll instead of inotify")
    serve.add_argument(
        "--poll-interval", type=float, default=1.0, metavar="SECONDS", help="with --poll"
    )
    serve.add_argument(
        "--state-dir",
        metavar="DIR",
        help="where the indexes persist (default $XDG_STATE_HOME/filemq)",
    )
    serve.add_argument("--no-state", action="store_true", help="do not persist the indexes")

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

    daemon = sub.add_parser("subscribe", help="keep DEST a live mirror of a server path")
    daemon.add_argument("endpoint")
    daemon.add_argument("dest")
    daemon.add_argument("--path", default="/", help="virtual path to mirror (default /)")
    daemon.add_argument("--json", action="store_true", help="one JSON event per line on stdout")
    daemon.add_argument("--wire", choices=("spec", "czmq"), default="spec")
    daemon.add_argument("--server-key", metavar="SERVER.key")
    daemon.add_argument("--curve-secret", metavar="CLIENT.key_secret")
    daemon.add_argument("--window", type=int, default=DEFAULT_CREDIT_WINDOW, help="credit bytes")
    daemon.add_argument("--index", metavar="FILE", help="where to keep DEST's index")
    daemon.add_argument("--no-index", action="store_true", help="do not keep an index")
    daemon.add_argument(
        "--heartbeat", type=float, default=1.0, help="seconds between heartbeats when idle"
    )
    daemon.add_argument(
        "--timeout", type=float, default=5.0, help="server silent this long: reconnect"
    )
    daemon.add_argument(
        "--max-backoff", type=float, default=5.0, help="longest wait between reconnects"
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
    from filemq.live import LiveFileServer
    from filemq.server import Mount
    from filemq.state import default_state_dir

    if (args.curve_secret is None) != (args.allow is None):
        print("filemq serve: --curve-secret and --allow go together", file=sys.stderr)
        return 2
    mounts = [Mount.parse(spec) for spec in args.publish]
    state_dir = None if args.no_state else Path(args.state_dir or default_state_dir())
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    live = LiveFileServer(
        context,
        mounts,
        watch=not args.no_watch,
        settle=args.settle,
        poll_interval=args.poll_interval if args.poll else None,
        state_dir=state_dir,
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
    server = live.server
    try:
        live.start()
        files = sum(len(index) for index in server.indexes.values())
        hashed = sum(index.hashed_files for index in server.indexes.values())
        where = ", ".join(f"{m.directory} at {m.virtual}" for m in mounts)
        watching = "not watching" if args.no_watch else "polling" if args.poll else "watching"
        print(
            f"filemq: serving {where} on {server.endpoint} ({files} files, {hashed} hashed, "
            f"{watching})",
            file=sys.stderr,
            flush=True,
        )
        _wait_for_signal()
    finally:
        live.stop()
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


def _subscribe(args: argparse.Namespace) -> int:
    from filemq.client import SyncError, SyncRefused, default_index_path
    from filemq.events import MirrorEvent
    from filemq.subscriber import Subscriber

    if (args.curve_secret is None) != (args.server_key is None):
        print("filemq subscribe: --curve-secret and --server-key go together", file=sys.stderr)
        return 2

    def print_json(event: MirrorEvent) -> None:
        print(event.to_json(), flush=True)

    index = None if args.no_index else (args.index or default_index_path(args.dest))
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    subscriber = Subscriber(
        args.endpoint,
        args.dest,
        path=args.path,
        context=context,
        on_event=print_json if args.json else None,
        index_path=index,
        heartbeat=args.heartbeat,
        timeout=args.timeout,
        connect_timeout=args.timeout,
        backoff_cap=args.max_backoff,
        wire=args.wire,
        window=args.window,
        curve_secret=args.curve_secret,
        server_key=args.server_key,
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: subscriber.client.stop())
    log.info("mirroring %s%s into %s", args.endpoint, args.path, args.dest)
    try:
        result = subscriber.run()
    except SyncRefused as exc:
        log.error("%s", exc)
        return 3
    except SyncError as exc:
        log.error("%s", exc)
        return 1
    finally:
        context.term()
    log.info(
        "stopped: %d files (%d bytes) received, %d deleted, %d errors",
        result.files,
        result.bytes,
        result.deleted,
        result.errors,
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    level = logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "serve":
            return _serve(args)
        if args.command == "sync":
            return _sync(args)
        if args.command == "subscribe":
            return _subscribe(args)
        public, secret = security.new_certificate(args.name, args.dir)
        print(f"{public}\n{secret}")
        return 0
    except (FilemqError, security.SecurityError, OSError, ValueError) as exc:
        print(f"filemq: {exc}", file=sys.stderr)
        return 1
