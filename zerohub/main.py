"""The ``zerohub`` command: ``zerohub serve`` runs a FILEMQ server and the broker in one
process (:mod:`zerohub.hub`), with optional metrics and web console.

Two ways to say what to serve:

* ``zerohub serve --config hub.toml``: everything from one TOML file
  (:mod:`zerohub.config`; ``examples/hub.toml`` shows every key).  The file server's
  options and ``--broker-bind`` are then refused on the command line (the file says
  it); ``--metrics``, ``--console`` and the logging options override the file.
* ``zerohub serve --publish DIR ...``: every option of ``filemq serve`` (same meaning,
  same defaults) and ``--broker-bind``; the broker gets the file server's CURVE keys,
  allow-list and ``--insecure``, and its default settings.

``--metrics [HOST:PORT]`` serves Prometheus metrics (default ``127.0.0.1:9464``),
``--console [HOST:PORT]`` the web console (default ``127.0.0.1:9465``); both are off
unless asked for, and listen on loopback only.  ``--log-level``, ``--log-format
text|json`` and ``--log-file`` apply to both services (``-v``/``-q`` move the level one
step when ``--log-level`` is not given).

SIGINT or SIGTERM stops it (exit 0); more of them while it stops change nothing (a
stop cut half-way would leave sockets open).  Ctrl-C while it is still starting
(walking and hashing what it publishes) ends it with 130.

It follows :mod:`zerohub.cli`'s rules: one line and an exit code for anything that goes
wrong, never a traceback.  Exit codes: 0 stopped by SIGINT/SIGTERM; 1 failure (an
endpoint or HTTP port in use, an unreadable directory, key or log file); 2 usage (a bad
option; a config file that cannot be read, is not TOML, or has an unknown key, a value
of the wrong type or out of range, a published directory that does not exist: the line
names the file, the line when it can be found, and the key).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import zmq

from broker.server.options import ServerError
from filemq import cli as filemq_cli
from zerohub import logs
from zerohub.cli import (
    ArgumentParser,
    CommandError,
    UsageError,
    bind_endpoint,
    log_level,
    run,
    stop_signals,
    verbosity_flags,
)
from zerohub.config import (
    BROKER_ENDPOINT,
    CONSOLE_ADDRESS,
    LOG_FORMATS,
    LOG_LEVELS,
    METRICS_ADDRESS,
    BrokerConfig,
    FilesConfig,
    HubConfig,
    LoggingConfig,
    MetricsConfig,
    PublishConfig,
    split_address,
)
from zerohub.httpd import HttpError
from zerohub.hub import Hub, HubEndpoints, build

__all__ = ["DEFAULT_BROKER_ENDPOINT", "build_parser", "main"]

log = logging.getLogger("zerohub")

DEFAULT_BROKER_ENDPOINT = BROKER_ENDPOINT

#: Options that only the config file may set once there is one.
_HUB_ONLY = ("config", "metrics", "console", "log_level", "log_format", "log_file")


def _http_address(text: str) -> str:
    """argparse ``type=`` for ``--metrics``/``--console``: a loopback HOST:PORT."""
    try:
        split_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="zerohub",
        description="zerohub: files (FILEMQ) and messages (the broker) in one process",
        parents=[verbosity_flags(top=True)],
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    about = "publish directories over FILEMQ and run the broker beside them"
    serve = sub.add_parser(
        "serve",
        help=about,
        description=about[0].upper() + about[1:] + ".",
        parents=[verbosity_flags(top=False)],
    )
    serve.add_argument(
        "--config",
        metavar="FILE",
        help="read everything from this TOML file (see examples/hub.toml)",
    )
    filemq_cli.serve_options(serve)
    for action in serve._actions:
        if action.dest == "publish":
            action.required = False  # (or the config file's [[files.publish]])
    serve.add_argument(
        "--broker-bind",
        type=bind_endpoint,
        default=DEFAULT_BROKER_ENDPOINT,
        metavar="ENDPOINT",
        help=f"where the broker listens (default {DEFAULT_BROKER_ENDPOINT}; same CURVE "
        "keys, allow-list and --insecure as the file server; default broker settings)",
    )
    serve.add_argument(
        "--data",
        metavar="DIR",
        help="keep the broker's saved messages in DIR (the durable log; default: memory)",
    )
    serve.add_argument(
        "--metrics",
        nargs="?",
        const=METRICS_ADDRESS,
        type=_http_address,
        metavar="HOST:PORT",
        help=f"serve Prometheus metrics on http://HOST:PORT/metrics (default {METRICS_ADDRESS}; "
        "loopback only)",
    )
    serve.add_argument(
        "--console",
        nargs="?",
        const=CONSOLE_ADDRESS,
        type=_http_address,
        metavar="HOST:PORT",
        help=f"serve the web console on http://HOST:PORT/ (default {CONSOLE_ADDRESS}; "
        "loopback only)",
    )
    serve.add_argument("--log-level", choices=LOG_LEVELS, help="log this level and above")
    serve.add_argument("--log-format", choices=LOG_FORMATS, help="text (default) or json lines")
    serve.add_argument("--log-file", metavar="FILE", help="append the log to FILE, not stderr")
    return parser


def _given(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The serve options (besides the hub's own) set to something other than their default."""
    serve = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[
        "serve"
    ]
    out = []
    for action in serve._actions:
        dest = action.dest
        if dest in _HUB_ONLY or dest in ("help", "verbose", "quiet") or not action.option_strings:
            continue
        if getattr(args, dest, None) not in (action.default, None, [], False):
            out.append(action.option_strings[-1])
    if getattr(args, "patterns", None):
        out.append("--exclude/--include")
    return out


def _from_options(args: argparse.Namespace) -> HubConfig:
    """The configuration the ``filemq serve``-style options describe."""
    from filemq.filters import Filters
    from filemq.server import Mount

    if not args.publish:
        raise UsageError("serve: --publish DIR or --config FILE is required")
    filemq_cli.check_serve(args, also_bind=(args.broker_bind,))
    mounts = [Mount.parse(spec) for spec in args.publish]
    lines = Filters.from_options(args.patterns, args.exclude_from).lines
    curve = None if args.curve_secret is None else Path(args.curve_secret)
    allow = None if args.allow is None else Path(args.allow)
    files = FilesConfig(
        bind=args.bind,
        publish=tuple(PublishConfig(m.directory, m.virtual) for m in mounts),
        curve_secret=curve,
        allow=allow,
        insecure=args.insecure,
        wire=args.wire,
        chunk_size=args.chunk_size,
        deny=tuple(args.deny),
        client_ttl=args.client_ttl,
        rescan=args.rescan,
        bwlimit=args.bwlimit or 0,
        watch=not args.no_watch,
        poll=args.poll,
        poll_interval=args.poll_interval,
        settle=args.settle,
        state_dir=None if args.state_dir is None else Path(args.state_dir),
        state=not args.no_state,
        exclude=tuple(lines),
        links=not args.no_links,
    )
    broker = BrokerConfig(
        bind=args.broker_bind,
        curve_secret=curve,
        allow=allow,
        insecure=args.insecure,
        data=None if args.data is None else Path(args.data),
    )
    return HubConfig(files=files, broker=broker)


def _configure(parser: argparse.ArgumentParser, args: argparse.Namespace) -> HubConfig:
    import dataclasses

    from zerohub import config as hub_config

    if args.config is not None:
        given = _given(parser, args)
        if given:
            raise UsageError(f"serve: {given[0]} goes in the config file with --config")
        config = hub_config.load(args.config)
    else:
        config = _from_options(args)
    changes: dict[str, object] = {}
    if args.metrics is not None:
        changes["metrics"] = MetricsConfig(enabled=True, address=args.metrics)
    if args.console is not None:
        changes["console"] = dataclasses.replace(
            config.console, enabled=True, address=args.console
        )
    logging_ = config.logging
    changes["logging"] = LoggingConfig(
        level=args.log_level or logging_.level,
        format=args.log_format or logging_.format,
        file=Path(args.log_file) if args.log_file else logging_.file,
    )
    config = dataclasses.replace(config, **changes)  # type: ignore[arg-type]
    return hub_config.check(config)


def _start_logging(args: argparse.Namespace, config: HubConfig) -> None:
    chosen = config.logging
    level = getattr(logging, chosen.level.upper())
    if args.log_level is None:  # -v / -q move the file's (or the default) level a step
        level = log_level(args, level)
    try:
        logs.configure(level, chosen.format, chosen.file)
    except OSError as exc:
        raise CommandError(f"cannot open log file {chosen.file}: {exc.strerror}") from None


def _report(config: HubConfig, hub: Hub, endpoints: HubEndpoints) -> bool:
    """The serving lines; True if the file counts are the saved index's, still being
    checked against the disk (:func:`filemq.cli.report_checked` says the true ones)."""
    server = hub.files.server
    counts, checking = filemq_cli.serving_counts(server)
    f = config.files
    watching = "not watching" if not f.watch else "polling" if f.poll else "watching"
    lines = [f"broker serving on {endpoints.broker}"]
    for name, url in endpoints.http.items():
        if name == "console" and not config.console.token:
            lines.append(f"console on {url}/#token={hub.console_token}")
        elif name == "console":
            lines.append(f"console on {url}/ (actions need [console] token)")
        else:
            lines.append(f"{name} on {url}/")
    lines.append(f"serving {_published(config)} on {endpoints.files} ({counts}, {watching})")
    for line in lines:
        print(f"zerohub: {line}", file=sys.stderr, flush=True)
    return checking


def _published(config: HubConfig) -> str:
    return ", ".join(f"{p.dir} at {p.at}" for p in config.files.publish)


def _serve(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    config = _configure(parser, args)
    _start_logging(args, config)
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        hub = build(config, context)
        endpoints = hub.start()  # stops what it started if it fails (Ctrl-C too: 130)
    except BaseException as exc:
        context.term()
        if isinstance(exc, ServerError):
            raise CommandError(f"broker: {exc}") from None
        raise
    # from here on a signal stops the hub, however many come (zerohub.cli.stop_signals)
    with stop_signals("zerohub") as stop:
        try:
            try:
                checking = _report(config, hub, endpoints)
                server = hub.files.server
                filemq_cli.wait_for_stop(
                    stop,
                    server.verified if checking else None,
                    lambda: filemq_cli.report_checked("zerohub", _published(config), server),
                )
            finally:
                hub.stop()
        finally:
            context.term()
    return 0


def _command(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=log_level(args, logging.INFO), format=logs.TEXT_FORMAT)
    try:
        return _serve(parser, args)
    except (CommandError, BrokenPipeError):
        raise
    except HttpError as exc:
        raise CommandError(str(exc)) from None
    except ValueError as exc:  # a value on the command line (--publish, ...)
        raise UsageError(str(exc)) from None
    except Exception as exc:
        if not isinstance(exc, (*filemq_cli.expected_errors(), ServerError)):
            raise
        raise CommandError(str(exc)) from None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: this program's arguments); the exit code.

    Exit codes: ``zerohub.cli.ExitCode`` (0 ok, 1 failure, 2 usage, 130 interrupted).
    """
    return run("zerohub", lambda: _command(argv))
