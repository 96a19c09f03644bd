"""The ``zerohub`` command: ``zerohub serve`` runs a FILEMQ server and the broker in one
process (:mod:`zerohub.hub`).

It takes every option of ``filemq serve`` (same meaning, same defaults) and
``--broker-bind``; the broker gets the file server's CURVE keys, allow-list and
``--insecure``, and its default settings (``broker serve --config`` tunes a broker of
its own).  It follows :mod:`zerohub.cli`'s rules: one line and an exit code for
anything that goes wrong, ``-v``/``-q``, a help text for every option.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

import zmq

from broker.engine.engine import Engine
from broker.server.options import ServerError, ServerOptions
from broker.server.server import Server
from filemq import cli as filemq_cli
from zerohub.cli import (
    ArgumentParser,
    CommandError,
    UsageError,
    bind_endpoint,
    log_level,
    run,
    verbosity_flags,
)
from zerohub.hub import Hub

__all__ = ["DEFAULT_BROKER_ENDPOINT", "build_parser", "main"]

DEFAULT_BROKER_ENDPOINT = "tcp://127.0.0.1:5680"


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
    filemq_cli.serve_options(serve)
    serve.add_argument(
        "--broker-bind",
        type=bind_endpoint,
        default=DEFAULT_BROKER_ENDPOINT,
        metavar="ENDPOINT",
        help=f"where the broker listens (default {DEFAULT_BROKER_ENDPOINT}; same CURVE "
        "keys, allow-list and --insecure as the file server; default broker settings)",
    )
    return parser


def _serve(args: argparse.Namespace) -> int:
    filemq_cli.check_serve(args, also_bind=(args.broker_bind,))
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        files = filemq_cli.file_server(args, context)
        broker = Server(
            Engine(),
            ServerOptions(
                endpoint=args.broker_bind,
                curve_secret=args.curve_secret,
                allow_dir=args.allow,
                insecure=args.insecure,
            ),
            context=context,
        )
        hub = Hub(files, broker)
        try:
            endpoints = hub.start()  # stops what it started if it fails
        except ServerError as exc:
            raise CommandError(f"broker: {exc}") from None
        try:
            print(f"zerohub: broker serving on {endpoints.broker}", file=sys.stderr, flush=True)
            filemq_cli.report_serving("zerohub", args, files)
            filemq_cli.wait_for_signal()
        finally:
            hub.stop()
    finally:
        context.term()
    return 0


def _command(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=log_level(args, logging.INFO), format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        return _serve(args)
    except (CommandError, BrokenPipeError):
        raise
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
