"""CURVE certificates and authentication for zerohub's ZeroMQ sockets.

Shared by ``filemq`` and ``broker`` ("same key tooling"): ``filemq keys new``
makes a certificate pair with ``zmq.auth``; a server loads its secret
certificate and allows the client public keys found in one directory; a client
loads its own pair and the server's public key.  Unknown client keys fail the
CURVE handshake inside libzmq, so nothing from them reaches the application.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import zmq
import zmq.auth

if TYPE_CHECKING:  # imported lazily: zmq.auth.thread pulls in asyncio (~25 ms at start-up)
    from zmq.auth.thread import ThreadAuthenticator

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
    with tempfile.TemporaryDirectory(dir=folder, prefix=".keys-") as private:  # mode 0700
        made_public, made_secret = zmq.auth.create_certificates(private, name)
        os.chmod(made_secret, 0o600)
        os.replace(made_secret, secret)
        os.replace(made_public, public)
    return public, secret


def load_secret(path: str | os.PathLike[str]) -> tuple[bytes, bytes]:
    """(public, secret) from a ``.key_secret`` file."""
    try:
        public, secret = zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as exc:
        raise SecurityError(f"{path}: cannot load certificate: {exc}") from None
    if secret is None:
        raise SecurityError(f"{path}: holds no secret key (use the .key_secret file)")
    return public, secret


def load_public(path: str | os.PathLike[str]) -> bytes:
    try:
        public, _secret = zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as exc:
        raise SecurityError(f"{path}: cannot load certificate: {exc}") from None
    return public


def start_authenticator(
    context: zmq.Context[zmq.Socket[bytes]], allow_dir: str | os.PathLike[str]
) -> ThreadAuthenticator:
    """Start a ZAP handler on ``context`` allowing the public keys in ``allow_dir``.

    Call ``.stop()`` on the result when the server stops.
    """
    from zmq.auth.thread import ThreadAuthenticator

    folder = Path(allow_dir)
    if not folder.is_dir():
        raise SecurityError(f"{folder}: allow-list directory does not exist")
    auth = ThreadAuthenticator(context, log=logging.getLogger("zerohub.auth"))
    auth.start()
    auth.configure_curve(domain="*", location=str(folder))
    return auth


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
