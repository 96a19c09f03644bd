"""ZeroMQ plumbing shared by ``filemq`` and ``broker``: CURVE keys, the ZAP authenticator,
the bind policy, socket helpers and the handshake-failure monitor.

Both packages use it ("same key tooling"); neither imports the other.  ``filemq keys
new`` makes a certificate pair; a server loads its secret certificate and allows the
client public keys found in one directory; a client loads its own pair and the server's
public key.  Unknown client keys fail the CURVE handshake inside libzmq, so nothing from
them reaches the application: a client learns it from its socket monitor
(:class:`HandshakeWatch`).

``zmq.auth`` and ``zmq.utils.monitor`` are imported lazily or not at all: they pull in
asyncio (~20-25 ms of start-up for a command that needs no CURVE).
"""

from __future__ import annotations

import enum
import errno
import logging
import os
import re
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import zmq

if TYPE_CHECKING:
    from zmq.auth.thread import ThreadAuthenticator

__all__ = [
    "CURVE_REQUIRED_HINT",
    "HANDSHAKE_EVENTS",
    "HANGUPS_FOR_VERDICT",
    "Handshake",
    "HandshakeWatch",
    "MonitorReport",
    "SecurityError",
    "check_bind",
    "configure_client",
    "configure_server",
    "fast_send",
    "is_loopback_endpoint",
    "load_public",
    "load_secret",
    "new_certificate",
    "start_authenticator",
]

log = logging.getLogger(__name__)


class SecurityError(Exception):
    """A key file is missing or unusable, or an insecure bind was refused."""


def new_certificate(
    name: str, directory: str | os.PathLike[str] = ".", *, force: bool = False
) -> tuple[Path, Path]:
    """Create ``NAME.key`` (public) and ``NAME.key_secret`` (mode 0600) in ``directory``.

    An existing pair (either file) is refused unless ``force``: replacing a key pair
    locks out every peer that knows the old public key.  The pair is written in a
    private temporary folder and renamed into place, so the secret is never readable
    by others, not even for a moment.
    """
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or name.startswith("."):
        raise SecurityError(f"certificate name {name!r}: use letters, digits, '.', '_', '-'")
    folder = Path(directory)
    public, secret = folder / f"{name}.key", folder / f"{name}.key_secret"
    existing = [str(p) for p in (public, secret) if p.exists() or p.is_symlink()]
    if existing and not force:
        raise SecurityError(
            f"{' and '.join(existing)} already exist(s): pass --force to replace the key pair"
        )
    folder.mkdir(parents=True, exist_ok=True)
    import tempfile  # (here: its shutil, bz2 and lzma are start-up time of every client)

    with tempfile.TemporaryDirectory(dir=folder, prefix=".keys-") as private:  # mode 0700
        import zmq.auth

        made_public, made_secret = zmq.auth.create_certificates(private, name)
        os.chmod(made_secret, 0o600)
        os.replace(made_secret, secret)
        os.replace(made_public, public)
    return public, secret


def load_secret(path: str | os.PathLike[str]) -> tuple[bytes, bytes]:
    """(public, secret) from a ``.key_secret`` file."""
    import zmq.auth

    try:
        public, secret = zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as exc:
        raise SecurityError(f"{path}: cannot load certificate: {exc}") from None
    if secret is None:
        raise SecurityError(f"{path}: holds no secret key (use the .key_secret file)")
    return public, secret


def load_public(path: str | os.PathLike[str]) -> bytes:
    """The public key of a ``.key`` (or ``.key_secret``) file."""
    import zmq.auth

    try:
        public, _secret = zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as exc:
        raise SecurityError(f"{path}: cannot load certificate: {exc}") from None
    return public


class SharedAuthenticator:
    """A server's hold on its context's ZAP handler (see :func:`start_authenticator`)."""

    def __init__(self, context: zmq.Context[Any], folder: Path) -> None:
        self.context = context
        self.folder = folder
        self.auth: ThreadAuthenticator | None = None
        self.users = 0

    def stop(self) -> None:
        """One user lets go (through its :class:`_Hold`, which does it once); the
        handler stops with its last user."""
        with _AUTH_LOCK:
            self.users -= 1
            if self.users > 0:
                return
            _AUTHENTICATORS.pop(id(self.context), None)
            auth, self.auth = self.auth, None
        if auth is not None:
            auth.stop()


class _Hold:
    """What :func:`start_authenticator` returns: one user of a shared handler
    (``stop()`` lets go once; again, it does nothing)."""

    def __init__(self, shared: SharedAuthenticator) -> None:
        self._shared: SharedAuthenticator | None = shared

    def stop(self) -> None:
        shared, self._shared = self._shared, None
        if shared is not None:
            shared.stop()


_AUTH_LOCK = threading.Lock()
_AUTHENTICATORS: dict[int, SharedAuthenticator] = {}  # id(context) -> its ZAP handler


def start_authenticator(
    context: zmq.Context[zmq.Socket[bytes]], allow_dir: str | os.PathLike[str]
) -> _Hold:
    """Start (or share) the ZAP handler of ``context``, allowing the keys in ``allow_dir``.

    A context has one ZAP endpoint, so servers on one context (``zerohub serve``: the
    file server and the broker) share one handler; they must then allow the same
    directory (SecurityError otherwise: give the other server a context of its own).
    Call ``.stop()`` on the result when the server stops; the handler stops with the
    last server using it.
    """
    folder = Path(allow_dir)
    if not folder.is_dir():
        raise SecurityError(f"{folder}: allow-list directory does not exist")
    with _AUTH_LOCK:
        shared = _AUTHENTICATORS.get(id(context))
        if shared is not None and shared.context is context:
            if shared.folder.resolve() != folder.resolve():
                raise SecurityError(
                    f"{folder}: this ZeroMQ context already allows the keys in "
                    f"{shared.folder}; servers sharing a context share one allow-list"
                )
            shared.users += 1
            return _Hold(shared)
        from zmq.auth.thread import ThreadAuthenticator

        auth = ThreadAuthenticator(context, log=logging.getLogger("zerohub.auth"))
        auth.start()
        auth.configure_curve(domain="*", location=str(folder))
        shared = SharedAuthenticator(context, folder)
        shared.auth = auth
        shared.users = 1
        _AUTHENTICATORS[id(context)] = shared
        return _Hold(shared)


def configure_server(socket: zmq.Socket[bytes], secret_file: str | os.PathLike[str]) -> None:
    """Make ``socket`` a CURVE server (call before bind)."""
    public, secret = load_secret(secret_file)
    socket.curve_publickey = public
    socket.curve_secretkey = secret
    socket.curve_server = True


def configure_client(
    socket: zmq.Socket[bytes],
    secret_file: str | os.PathLike[str],
    server_public_file: str | os.PathLike[str],
) -> None:
    """Make ``socket`` a CURVE client of the server whose public key is given (before connect)."""
    public, secret = load_secret(secret_file)
    socket.curve_publickey = public
    socket.curve_secretkey = secret
    socket.curve_serverkey = load_public(server_public_file)


def is_loopback_endpoint(endpoint: str) -> bool:
    """True for inproc/ipc and for tcp endpoints bound to a loopback address."""
    if endpoint.startswith(("inproc://", "ipc://")):
        return True
    if not endpoint.startswith("tcp://"):
        return False
    host = urlsplit(endpoint).hostname or ""
    if host == "localhost":
        return True
    import ipaddress  # (here: ~1 ms of start-up every command would pay)

    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # "*", interface names, host names: not provably loopback


def check_bind(endpoint: str, *, curve: bool, insecure: bool) -> None:
    """Refuse a non-loopback bind without CURVE unless ``insecure`` was asked for."""
    if curve or insecure or is_loopback_endpoint(endpoint):
        return
    raise SecurityError(
        f"refusing to bind {endpoint} without CURVE: pass --curve-secret/--allow, "
        "or --insecure to serve in plain text"
    )


# -- socket helpers ------------------------------------------------------------------------


def fast_send(sock: zmq.Socket[bytes]) -> Callable[..., Any]:
    """``sock.send`` without pyzmq's Python-level wrapper, for plain bytes frames.

    ``zmq.Socket.send`` only handles the DRAFT ``routing_id``/``group`` arguments before
    calling the Cython backend's ``send``; the backend method bound to the socket takes
    the same ``(data, flags, copy, track)`` and saves a Python call per frame (~0.15 us on
    the benchmark machine).  Falls back to ``sock.send`` when pyzmq keeps its backend
    elsewhere (the class has been ``zmq.backend.Socket`` since pyzmq 17).
    """
    backend = getattr(zmq.backend, "Socket", None)
    method = getattr(backend, "send", None)
    if backend is None or method is None or not isinstance(sock, backend):
        return sock.send
    bound: Callable[..., Any] = method.__get__(sock, type(sock))
    return bound


# -- handshake failures, seen by a connecting socket's monitor ------------------------------

#: The monitor events that tell a connecting socket its security handshake failed.
HANDSHAKE_EVENTS = (
    zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)
_MECHANISM_MISMATCH = zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH
#: The values of a failure without detail that say the peer closed the connection: libzmq
#: gives EPIPE for an end of stream it read, ECONNRESET comes from the kernel.  Any other
#: value is the handshake timer (``ZMQ_HANDSHAKE_IVL``; the value is then whatever errno
#: libzmq's I/O thread last had, EAGAIN here) or a network failure: no answer, no refusal.
_HUNG_UP = frozenset({errno.EPIPE, errno.ECONNRESET})
#: Dials a peer must hang up on in the handshake before a watch calls it a refusal: one
#: alone may be a server killed mid-handshake (libzmq dials again ~0.1 s later).
HANGUPS_FOR_VERDICT = 2

#: What to tell a plain client that met a CURVE server (both CLIs take these options).
CURVE_REQUIRED_HINT = (
    "requires CURVE (handshake failed): pass --server-key SERVER.key "
    "--curve-secret CLIENT.key_secret"
)


class Handshake(enum.IntEnum):
    """Why a connecting socket's handshake failed."""

    KEY_REFUSED = 1  # the server's ZAP handler refused this client's CURVE key
    CURVE_REQUIRED = 2  # a plain client against a CURVE server
    MISMATCH = 3  # any other mechanism/protocol failure (CURVE settings differ?)


@dataclass(frozen=True, slots=True)
class MonitorReport:
    """What a socket monitor has reported so far."""

    handshake: Handshake | None = None  # the handshake was refused (the worst reason seen)
    disconnected: bool = False  # an established connection ended (if that was watched)
    hangups: int = 0  # dials the peer hung up on in the handshake, so far
    unanswered: int = 0  # dials whose handshake the timer (or the network) ended, so far


class HandshakeWatch:
    """The monitor of one connecting socket, read as it fills and remembered across reads.

    ``curve`` tells whether the watched socket is a CURVE client: only a plain client can
    learn that the server requires CURVE.  What each report means:

    - the ZAP handler refused the key (``KEY_REFUSED``), or the greetings name different
      mechanisms (a plain client: ``CURVE_REQUIRED``) or another protocol error
      (``MISMATCH``): at once; libzmq does not dial again after those.
    - a handshake that ended without detail because the peer hung up: a CURVE server
      does to a plain client when it reads the client's mechanism before the client
      reads its own (a race: ~1 dial in 4 on loopback, more when the server is slow to
      accept), and to a CURVE client with the wrong server key.  Reported once the peer
      has hung up on ``HANGUPS_FOR_VERDICT`` dials (libzmq dials again; a server
      killed mid-handshake hangs up once, then refuses the connection or answers).
    - a handshake the timer ended (a server stopped or too slow): nothing; libzmq dials
      again and the caller's own timeout ends the wait ("no answer").
    - ``disconnected``: only a disconnect that follows no failed handshake (libzmq
      reports one after each failure, possibly in a later read of the monitor).

    Reading never blocks.  One watch per socket, for as long as the socket lives.
    """

    __slots__ = ("_hangups", "_owed", "_reader", "_unanswered", "_verdict", "curve", "socket")

    def __init__(self, monitor: zmq.Socket[Any], *, curve: bool) -> None:
        #: The monitor socket to poll (a ``zmq.asyncio`` one too: it is read through a
        #: plain shadow, which never blocks).
        self.socket = monitor
        self.curve = curve
        self._reader: zmq.Socket[Any] = zmq.Socket(shadow=monitor.underlying)
        self._verdict: Handshake | None = None
        self._hangups = 0  # dials the peer hung up on in the handshake
        self._unanswered = 0  # dials the handshake timer (or the network) ended
        self._owed = 0  # failed handshakes whose disconnect is still to come

    def read(self) -> MonitorReport:
        """Take in what the monitor holds; what it has reported so far."""
        disconnected = False
        while True:
            try:
                # first frame: event (u16) + value (u32), native order; zmq.utils.monitor
                # would parse it but imports asyncio (~20 ms of start-up)
                frames = self._reader.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            head = frames[0]
            event = int.from_bytes(head[:2], sys.byteorder)
            if event & HANDSHAKE_EVENTS:
                self._owed += 1
                self._failed(event, int.from_bytes(head[2:6], sys.byteorder))
            elif event == zmq.EVENT_DISCONNECTED:
                if self._owed:
                    self._owed -= 1  # (the failed handshake's own)
                else:
                    disconnected = True
        return MonitorReport(self._verdict, disconnected, self._hangups, self._unanswered)

    def _failed(self, event: int, value: int) -> None:
        if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            self._judge(Handshake.KEY_REFUSED)
        elif event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            plain_met_curve = not self.curve and value == _MECHANISM_MISMATCH
            self._judge(Handshake.CURVE_REQUIRED if plain_met_curve else Handshake.MISMATCH)
        elif value in _HUNG_UP:
            self._hangups += 1
            if self._hangups >= HANGUPS_FOR_VERDICT:
                self._judge(Handshake.MISMATCH if self.curve else Handshake.CURVE_REQUIRED)
        else:
            self._unanswered += 1

    def _judge(self, reason: Handshake) -> None:
        if self._verdict is None or reason < self._verdict:  # (the worst reason wins)
            self._verdict = reason

    def close(self, watched: zmq.Socket[Any] | None) -> None:
        """Stop watching ``watched`` (if it is still open) and close the monitor."""
        if watched is not None and not watched.closed:
            watched.disable_monitor()
        self.socket.close(linger=0)
