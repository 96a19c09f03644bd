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
normally on SIGINT/SIGTERM and exit 0.  Servers take their signals with
:func:`stop_signals`: the handler raises nothing (an exception raised by a handler can
land in a finaliser, which drops it, and the server then never stops), a second signal
during the stop is only reported, and a stop that takes too long dumps every thread's
stack on stderr (SIGUSR1 dumps them at any time).

Anything that goes wrong is ONE line on stderr, ``PROG: what happened``; never a
traceback.  Usage errors too (``PROG: error (see PROG --help)``): :class:`ArgumentParser`
does not print the usage block.  ``-v``/``-q`` work before or after the subcommand
(:func:`verbosity_flags`).  Endpoints typed on a command line are checked before
anything is opened (:func:`connect_endpoint`, :func:`bind_endpoint`).
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import functools
import logging
import os
import select
import signal
import sys
from collections.abc import Callable, Iterator
from enum import IntEnum
from typing import Any, NoReturn

__all__ = [
    "ArgumentParser",
    "CommandError",
    "ExitCode",
    "HelpFormatter",
    "StopRequest",
    "UsageError",
    "bind_endpoint",
    "check_endpoint",
    "connect_endpoint",
    "log_level",
    "run",
    "stop_signals",
    "verbosity_flags",
]

#: Seconds a server may take to stop after its first signal before every thread's stack
#: is dumped on stderr (the process goes on stopping; the dump says where it waits).
STOP_DUMP_AFTER = 10.0


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


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help formatter, sized without importing ``shutil`` (with its bz2 and
    lzma: ~2-4 ms of every command's start-up).

    (argparse makes one for every option it adds, and the stock one imports
    ``shutil`` for the terminal width.)
    """

    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=_help_width())


class ArgumentParser(argparse.ArgumentParser):
    """argparse, with usage errors on one line: ``PROG: error (see PROG --help)``, exit 2.

    Subcommand parsers made by ``add_subparsers().add_parser`` are of this class too.
    Its help is sized by ``HelpFormatter`` unless another ``formatter_class`` is given.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

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


class StopRequest:
    """Set by the first SIGINT/SIGTERM (:func:`stop_signals`); ``wait`` for it.

    Setting it takes no lock: a signal handler runs between two bytecodes of the main
    thread, maybe while that thread holds the lock an ``threading.Event`` would take.
    It writes one octet to a pipe instead, which wakes :meth:`wait` at once.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)

    def is_set(self) -> bool:
        return self.signum is not None

    def set(self, signum: int) -> None:
        """Record the first signal and wake the waiter (safe in a signal handler)."""
        if self.signum is None:
            self.signum = signum
        with contextlib.suppress(OSError):  # the pipe is full: the waiter is woken already
            os.write(self._write, b"\0")

    def wait(self, timeout: float) -> bool:
        """True once a stop was asked; waits at most ``timeout`` seconds for it."""
        if self.signum is None:
            with contextlib.suppress(InterruptedError):
                select.select([self._read], [], [], timeout)
        return self.signum is not None

    def close(self) -> None:
        os.close(self._read)
        os.close(self._write)


def _say(prog: str, message: str) -> None:
    """One line on stderr from a signal handler: one unbuffered write, no lock taken."""
    with contextlib.suppress(OSError):
        os.write(2, f"{prog}: {message}\n".encode())


@contextlib.contextmanager
def stop_signals(
    prog: str, dump_after: float = STOP_DUMP_AFTER, *, final: bool = True
) -> Iterator[StopRequest]:
    """SIGINT/SIGTERM set the yielded :class:`StopRequest`, for as long as a server runs
    *and stops*; the caller waits for it, then stops its server (exit 0).

    The first signal prints ``PROG: stopping (SIGTERM)`` and arms a dump of every thread's
    stack on stderr after ``dump_after`` seconds (cancelled when the block ends); a later
    one prints ``PROG: already stopping (...)`` and changes nothing: ``timeout`` sends its
    signal twice, an impatient Ctrl-C comes twice, and a stop cut half-way would leave
    sockets open for ``context.term()`` to wait on for ever.  The handler raises nothing
    (a KeyboardInterrupt raised in a finaliser such as a ZeroMQ frame's is dropped, and
    the server would not stop).  SIGUSR1 dumps the stacks at any time.  Outside the main
    thread (tests) no handler is installed.

    ``final``: the process ends after the block (a server command).  Once a stop was
    asked, SIGINT/SIGTERM are then ignored until it exits, instead of the previous
    handlers given back: a late second signal would otherwise kill it, or raise in its
    last steps (exit status -2 instead of 0).  Without a signal, or with ``final=False``,
    the previous handlers are given back.
    """
    stop = StopRequest()

    def handler(signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        if stop.is_set():
            _say(prog, f"already stopping ({name})")
            return
        stop.set(signum)
        _say(prog, f"stopping ({name})")
        faulthandler.dump_traceback_later(dump_after, exit=False)

    previous: dict[int, Any] = {}
    dumps = False
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            if sig == signal.SIGINT and signal.getsignal(sig) == signal.SIG_IGN:
                continue  # started as a background job: Ctrl-C is not for us (as Python does)
            previous[sig] = signal.signal(sig, handler)
        faulthandler.register(signal.SIGUSR1, all_threads=True)
        dumps = True
    except ValueError:  # not the main thread
        pass
    try:
        yield stop
    finally:
        faulthandler.cancel_dump_traceback_later()
        if dumps:
            faulthandler.unregister(signal.SIGUSR1)
        for signum, old in previous.items():
            signal.signal(signum, signal.SIG_IGN if final and stop.is_set() else old)
        stop.close()
