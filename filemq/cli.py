"""``filemq`` command line: ``serve``, ``sync``, ``subscribe`` and ``keys new``.

``serve`` watches what it publishes (inotify; ``--poll`` for a polling
observer, ``--no-watch`` for none) and pushes each complete file to subscribed
clients at once.  Its indexes persist in ``--state-dir`` (default
``$XDG_STATE_HOME/filemq``, see ``filemq.state``; ``--no-state`` for none).
``subscribe`` is the mirror daemon: it runs until SIGTERM/SIGINT (exit 0),
reconnecting and resyncing as needed; ``--json`` prints one JSON object per
applied change on stdout (``filemq.events``); it repairs local changes to DEST
within ``--check-interval`` seconds (default 2; see ``filemq.client``).

Exit codes: 0 success; 1 the sync failed or ended with errors (refused names,
files that never verified, no server); 2 usage; 3 access refused (SRSLY, CURVE
handshake refused); 4 the server answered RTFM twice; 5 another process is
mirroring into DEST (``sync``/``subscribe``: the lock ``DEST/.filemq-part-lock``
is held; the line names its pid).  ``sync --once`` against a server that sends
no resync-complete marker (the reference C server) ends after ``--idle-timeout``
seconds (default 10) without file traffic with one warning line and exit 0 (1
if that happened in the middle of a file, once ``--retries`` are used up).
"""

from __future__ import annotations

import argparse
import functools
import gc
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import zmq

from filemq.engine import DEFAULT_CHUNK_SIZE, DEFAULT_CREDIT_WINDOW, DEFAULT_ENDPOINT, FilemqError

if TYPE_CHECKING:  # the client module is imported by its subcommands only
    from filemq.client import SyncResult

# server, client and security are imported by their subcommand only (start-up of `sync`)

log = logging.getLogger("filemq")


@functools.cache
def _help_width() -> int:
    """What ``shutil.get_terminal_size`` would say, minus 2 (as argparse sizes help)."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return (columns if columns > 0 else 80) - 2


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's help formatter, sized without importing ``shutil`` (~2 ms of start-up).

    (argparse makes one for every option it adds, and the stock one imports
    ``shutil`` for the terminal width.)
    """

    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=_help_width())


def _serve_options(serve: argparse.ArgumentParser) -> None:
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
    serve.add_argument(
        "--with-broker",
        nargs="?",
        const="tcp://127.0.0.1:5680",
        metavar="ENDPOINT",
        help="also run the zerohub broker in this process (default tcp://127.0.0.1:5680; "
        "same CURVE keys and allow-list as the file server)",
    )


def _sync_options(sync: argparse.ArgumentParser) -> None:
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
        help="--once with a server that sends no resync-complete marker: done after this "
        "many seconds without file traffic (heartbeats do not count; default 10)",
    )
    sync.add_argument(
        "--heartbeat", type=float, default=5.0, help="seconds between heartbeats when idle"
    )
    sync.add_argument(
        "--timeout", type=float, default=10.0, help="seconds to wait for the server to answer"
    )
    sync.add_argument(
        "--retries", type=int, default=3, help="reconnects after protocol errors or timeouts"
    )


def _subscribe_options(daemon: argparse.ArgumentParser) -> None:
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
    daemon.add_argument(
        "--check-interval",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="re-check DEST for local changes and repair them this often (0: never)",
    )


def _keys_options(keys: argparse.ArgumentParser) -> None:
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    new = keys_sub.add_parser(
        "new", help="make NAME.key and NAME.key_secret", formatter_class=_HelpFormatter
    )
    new.add_argument("name")
    new.add_argument("--dir", default=".")


_COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]] = {
    "serve": ("publish directories", _serve_options),
    "sync": ("mirror a server path into DEST", _sync_options),
    "subscribe": ("keep DEST a live mirror of a server path", _subscribe_options),
    "keys": ("CURVE certificates", _keys_options),
}


def _parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The command line parser; with ``argv``, only the named command gets its options.

    (Every ``filemq sync`` builds this parser: the options of the other commands
    would cost ~4 ms of its start-up.)
    """
    words = sys.argv[1:] if argv is None else argv
    command = next((w for w in words if not w.startswith("-")), None)
    wanted = command if command in _COMMANDS else None  # unknown or none: build all (help)
    parser = argparse.ArgumentParser(
        prog="filemq", description="FILEMQ v2 file distribution", formatter_class=_HelpFormatter
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (about, add_options) in _COMMANDS.items():
        command_parser = sub.add_parser(name, help=about, formatter_class=_HelpFormatter)
        if wanted is None or wanted == name:
            add_options(command_parser)
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
    broker = _broker_beside(args, context) if args.with_broker else None
    try:
        if broker is not None:
            endpoint = broker.start()
            print(f"filemq: broker serving on {endpoint}", file=sys.stderr, flush=True)
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
        if broker is not None:
            broker.stop()
        context.term()
    return 0


def _broker_beside(args: argparse.Namespace, context: zmq.Context[zmq.Socket[bytes]]) -> Any:
    """The broker with its default engine, on ``args.with_broker`` (``--with-broker``)."""
    from broker.engine import Engine
    from broker.server import Server, ServerOptions

    options = ServerOptions(
        endpoint=args.with_broker,
        curve_secret=args.curve_secret,
        allow_dir=args.allow,
        insecure=args.insecure,
    )
    return Server(Engine(), options, context=context)


def _sync(args: argparse.Namespace) -> int:
    from filemq.client import (
        SyncClient,
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
        heartbeat=args.heartbeat,
        connect_timeout=args.timeout,
        max_retries=args.retries,
        progress=sys.stderr,
    )
    if not args.once:
        signal.signal(signal.SIGTERM, lambda signum, frame: client.stop())
        signal.signal(signal.SIGINT, lambda signum, frame: client.stop())
    result = _run_client(client.run, context)
    if isinstance(result, int):
        return result
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
    from filemq.client import default_index_path
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
        check_interval=args.check_interval,
        wire=args.wire,
        window=args.window,
        curve_secret=args.curve_secret,
        server_key=args.server_key,
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: subscriber.client.stop())
    log.info("mirroring %s%s into %s", args.endpoint, args.path, args.dest)
    result = _run_client(subscriber.run, context)
    if isinstance(result, int):
        return result
    log.info(
        "stopped: %d files (%d bytes) received, %d deleted, %d errors",
        result.files,
        result.bytes,
        result.deleted,
        result.errors,
    )
    return 0


def _run_client(run: Callable[[], SyncResult], context: zmq.Context[Any]) -> SyncResult | int:
    """Run a sync or subscribe session; a failure becomes its exit code.

    3: access refused (SRSLY, or the CURVE handshake failed); 4: the server rejected the
    protocol (RTFM); 5: DEST is locked by another process; 1: any other session error.
    The context is terminated either way.
    """
    from filemq.client import SyncError, SyncRefused, SyncRejected
    from filemq.destlock import DestLocked

    try:
        return run()
    except DestLocked as exc:
        log.error("%s", exc)
        return 5
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


def _expected_errors() -> tuple[type[Exception], ...]:
    """Errors reported as one line (exit 1); security's only if it was imported."""
    security = sys.modules.get("filemq.security")
    found = (FilemqError, OSError, ValueError)
    return found if security is None else (*found, security.SecurityError)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: this program's arguments); the exit code."""
    args = _parser(argv).parse_args(argv)
    level = logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    if argv is None and args.command == "sync" and args.once:
        # a short-lived process that makes almost no reference cycles: the collector's
        # passes over DEST's index (10,000 entries) would cost ~10 ms of a no-change sync
        gc.disable()
    try:
        if args.command == "serve":
            return _serve(args)
        if args.command == "sync":
            return _sync(args)
        if args.command == "subscribe":
            return _subscribe(args)
        from filemq import security

        public, secret = security.new_certificate(args.name, args.dir)
        print(f"{public}\n{secret}")
        return 0
    except Exception as exc:
        if not isinstance(exc, _expected_errors()):
            raise
        print(f"filemq: {exc}", file=sys.stderr)
        return 1
    finally:
        if argv is None:
            # the program exits next: put every object out of the collector's reach, so
            # the interpreter's last collection skips them (~10 ms with a 10,000-file index)
            gc.freeze()
