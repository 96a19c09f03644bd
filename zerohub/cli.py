"""The rules every zerohub command line follows (``zproto``, ``filemq``, ``broker``).

A command ends with one of these exit codes, the same meaning in every program:

====  ===========  ===========================================================
code  name         meaning
====  ===========  ===========================================================
0     OK           done
1     FAILURE      it ran and failed: no answer, an error status, a bind that
                   failed (port in use), a file it could not read or write
2     USAGE        the command line or config file is wrong (unknown option,
                   malformed endpoint, options that go together); nothing ran
3     REFUSED      access refused: CURVE handshake failed (no keys, key not
                   allowed), a token or key the server refuses
4     REJECTED     the peer rejected the protocol (``filemq``: RTFM twice)
5     LOCKED       another process holds what the command needs (``filemq``:
                   another mirror of the same DEST; the line names its pid)
130   INTERRUPTED  Ctrl-C (SIGINT) stopped a command that had not finished
141   BROKEN_PIPE  the reader of its output went away (``... | head``): the
                   command stops quietly, as a tool killed by SIGPIPE does
====  ===========  ===========================================================

Long-running commands (``serve``, ``filemq subscribe``, ``broker consume``) stop
normally on SIGINT/SIGTERM and exit 0.

Anything that goes wrong is ONE line on stderr, ``PROG: what happened``; never a
traceback.  Usage errors too (``PROG: error (see PROG --help)``): :class:`ArgumentParser`
does not print the usage block.  ``-v``/``-q`` work before or after the subcommand
(:func:`verbosity_flags`).  Endpoints typed on a command line are checked before
anything is opened (:func:`connect_endpoint`, :func:`bind_endpoint`).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterator
from enum import IntEnum
from typing import NoReturn

__all__ = [
    "ArgumentParser",
    "CommandError",
    "ExitCode",
    "UsageError",
    "bind_endpoint",
    "check_endpoint",
    "connect_endpoint",
    "log_level",
    "run",
    "verbosity_flags",
]


class ExitCode(IntEnum):
    """Exit codes of every zerohub command (see the module docstring)."""

    OK = 0
    FAILURE = 1
    USAGE = 2
    REFUSED = 3
    REJECTED = 4
    LOCKED = 5
    INTERRUPTED = 130
    BROKEN_PIPE = 141


class CommandError(Exception):
    """Ends a command: ``PROG: message`` on stderr and ``code`` as the exit status."""

    def __init__(self, message: str, code: ExitCode = ExitCode.FAILURE) -> None:
        super().__init__(message)
        self.code = code


class UsageError(CommandError):
    """The command line or a config file is wrong (exit 2)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, ExitCode.USAGE)


class ArgumentParser(argparse.ArgumentParser):
    """argparse, with usage errors on one line: ``PROG: error (see PROG --help)``, exit 2.

    Subcommand parsers made by ``add_subparsers().add_parser`` are of this class too.
    """

    def error(self, message: str) -> NoReturn:
        self.exit(ExitCode.USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def verbosity_flags(*, top: bool) -> ArgumentParser:
    """A parent parser holding ``-v``/``--verbose`` (repeatable) and ``-q``/``--quiet``.

    Give ``top=True``'s to the program's parser and ``top=False``'s to every
    subcommand (``parents=[...]``): the subcommand's copy has no default, so a flag
    given before the subcommand's name is kept and one given after it counts too.
    """
    flags = ArgumentParser(add_help=False)
    unset = argparse.SUPPRESS
    flags.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0 if top else unset,
        help="more detail on stderr (repeat for more)",
    )
    flags.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=False if top else unset,
        help="only warnings and errors on stderr",
    )
    return flags


def log_level(args: argparse.Namespace, default: int = logging.INFO) -> int:
    """The logging level ``-v``/``-q`` ask for: one step (10) per ``-v``, one up for ``-q``."""
    level = default - 10 * int(args.verbose) + (10 if args.quiet else 0)
    return min(max(level, logging.DEBUG), logging.CRITICAL)


# -- endpoints -------------------------------------------------------------------------

_EXPECTED = "expected tcp://HOST:PORT or ipc://PATH"


def check_endpoint(text: str, *, bind: bool = False) -> str:
    """``text`` if it is an endpoint to connect to (or, ``bind``, to bind); else UsageError.

    tcp (``tcp://HOST:PORT``; a bind may use ``*`` for the host and the port) and ipc
    (``ipc://PATH``) are what zerohub's servers and clients use across processes.
    """
    transport, sep, address = text.partition("://")
    if not sep:
        hint = f" (tcp://{text}?)" if ":" in text and "/" not in text else ""
        raise UsageError(f"bad endpoint {text!r}: {_EXPECTED}{hint}")
    if transport == "ipc":
        if not address:
            raise UsageError(f"bad endpoint {text!r}: ipc:// needs a PATH")
        return text
    if transport != "tcp":
        raise UsageError(
            f"bad endpoint {text!r}: unsupported transport {transport!r}; {_EXPECTED}"
        )
    host, colon, port = address.rpartition(";")[2].rpartition(":")
    if not colon or not host:
        raise UsageError(f"bad endpoint {text!r}: {_EXPECTED}")
    if bind and port == "*":
        return text
    lowest = 0 if bind else 1
    if not port.isdigit() or not lowest <= int(port) <= 65535:
        raise UsageError(f"bad endpoint {text!r}: port must be a number {lowest}..65535")
    return text


def connect_endpoint(text: str) -> str:
    """argparse ``type=`` for an endpoint to connect to."""
    try:
        return check_endpoint(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def bind_endpoint(text: str) -> str:
    """argparse ``type=`` for an endpoint to bind."""
    try:
        return check_endpoint(text, bind=True)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# -- running a command -----------------------------------------------------------------


def run(prog: str, command: Callable[[], int]) -> int:
    """Run ``command`` (parsing included); what ends it becomes one line and an exit code.

    :class:`CommandError` -> its message and code; ``KeyboardInterrupt`` -> "interrupted",
    130; a closed stdout (``BrokenPipeError``) -> nothing, 141.  Anything else is a bug
    and keeps its traceback.
    """
    try:
        try:
            return int(command())
        finally:
            sys.stdout.flush()  # a closed pipe shows up here, not in the flush at exit
    except BrokenPipeError:
        _discard_stdout()
        return ExitCode.BROKEN_PIPE
    except CommandError as exc:
        _report(prog, str(exc))
        return exc.code
    except KeyboardInterrupt:
        _report(prog, "interrupted")
        return ExitCode.INTERRUPTED


def _report(prog: str, message: str) -> None:
    with contextlib.suppress(OSError):  # stderr is gone too: nobody left to tell
        print(f"{prog}: {message}", file=sys.stderr, flush=True)


def _discard_stdout() -> None:
    """Point file descriptor 1 at /dev/null, so that the interpreter's last flush of
    what is still buffered cannot fail again (the idiom of the ``signal`` docs)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a file descriptor (captured, closed)
        pass
    finally:
        os.close(devnull)


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt meanwhile, as Ctrl-C does (a clean stop, exit 0)."""

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
