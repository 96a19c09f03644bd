"""``python -m broker.stomp``: a standalone STOMP listener on the in-memory backend.

For trying STOMP clients alone: ``broker serve --stomp`` is the STOMP front door on the
broker engine (shared with TMQP clients, logins checked, durable with ``--data``).  Here
nothing is shared with a TMQP broker and nothing survives a restart.

    python -m broker.stomp [--bind tcp://127.0.0.1:61613] [--ws ws://127.0.0.1:61614]
                           [--tls-cert FILE --tls-key FILE] [--insecure]

The default bind is loopback; binding another address needs TLS (``--tls-cert`` and
``--tls-key``) or ``--insecure`` (every login is accepted: there is no user database).
On start it prints one line, ``listening on tcp://HOST:PORT`` (and the WebSocket URL),
so ``:0`` can be used; SIGINT/SIGTERM print ``python -m broker.stomp: stopping (SIGTERM)``
on stderr and stop it.  Exit codes are zerohub's (``zerohub.cli.ExitCode``): 0 stopped
by SIGINT/SIGTERM, 1 could not listen (address in use, unreadable certificate), 2 usage.
"""

from __future__ import annotations

import ipaddress
import ssl
from dataclasses import dataclass

from broker.stomp.memory import MemoryBackend
from broker.stomp.server import DEFAULT_PORT, ListenerOptions, StompListener
from zerohub.cli import ArgumentParser, CommandError, ExitCode, UsageError, run, stop_signals

PROG = "python -m broker.stomp"
DEFAULT_WS_PORT = 61614
_STOP_POLL = 3600.0  # seconds per wait for SIGINT/SIGTERM (the signal wakes it at once)


@dataclass(frozen=True, slots=True)
class Address:
    host: str
    port: int


def parse_address(text: str, scheme: str) -> Address:
    prefix = f"{scheme}://"
    if not text.startswith(prefix):
        raise UsageError(f"{text!r}: expected {scheme}://HOST:PORT")
    host, sep, port_text = text[len(prefix) :].rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise UsageError(f"{text!r}: expected {scheme}://HOST:PORT")
    return Address(host, int(port_text))


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def main(argv: list[str] | None = None) -> int:
    return run(PROG, lambda: _serve(argv))


def _serve(argv: list[str] | None) -> int:
    parser = ArgumentParser(prog=PROG, description="standalone STOMP listener (in memory)")
    parser.add_argument("--bind", default=f"tcp://127.0.0.1:{DEFAULT_PORT}")
    parser.add_argument("--ws", default=None, help="also STOMP over WebSocket: ws://HOST:PORT")
    parser.add_argument("--tls-cert", default=None)
    parser.add_argument("--tls-key", default=None)
    parser.add_argument("--insecure", action="store_true", help="allow a non-loopback bind")
    args = parser.parse_args(argv)
    bind = parse_address(args.bind, "tcp")
    ws = parse_address(args.ws, "ws") if args.ws else None
    if ws is not None and ws.host != bind.host:
        raise UsageError("--ws must use the same host as --bind")
    if (args.tls_cert is None) != (args.tls_key is None):
        raise UsageError("--tls-cert and --tls-key go together")
    if not _loopback(bind.host) and args.tls_cert is None and not args.insecure:
        raise UsageError(f"binding {bind.host} needs --tls-cert/--tls-key or --insecure")
    context: ssl.SSLContext | None = None
    if args.tls_cert is not None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(args.tls_cert, args.tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise CommandError(f"cannot load the TLS certificate: {exc}") from None
    options = ListenerOptions(
        host=bind.host, port=bind.port, ssl=context, ws_port=ws.port if ws else None
    )
    listener = StompListener(MemoryBackend(), options)
    # The signals' handler takes no lock (``stop_signals``): one that set a
    # ``threading.Event`` deadlocked when SIGTERM came while the main thread held that
    # Event's own lock, entering its wait (the process never exits: a loaded machine can
    # deschedule it there).  Taken before the start: a signal during it stops after it.
    with stop_signals(PROG) as stop:
        try:
            listener.start()
        except OSError as exc:
            why = exc.strerror
            raise CommandError(f"cannot listen on {bind.host}:{bind.port}: {why}") from None
        except ImportError:
            raise CommandError("--ws needs the stomp-ws extra (pip install 'zerohub[stomp-ws]')")
        line = f"listening on tcp://{bind.host}:{listener.port}"
        if ws is not None:
            line += f" and ws://{bind.host}:{listener.ws_port}"
        try:
            print(line, flush=True)
            while not stop.wait(_STOP_POLL):
                pass
        finally:
            listener.stop()
    return ExitCode.OK
