"""``filemq`` command line: ``serve``, ``sync``, ``subscribe``, ``ls``, ``status``, ``keys new``
and ``manifest`` (Parquet manifests of a tree, made here or on Spark: ``filemq.manifest_cli``).

``serve`` watches what it publishes (inotify; ``--poll`` for a polling
observer, ``--no-watch`` for none) and pushes each complete file to subscribed
clients at once.  Its indexes persist in ``--state-dir`` (default
``$XDG_STATE_HOME/filemq``, see ``filemq.state``; ``--no-state`` for none).
``subscribe`` is the mirror daemon: it runs until SIGTERM/SIGINT (exit 0),
reconnecting and resyncing as needed; ``--json`` prints one JSON object per
applied change on stdout (``filemq.events``); it repairs local changes to DEST
within ``--check-interval`` seconds (default 2; see ``filemq.client``).

``ls ENDPOINT [PATH]`` prints what the server publishes under PATH (mode in octal,
``-`` when the server sends none; size, mtime in UTC, SHA-1, virtual path;
``--json``: one JSON object per file, ``mode`` as octal text) and copies nothing
(``filemq.lister``).  ``status URL`` prints what a running hub's file server
publishes and how its subscribers keep up (mounts with their files and bytes, clients,
files queued per subscriber: its lag; ``--json``: one object), read from the hub's
HTTP (``zerohub serve --console`` or ``--metrics``: ``zerohub.status_http``).
``sync`` and ``subscribe`` take ``--bwlimit RATE`` (``10M``,
``500K``: bytes per second, x1024 per letter; ``filemq.ratelimit``); ``serve`` too,
for all its clients together.  ``sync`` draws a progress bar on a terminal (files,
bytes, rate, ETA) and logs a progress line every few seconds otherwise.

What travels besides contents (``filemq.meta``): modes and mtimes always; folders
(empty ones too) and links to mirrors.  Links: ``serve`` offers those that stay
inside the mount (``--no-links``: none); ``sync``/``subscribe`` skip them with one
warning line each, make them links with ``--links``, or copy the file they lead to
with ``--copy-links``.  Setuid/setgid/sticky bits are stripped unless
``--special-bits``.  Patterns (``filemq.filters``, gitignore lines): ``serve
--exclude/--include/--exclude-from`` decide what every mount publishes;
``sync``/``subscribe`` take the same options for what the mirror takes (excluded
names in DEST are never deleted).  ``sync --dry-run`` prints what it would create,
update or delete (one ``VERB NAME`` line each on stdout) and changes nothing;
``subscribe --dry-run`` prints the same plan for its first resync and exits.
``--modify-window SECONDS`` (``sync``, ``subscribe``): mtimes within that many seconds
of the server's count as equal (rsync's option; default 0).  A
first sync into a DEST that holds files but has no saved index stops before
deleting anything (exit 1) unless ``--delete-extraneous``.

``sync`` gives up when the server has not answered within ``--timeout``
seconds (default 10), however many reconnects that leaves unused.  ``sync --once``
against a server that sends no resync-complete marker (the reference C server) ends
after ``--idle-timeout`` seconds (default 10) without file traffic with one warning
line and exit 0 (1 if that happened in the middle of a file, once ``--retries`` are
used up).

Exit codes (``zerohub.cli.ExitCode``, the same in every zerohub command): 0 success;
1 failure: the sync failed or ended with errors (refused names, files that never
verified, no answer), an endpoint in use, a key pair that exists, ``ls`` got no
listing, ``status`` got no answer or not a hub's; 2 usage (bad
option, malformed endpoint or URL, a non-loopback bind without CURVE or --insecure);
3 access refused (SRSLY, CURVE handshake failed, ``status``: HTTP 401/403/421);
4 the server answered RTFM twice; 5 another process is mirroring into DEST
(``sync``/``subscribe``: the lock
``DEST/.filemq-part-lock`` is held; the line names its pid); 130 interrupted (Ctrl-C)
before done; 141 stdout closed by its reader.
``serve``, ``subscribe`` and ``sync`` without ``--once`` stop on SIGINT/SIGTERM with 0,
from the start: they take the signals before they say they are up (``sync``: its line
``filemq: syncing ENDPOINT PATH into DEST until stopped``; ``subscribe --serve``: its
serving line).
Errors are one line on stderr, never a traceback.
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
from typing import TYPE_CHECKING, Any, TypeVar

import zmq

from filemq.engine import DEFAULT_CHUNK_SIZE, DEFAULT_CREDIT_WINDOW, DEFAULT_ENDPOINT, FilemqError
from filemq.heap import MIRROR_MMAP_THRESHOLD, keep_freed_memory
from zerohub import zmqkit
from zerohub.cli import (
    ArgumentParser,
    CommandError,
    ExitCode,
    HelpFormatter,
    StopRequest,
    UsageError,
    bind_endpoint,
    connect_endpoint,
    log_level,
    run,
    stop_signals,
    verbosity_flags,
)

if TYPE_CHECKING:  # the client module is imported by its subcommands only
    from filemq.events import MirrorEvent
    from filemq.live import LiveFileServer
    from filemq.server import FileServer

# server, client and security are imported by their subcommand only (start-up of `sync`)

log = logging.getLogger("filemq")

_T = TypeVar("_T")

#: Seconds ``filemq sync`` waits for a first answer from the server before it gives up.
DEFAULT_SYNC_TIMEOUT = 10.0


def _rate(text: str) -> int:
    """argparse ``type=`` for ``--bwlimit`` (``filemq.ratelimit.parse_rate``)."""
    from filemq.ratelimit import parse_rate

    try:
        return parse_rate(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _seconds(text: str) -> float:
    """argparse ``type=`` for a number of seconds, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected seconds (0 or more), not {text!r}")
    return value


class _Pattern(argparse.Action):
    """``--exclude``/``--include``: kept in one list, in the order given."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        ordered = list(getattr(namespace, "patterns", None) or [])
        ordered.append((self.const, values))
        namespace.patterns = ordered


def _pattern_options(command: argparse.ArgumentParser, what: str) -> None:
    command.set_defaults(patterns=[])
    command.add_argument(
        "--exclude",
        action=_Pattern,
        const="exclude",
        metavar="PATTERN",
        help=f"leave out what matches (gitignore syntax; repeatable) {what}",
    )
    command.add_argument(
        "--include",
        action=_Pattern,
        const="include",
        metavar="PATTERN",
        help="take back what an earlier pattern left out (a '!PATTERN' line)",
    )
    command.add_argument(
        "--exclude-from",
        action="append",
        default=[],
        metavar="FILE",
        help="read patterns from FILE (gitignore lines; before --exclude/--include)",
    )


def _filters(args: argparse.Namespace) -> Any:
    """The patterns of the command line (``FilterError``, a usage error, when bad)."""
    from filemq.filters import Filters

    return Filters.from_options(args.patterns, args.exclude_from) or None


def serve_options(serve: argparse.ArgumentParser) -> None:
    """The options of ``filemq serve`` (``zerohub serve`` takes them too)."""
    serve.add_argument(
        "--bind",
        type=bind_endpoint,
        default=DEFAULT_ENDPOINT,
        metavar="ENDPOINT",
        help=f"where to listen (default {DEFAULT_ENDPOINT})",
    )
    serve.add_argument(
        "--publish",
        action="append",
        required=True,
        metavar="DIR[:/virtual/path]",
        help="directory to publish (repeatable; virtual path defaults to /)",
    )
    serve.add_argument(
        "--curve-secret",
        metavar="SERVER.key_secret",
        help="the server's secret key file: serve over CURVE (with --allow)",
    )
    serve.add_argument("--allow", metavar="DIR", help="folder of allowed client public keys")
    serve.add_argument("--insecure", action="store_true", help="allow plain text off loopback")
    serve.add_argument(
        "--wire",
        choices=("spec", "czmq"),
        default="spec",
        help="wire variant: spec (RFC 35, default) or czmq (the C reference's)",
    )
    serve.add_argument(
        "--chunk-size",
        type=int,
        default=DEFAULT_CHUNK_SIZE,
        metavar="BYTES",
        help="file content per message (default %(default)s)",
    )
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
    serve.add_argument(
        "--bwlimit",
        type=_rate,
        metavar="RATE",
        help="cap what all clients together receive: bytes/s, or with K, M, G (x1024)",
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
    _pattern_options(serve, "from every published directory")
    serve.add_argument(
        "--no-links",
        action="store_true",
        help="offer no symbolic link (by default links that stay inside a mount are offered)",
    )


def _client_options(command: argparse.ArgumentParser) -> None:
    """What ``sync`` and ``subscribe`` share: where from, where to, how."""
    command.add_argument(
        "endpoint", type=connect_endpoint, help=f"the server, e.g. {DEFAULT_ENDPOINT}"
    )
    command.add_argument("dest", help="local directory kept as the mirror")
    command.add_argument("--path", default="/", help="virtual path to mirror (default /)")
    command.add_argument(
        "--wire",
        choices=("spec", "czmq"),
        default="spec",
        help="wire variant: spec (RFC 35, default) or czmq (the C reference's)",
    )
    command.add_argument(
        "--server-key", metavar="SERVER.key", help="the server's public key file (CURVE)"
    )
    command.add_argument(
        "--curve-secret", metavar="CLIENT.key_secret", help="this client's secret key file (CURVE)"
    )
    command.add_argument(
        "--window", type=int, default=DEFAULT_CREDIT_WINDOW, help="credit bytes in flight"
    )
    command.add_argument(
        "--bwlimit",
        type=_rate,
        metavar="RATE",
        help="cap the transfer rate: bytes/s, or with K, M, G (x1024): 500K, 10M",
    )
    command.add_argument(
        "--index", metavar="FILE", help="where to keep DEST's index (default: under the cache)"
    )
    command.add_argument("--no-index", action="store_true", help="do not keep an index")
    _pattern_options(command, "from what is mirrored (never deleted from DEST)")
    links = command.add_mutually_exclusive_group()
    links.add_argument(
        "--links",
        action="store_true",
        help="make symbolic links the server offers links in DEST (default: skip, warned)",
    )
    links.add_argument(
        "--copy-links",
        action="store_true",
        help="take the content of the file a link leads to (inside the server's mount)",
    )
    command.add_argument(
        "--special-bits",
        action="store_true",
        help="keep setuid, setgid and sticky bits (stripped by default)",
    )
    command.add_argument(
        "--modify-window",
        type=_seconds,
        default=0.0,
        metavar="SECONDS",
        help="mtimes this close to the server's count as equal (as rsync's; default 0)",
    )
    command.add_argument(
        "--delete-extraneous",
        action="store_true",
        help="delete what the server lacks even when DEST is not a known mirror",
    )
    command.add_argument(
        "--placer",
        choices=tuple(_PLACERS),
        default="auto",
        help="where small files are put in place: a thread of their own, or the receiving "
        "thread (inline); auto: a thread when 2 CPUs or more are ours (default)",
    )
    command.add_argument(
        "--direct-io",
        action="store_true",
        help="write files of 8 MiB and more around the page cache (O_DIRECT, where the "
        "file system allows it): less CPU on a machine whose freed memory is slow to "
        "take again (a VM whose host reclaims it); the write waits for the device",
    )


def _sync_options(sync: argparse.ArgumentParser) -> None:
    _client_options(sync)
    sync.add_argument("--once", action="store_true", help="exit when DEST matches the server")
    sync.add_argument(
        "--dry-run",
        action="store_true",
        help="print what would be created, updated or deleted; change nothing (implies --once)",
    )
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
        "--timeout",
        type=float,
        default=DEFAULT_SYNC_TIMEOUT,
        metavar="SECONDS",
        help="give up (exit 1) when the server has not answered in this long "
        "(default %(default)s)",
    )
    sync.add_argument(
        "--retries", type=int, default=3, help="reconnects after protocol errors or timeouts"
    )


def _subscribe_options(daemon: argparse.ArgumentParser) -> None:
    _client_options(daemon)
    daemon.add_argument(
        "--dry-run",
        action="store_true",
        help="print what the first resync would create, update or delete; change nothing "
        "and exit (as sync --dry-run)",
    )
    daemon.add_argument("--json", action="store_true", help="one JSON event per line on stdout")
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


def _ls_options(ls: argparse.ArgumentParser) -> None:
    ls.add_argument("endpoint", type=connect_endpoint, help=f"the server, e.g. {DEFAULT_ENDPOINT}")
    ls.add_argument("path", nargs="?", default="/", help="virtual path to list (default /)")
    ls.add_argument("--json", action="store_true", help="one JSON object per file on stdout")
    ls.add_argument(
        "--wire",
        choices=("spec", "czmq"),
        default="spec",
        help="wire variant: spec (RFC 35, default) or czmq (the C reference's)",
    )
    ls.add_argument("--server-key", metavar="SERVER.key", help="the server's public key (CURVE)")
    ls.add_argument(
        "--curve-secret", metavar="CLIENT.key_secret", help="this client's secret key file (CURVE)"
    )
    ls.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_SYNC_TIMEOUT,
        metavar="SECONDS",
        help="give up (exit 1) when the server has not answered in this long "
        "(default %(default)s)",
    )


def _status_options(status: argparse.ArgumentParser) -> None:
    status.add_argument(
        "url",
        help="the hub's console or metrics address, e.g. http://127.0.0.1:9465 "
        "(zerohub serve --console / --metrics)",
    )
    status.add_argument("--json", action="store_true", help="the figures as one JSON object")
    status.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="give up (exit 1) when the hub has not answered in this long (default %(default)s)",
    )


def _keys_options(keys: argparse.ArgumentParser) -> None:
    keys_sub = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    new = keys_sub.add_parser(
        "new",
        help="make NAME.key and NAME.key_secret",
        description="Make a CURVE key pair: NAME.key (public) and NAME.key_secret (0600).",
        formatter_class=HelpFormatter,
        parents=[_sub_flags()],
    )
    new.add_argument("name", help="file name stem of the pair (letters, digits, . _ -)")
    new.add_argument("--dir", default=".", help="folder to write the pair into (default .)")
    new.add_argument("--force", action="store_true", help="replace an existing pair of that name")


def events_options(command: argparse.ArgumentParser) -> None:
    """``--events-*``: push file events to a zerohub broker (``filemq.broker_events``)."""
    from filemq.broker_events import DEFAULT_BUFFER, DEFAULT_CHANNEL

    group = command.add_argument_group("file events to a zerohub broker")
    group.add_argument(
        "--events-broker", metavar="ENDPOINT", help="push a JSON event per file change here"
    )
    group.add_argument(
        "--events-channel",
        metavar="CHANNEL[/QUEUE]",
        help=f"the broker queue the events go to (default {DEFAULT_CHANNEL})",
    )
    group.add_argument(
        "--events-buffer",
        type=int,
        default=DEFAULT_BUFFER,
        metavar="N",
        help=f"events held while the broker is down (default {DEFAULT_BUFFER}; then dropped)",
    )
    group.add_argument("--events-server-key", metavar="FILE", help="the broker's public key")
    group.add_argument("--events-secret", metavar="FILE", help="this side's .key_secret file")


def _serve_command_options(serve: argparse.ArgumentParser) -> None:
    serve_options(serve)
    events_options(serve)


def _subscribe_command_options(daemon: argparse.ArgumentParser) -> None:
    _subscribe_options(daemon)
    events_options(daemon)
    _relay_options(daemon)


def _relay_options(daemon: argparse.ArgumentParser) -> None:
    """``subscribe --serve``: the mirror is a relay (``filemq.relay``)."""
    group = daemon.add_argument_group("relay (serve DEST live to other mirrors)")
    group.add_argument(
        "--serve",
        type=bind_endpoint,
        metavar="ENDPOINT",
        help="serve DEST at / on ENDPOINT (same protocol as serve): mirrors form a tree",
    )
    group.add_argument(
        "--serve-curve-secret",
        metavar="RELAY.key_secret",
        help="the relay's own server secret key file: serve over CURVE (with --serve-allow)",
    )
    group.add_argument(
        "--serve-allow", metavar="DIR", help="folder of public keys allowed to mirror the relay"
    )
    group.add_argument(
        "--serve-insecure", action="store_true", help="allow serving plain text off loopback"
    )
    group.add_argument(
        "--serve-state-dir",
        metavar="DIR",
        help="where the relay's index of DEST persists (default $XDG_STATE_HOME/filemq; "
        "none with --no-index)",
    )


def _relay(args: argparse.Namespace, context: zmq.Context[Any]) -> Any:
    """The relay ``subscribe --serve`` asks for, started (prints its serving line), or None."""
    if args.serve is None:
        if args.serve_curve_secret or args.serve_allow:
            raise UsageError("subscribe: --serve-curve-secret/--serve-allow need --serve")
        return None
    if (args.serve_curve_secret is None) != (args.serve_allow is None):
        raise UsageError("subscribe: --serve-curve-secret and --serve-allow go together")
    try:
        zmqkit.check_bind(
            args.serve, curve=args.serve_curve_secret is not None, insecure=args.serve_insecure
        )
    except zmqkit.SecurityError as exc:
        raise UsageError(str(exc)) from None
    from filemq.relay import Relay
    from filemq.state import default_state_dir

    state_dir = None if args.no_index else Path(args.serve_state_dir or default_state_dir())
    relay = Relay(
        context,
        args.dest,
        endpoint=args.serve,
        wire=args.wire,
        curve_secret=args.serve_curve_secret,
        allow_dir=args.serve_allow,
        insecure=args.serve_insecure,
        state_dir=state_dir,
    )
    try:
        relay.start()
    except (FilemqError, zmqkit.SecurityError, OSError) as exc:
        relay.stop()
        raise CommandError(str(exc)) from None
    print(
        f"filemq: serving {args.dest} at / on {relay.endpoint} "
        f"({index_counts(relay.server)}, relaying {args.endpoint}{args.path})",
        file=sys.stderr,
        flush=True,
    )
    return relay


def start_events(args: argparse.Namespace, origin: str) -> Any:
    """The started event publisher the ``--events-*`` options ask for, or None.  It has a
    ZeroMQ context of its own (terminated by ``stop_events``): file serving and the
    subscriber's session never wait on its sockets."""
    if not getattr(args, "events_broker", None):
        return None
    from filemq.broker_events import EventsConfigError, EventTarget

    try:
        target = EventTarget.parse(
            args.events_broker,
            args.events_channel,
            server_key=args.events_server_key,
            curve_secret=args.events_secret,
            buffer=args.events_buffer,
        )
    except EventsConfigError as exc:
        raise UsageError(str(exc)) from None
    from zerohub.file_events import publisher  # the composition layer: broker + filemq

    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    events = publisher(target, origin, context)
    events.context = context
    return events


def stop_events(events: Any) -> None:
    if events is None:
        return
    events.stop(timeout=8.0)
    events.context.destroy(linger=0)
    stats = events.stats()
    log.info(
        "file events: %d pushed to the broker, %d dropped (buffer full), %d not pushed",
        stats["published"],
        stats["dropped"],
        stats["buffered"],
    )


_COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]] = {
    "serve": ("publish directories", _serve_command_options),
    "sync": ("mirror a server path into DEST", _sync_options),
    "subscribe": ("keep DEST a live mirror of a server path", _subscribe_command_options),
    "ls": ("list what a server publishes (modes, sizes, SHA-1...), copying nothing", _ls_options),
    "status": (
        "what a running hub's file server publishes: mounts, files, bytes, subscribers "
        "and their lag (exit 1: no answer, 2: bad URL, 3: refused)",
        _status_options,
    ),
    "keys": ("CURVE certificates", _keys_options),
    "manifest": ("make, import (as an index) or compare Parquet manifests of a tree",
                 lambda parser: _manifest_module().manifest_options(parser)),
}  # fmt: skip


def _manifest_module() -> Any:
    from filemq import manifest_cli  # only `filemq manifest` pays for its import

    return manifest_cli


@functools.cache
def _sub_flags() -> ArgumentParser:
    """``-v``/``-q`` for every subcommand (they work before and after its name)."""
    return verbosity_flags(top=False)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The command line parser; with ``argv``, only the named command gets its options.

    (Every ``filemq sync`` builds this parser: the options of the other commands
    would cost ~4 ms of its start-up.)
    """
    words = sys.argv[1:] if argv is None else argv
    command = next((w for w in words if not w.startswith("-")), None)
    wanted = command if command in _COMMANDS else None  # unknown or none: build all (help)
    parser = ArgumentParser(
        prog="filemq",
        description="FILEMQ v2 file distribution",
        formatter_class=HelpFormatter,
        parents=[verbosity_flags(top=True)],
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (about, add_options) in _COMMANDS.items():
        command_parser = sub.add_parser(
            name,
            help=about,
            description=about[0].upper() + about[1:] + ".",
            formatter_class=HelpFormatter,
            parents=[_sub_flags()],
        )
        if wanted is None or wanted == name:
            add_options(command_parser)
    return parser


def wait_for_stop(
    stop: StopRequest, checked: threading.Event | None, on_checked: Callable[[], None]
) -> None:
    """Return once a stop was asked (a server's normal end: exit 0); meanwhile call
    ``on_checked`` once, as soon as ``checked`` is set (None: nothing to wait for)."""
    while not stop.wait(0.02 if checked is not None else 0.5):
        if checked is not None and checked.is_set():
            checked = None
            on_checked()


def check_serve(args: argparse.Namespace, also_bind: Sequence[str] = ()) -> None:
    """UsageError for ``serve`` options that do not go together, or a bind the policy
    refuses (``--bind`` and ``also_bind``: plain text off loopback needs --insecure)."""
    if (args.curve_secret is None) != (args.allow is None):
        raise UsageError("serve: --curve-secret and --allow go together")
    for endpoint in (args.bind, *also_bind):
        try:
            zmqkit.check_bind(
                endpoint, curve=args.curve_secret is not None, insecure=args.insecure
            )
        except zmqkit.SecurityError as exc:
            raise UsageError(str(exc)) from None


def file_server(
    args: argparse.Namespace, context: zmq.Context[zmq.Socket[bytes]], events: Any = None
) -> LiveFileServer:
    """The file server ``serve``'s options describe (not bound yet)."""
    from filemq.live import LiveFileServer
    from filemq.server import Mount
    from filemq.state import default_state_dir

    mounts = [Mount.parse(spec) for spec in args.publish]
    state_dir = None if args.no_state else Path(args.state_dir or default_state_dir())
    return LiveFileServer(
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
        bwlimit=args.bwlimit,
        filters=_filters(args),
        links=not args.no_links,
        events=events,
    )


def index_counts(server: FileServer) -> str:
    """How many files the server's indexes hold and how many of them are hashed."""
    files = sum(len(index) for index in server.indexes.values())
    hashed = sum(index.hashed_files for index in server.indexes.values())
    return f"{files} files, {hashed} hashed"


def serving_counts(server: FileServer) -> tuple[str, bool]:
    """The counts a serving line may show, and whether they are still being checked.

    Counts loaded from a saved index are not true until the server has checked them
    against the disk (``Server.verified``): they are then said to be the saved index's,
    and the caller says the true ones once the check is done (:func:`index_counts`).
    """
    checking = not server.verified.is_set()  # read once: the line and the wait agree
    files = sum(len(index) for index in server.indexes.values())
    if checking:
        return f"{files} files in the saved index, checking them against the disk", True
    return index_counts(server), False


def _published(args: argparse.Namespace) -> str:
    """The published trees as the serving lines name them, in the command line's order."""
    from filemq.server import Mount

    return ", ".join(f"{m.directory} at {m.virtual}" for m in map(Mount.parse, args.publish))


def report_serving(prog: str, args: argparse.Namespace, live: LiveFileServer) -> bool:
    """The line on stderr that says a started file server serves (and where); True if
    its counts are the saved index's, still being checked (see :func:`report_checked`)."""
    server = live.server
    watching = "not watching" if args.no_watch else "polling" if args.poll else "watching"
    counts, checking = serving_counts(server)
    print(
        f"{prog}: serving {_published(args)} on {server.endpoint} ({counts}, {watching})",
        file=sys.stderr,
        flush=True,
    )
    return checking


def report_checked(prog: str, where: str, server: FileServer) -> None:
    """The line on stderr once the saved indexes were checked against the disk."""
    print(
        f"{prog}: checked {where} against the disk ({index_counts(server)})",
        file=sys.stderr,
        flush=True,
    )


def _serve(args: argparse.Namespace) -> int:
    check_serve(args)
    # from here on a signal asks for the stop and nothing else, until the stop is done
    with stop_signals("filemq") as stop:
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        events = None
        try:
            events = start_events(args, f"filemq serve {args.bind}")
            live = file_server(args, context, events)
            try:
                live.start()  # binds before a directory is walked or hashed: in use fails
                checking = report_serving("filemq", args, live)
                server = live.server
                wait_for_stop(
                    stop,
                    server.verified if checking else None,
                    lambda: report_checked("filemq", _published(args), server),
                )
            finally:
                live.stop()
        finally:
            stop_events(events)
            context.term()
    return 0


def _has_files(root: Path) -> bool:
    """True once a file (not one of our temp files) is found under ``root``."""
    from filemq.mirror import TEMP_PREFIX

    try:
        with os.scandir(root) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    if _has_files(Path(entry.path)):
                        return True
                elif not entry.name.startswith(TEMP_PREFIX):
                    return True
    except OSError:
        pass
    return False


def _warn_if_nothing(args: argparse.Namespace) -> None:
    """After a resync: an empty DEST for a --path other than / is most likely a typo."""
    if args.path.strip("/") and not _has_files(Path(args.dest)):
        log.warning(
            "the server at %s has no files under %s (is --path right?)", args.endpoint, args.path
        )


def _check_pair(args: argparse.Namespace) -> None:
    if (args.curve_secret is None) != (args.server_key is None):
        raise UsageError(f"{args.command}: --curve-secret and --server-key go together")


#: ``--placer``: ``SyncClient(place_inline=...)`` (None: chosen by the CPUs the mirror has)
_PLACERS = {"auto": None, "thread": False, "inline": True}


def _mirror_options(args: argparse.Namespace) -> dict[str, Any]:
    """What ``sync`` and ``subscribe`` give their client about metadata and patterns."""
    from filemq.meta import LinkPolicy

    links = LinkPolicy.SKIP
    if args.links:
        links = LinkPolicy.LINKS
    elif args.copy_links:
        links = LinkPolicy.COPY
    return {
        "filters": _filters(args),
        "links": links,
        "special_bits": args.special_bits,
        "delete_extraneous": args.delete_extraneous,
        "modify_window": args.modify_window,
        "place_inline": _PLACERS[args.placer],
        "direct_io": args.direct_io,
    }


class _StopSignals:
    """SIGINT/SIGTERM stop the mirrors of a daemon (``sync`` without ``--once``,
    ``subscribe``) from the moment this is made: taken before the command says it is up
    (its readiness line), a signal that comes before a mirror exists stops that mirror
    as soon as it is attached (``attach``), so the command ends cleanly (exit 0)."""

    def __init__(self) -> None:
        self.asked = False
        self._stops: list[Callable[[], None]] = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: object) -> None:
        self.asked = True
        for stop in self._stops:
            stop()

    def attach(self, stop: Callable[[], None]) -> None:
        """``stop`` is called on a signal, or now when one came already."""
        self._stops.append(stop)
        if self.asked:
            stop()


def _sync(args: argparse.Namespace) -> int:
    # a daemon takes its signals first (see _StopSignals), then says it is up
    signals = None if args.once or args.dry_run else _StopSignals()
    from filemq.client import SyncClient, default_index_path
    from filemq.paths import virtual_path

    _check_pair(args)
    index = None if args.no_index else (args.index or default_index_path(args.dest))
    warned = False

    def on_event(event: MirrorEvent) -> None:
        nonlocal warned
        if event.kind == "resync-complete" and not warned:
            warned = True
            _warn_if_nothing(args)

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
        bwlimit=args.bwlimit,
        progress=None if args.dry_run else sys.stderr,
        # (--once: checked once at the end; an event per file would cost a no-change sync)
        on_event=None if args.once or args.dry_run else on_event,
        dry_run=args.dry_run,
        plan=sys.stdout if args.dry_run else None,
        **_mirror_options(args),
    )
    if signals is not None:
        signals.attach(client.stop)
        path = virtual_path(args.path, directory=True)  # (a bad one: its one line only)
        print(
            f"filemq: syncing {args.endpoint}{path} into {args.dest} until stopped",
            file=sys.stderr,
            flush=True,
        )
    result = _run_client(client.run, context)
    log.info(
        "%d files (%d bytes) received, %d deleted, %d refused, %d errors",
        result.files,
        result.bytes,
        result.deleted,
        result.refused,
        result.errors,
    )
    if args.once and result.synced and not result.files:
        _warn_if_nothing(args)
    once = args.once or args.dry_run
    return 1 if result.errors or (once and not result.synced) else 0


def _subscribe(args: argparse.Namespace) -> int:
    from filemq.client import default_index_path
    from filemq.subscriber import Subscriber

    _check_pair(args)
    if args.dry_run:  # the plan of the first resync: what sync --dry-run prints
        args.once, args.idle_timeout, args.retries = True, 10.0, 3
        return _sync(args)
    output_closed = False
    warned = False

    def on_event(event: MirrorEvent) -> None:
        nonlocal output_closed, warned
        if relay is not None:
            relay.applied(event)
        if events is not None:
            events.applied(event)
        if event.kind == "resync-complete" and not warned:
            warned = True
            _warn_if_nothing(args)
        if args.json and not output_closed:
            try:
                print(event.to_json(), flush=True)
            except BrokenPipeError:  # `| head`: nobody reads the events any more; stop
                output_closed = True
                subscriber.client.stop()

    # Signals are taken before the relay serves (its serving line tells the world it is
    # up): one that comes before the mirror exists stops the mirror as it is made.
    signals = _StopSignals()
    index = None if args.no_index else (args.index or default_index_path(args.dest))
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        relay = _relay(args, context)
    except BaseException:
        context.term()
        raise
    events = start_events(args, f"filemq subscribe {args.dest}")
    subscriber = Subscriber(
        args.endpoint,
        args.dest,
        path=args.path,
        context=context,
        on_event=on_event,
        index_path=index,
        heartbeat=args.heartbeat,
        timeout=args.timeout,
        connect_timeout=args.timeout,
        backoff_cap=args.max_backoff,
        check_interval=args.check_interval,
        bwlimit=args.bwlimit,
        progress=sys.stderr,
        wire=args.wire,
        window=args.window,
        curve_secret=args.curve_secret,
        server_key=args.server_key,
        **_mirror_options(args),
    )
    signals.attach(subscriber.client.stop)
    log.info("mirroring %s%s into %s", args.endpoint, args.path, args.dest)

    def mirror() -> Any:
        try:
            return subscriber.run()
        finally:
            if relay is not None:  # (before the context is terminated)
                relay.stop()

    try:
        result = _run_client(mirror, context)
    finally:
        stop_events(events)
    if output_closed:
        raise BrokenPipeError  # exit 141, quietly
    log.info(
        "stopped: %d files (%d bytes) received, %d deleted, %d errors",
        result.files,
        result.bytes,
        result.deleted,
        result.errors,
    )
    return 0


def _ls(args: argparse.Namespace) -> int:
    import json
    from datetime import UTC, datetime

    from filemq.lister import list_files

    _check_pair(args)
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    files = _run_client(
        lambda: list_files(
            context,
            args.endpoint,
            args.path,
            wire=args.wire,
            curve_secret=args.curve_secret,
            server_key=args.server_key,
            timeout=args.timeout,
        ),
        context,
    )
    for f in files:
        when = datetime.fromtimestamp(f.mtime_ns / 1e9, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        if args.json:
            fields: dict[str, Any] = {
                "path": f.path,
                "size": f.size,
                "mtime_ns": f.mtime_ns,
                "mtime": when,
                "sha1": f.sha1,
            }
            if f.mode >= 0:
                fields["mode"] = format(f.mode, "o")
            if f.headers:
                fields["headers"] = f.headers
            print(json.dumps(fields, ensure_ascii=False, separators=(",", ":")))
        else:
            mode = format(f.mode, "04o") if f.mode >= 0 else "-"
            print(f"{mode:>4}  {f.size:>14}  {when}  {f.sha1:40}  {f.path}")
    if not files:
        log.warning("the server at %s publishes no files under %s", args.endpoint, args.path)
    return 0


def _status(args: argparse.Namespace) -> int:
    """``filemq status URL``: the figures of a running hub's file server (its HTTP)."""
    import json

    from zerohub.status_http import StatusError, check_url, files_status

    url = check_url(args.url)  # ValueError: a usage error (2)
    if args.timeout <= 0:
        raise UsageError("status: --timeout must be positive")
    try:
        figures = files_status(url, args.timeout)
    except StatusError as exc:
        raise CommandError(str(exc), ExitCode.REFUSED if exc.refused else ExitCode.FAILURE)
    if args.json:
        print(json.dumps(figures, ensure_ascii=False, sort_keys=True, separators=(",", ":")))
        return 0
    subscribers = figures.get("subscribers") or []
    lag = sum(int(s.get("queued", 0)) for s in subscribers)
    print(
        f"{len(figures.get('mounts') or [])} mounts, {figures.get('files', 0)} files, "
        f"{figures.get('bytes', 0)} bytes; {figures.get('clients', 0)} subscribers, "
        f"{lag} files queued (lag); sent {figures.get('sent_files', 0)} files, "
        f"{figures.get('sent_bytes', 0)} bytes; {figures.get('resyncs', 0)} resyncs, "
        f"{figures.get('rescans', 0)} rescans, "
        f"{figures.get('watcher_overflows', 0)} watcher overflows"
    )
    for m in figures.get("mounts") or []:
        where = f"  {m['dir']}" if m.get("dir") else ""
        print(f"mount {m['at']}: {m.get('files', 0)} files, {m.get('bytes', 0)} bytes{where}")
    for sub in subscribers:
        paths = " ".join(sub.get("paths") or [])
        sent = f", sent {sub['sent_files']} files" if "sent_files" in sub else ""
        print(f"subscriber {sub['client']}: {sub['queued']} files queued{sent}  {paths}".rstrip())
    return 0


def _run_client(run: Callable[[], _T], context: zmq.Context[Any]) -> _T:
    """Run a sync or subscribe session; a failure becomes a CommandError with its code.

    3: access refused (SRSLY, or the CURVE handshake failed); 4: the server rejected the
    protocol (RTFM); 5: DEST is locked by another process; 1: any other session error.
    The context is terminated either way.
    """
    from filemq.client import SyncError, SyncRefused, SyncRejected
    from filemq.destlock import DestLocked

    try:
        return run()
    except DestLocked as exc:
        raise CommandError(str(exc), ExitCode.LOCKED) from None
    except SyncRefused as exc:
        raise CommandError(str(exc), ExitCode.REFUSED) from None
    except SyncRejected as exc:
        raise CommandError(str(exc), ExitCode.REJECTED) from None
    except SyncError as exc:
        raise CommandError(str(exc)) from None
    finally:
        context.term()


def _keys(args: argparse.Namespace) -> int:
    public, secret = zmqkit.new_certificate(args.name, args.dir, force=args.force)
    print(f"{public}\n{secret}")
    return 0


def _manifest(args: argparse.Namespace) -> int:
    return int(_manifest_module().run_manifest(args))


_RUN = {
    "serve": _serve,
    "sync": _sync,
    "subscribe": _subscribe,
    "ls": _ls,
    "status": _status,
    "keys": _keys,
    "manifest": _manifest,
}


def _command(argv: Sequence[str] | None) -> int:
    parser = build_parser(argv)
    args, extra = parser.parse_known_args(argv)
    if args.command == "manifest" and not any(word.startswith("-") for word in extra):
        args.operands += extra  # `manifest diff --spark A B`: operands on both sides
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    logging.basicConfig(
        level=log_level(args, logging.INFO), format="%(levelname)s %(name)s: %(message)s"
    )
    if args.command == "serve":
        keep_freed_memory()  # chunk buffers reused, not faulted in afresh (filemq.heap)
    if argv is None and args.command == "sync" and args.once:
        # a short-lived process that makes almost no reference cycles: the collector's
        # passes over DEST's index (10,000 entries) would cost ~10 ms of a no-change sync
        gc.disable()
    if argv is None and args.command == "sync":
        # received chunks reused, not faulted in afresh; big blocks mapped (filemq.heap)
        keep_freed_memory(MIRROR_MMAP_THRESHOLD)
    try:
        return _RUN[args.command](args)
    except (CommandError, BrokenPipeError):
        raise
    except ValueError as exc:  # a value on the command line (--path, --publish, ...)
        raise UsageError(str(exc)) from None
    except Exception as exc:
        if not isinstance(exc, expected_errors()):
            raise
        raise CommandError(str(exc)) from None
    finally:
        if argv is None:
            # the program exits next: put every object out of the collector's reach, so
            # the interpreter's last collection skips them (~10 ms with a 10,000-file index)
            gc.freeze()


def expected_errors() -> tuple[type[Exception], ...]:
    """Errors reported as one line (exit 1)."""
    return (FilemqError, OSError, zmq.ZMQError, zmqkit.SecurityError)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: this program's arguments); the exit code.

    Exit codes: ``zerohub.cli.ExitCode`` (0 ok, 1 failure, 2 usage, 3 refused,
    4 rejected, 130 interrupted, 141 output closed).
    """
    return run("filemq", lambda: _command(argv))
