"""Loopback ports for tests that must name a port before anything binds it.

The rule: :func:`free_port` never hands out the same port twice in one test process, and
never a port another live test process of this user holds (a second pytest beside this
one: CI runs the slow leg beside the default leg, `-n 2` runs two xdist workers, other
engineers test on the same machine).  Each port handed out is a one-byte POSIX record lock
(``lockf``) at offset PORT of one shared file, :func:`lock_path`, held for the life of
the process: the kernel drops them when the process ends, even by ``kill -9``, so
nothing stale is left to reap.

Ports come from below the kernel's ephemeral range (``ip_local_port_range``): a port the
kernel picks for ``bind(port 0)`` is one it may give any outgoing connection on the machine
as its local port while the test has not bound it yet (or while a peer is down for a
restart), and the bind then fails with EADDRINUSE.  Below that range the kernel never picks
on its own.  Each candidate is also bound once (and closed) before it is handed out: a port
a service of the machine holds is skipped.

The old way (bind port 0, close, return the number) gave the same port to two calls in a
row: session 15's federation flake, two brokers on one port.
"""

from __future__ import annotations

import fcntl
import os
import random
import socket
import tempfile
from pathlib import Path

#: ports taken below the ephemeral range (a process takes a few hundred in a full run)
SPAN = 12_000
#: candidates tried before a pool says it is exhausted
_TRIES = 10_000
#: the lowest port handed out (below it: well-known services)
_LOWEST = 1024


class PortsExhausted(RuntimeError):
    """No port of the pool's range is free for this process."""


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for ports it picks itself (``bind`` to 0, ``connect``)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def lock_path() -> Path:
    """The file whose byte N is locked by the test process holding port N."""
    return Path(tempfile.gettempdir()) / f"zerohub-test-ports-{os.getuid()}.lock"


def _default_range() -> range:
    low, high = ephemeral_range()
    if low - _LOWEST >= SPAN // 4:
        return range(max(_LOWEST, low - SPAN), low)
    return range(high + 1, 65536)  # (a range starting low: the ports above it instead)


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class PortPool:
    """Ports of ``ports`` handed out once each, held against other processes through
    the record locks of ``path`` (opened once and kept open: closing any descriptor of
    the file would drop all of this process's locks on it)."""

    def __init__(self, ports: range, path: Path) -> None:
        self.ports = ports
        self.path = path
        self._handed: set[int] = set()
        self._fd: int | None = None
        self._rng = random.Random()

    def take(self) -> int:
        """A port of the range not handed out before by this pool, not held by another
        process's pool on the same file, and bindable right now."""
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        for _ in range(_TRIES):
            port = self._rng.choice(self.ports)
            if port in self._handed:
                continue
            try:
                fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, port)
            except OSError:  # another process holds it
                continue
            self._handed.add(port)  # (held even if it fails the bind: never retried)
            if _bindable(port):
                return port
        raise PortsExhausted(
            f"no free port in {self.ports.start}-{self.ports.stop - 1} after {_TRIES} tries"
        )

    def close(self) -> None:
        """Give every port of this pool back (the process's locks on the file go)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


_pool: PortPool | None = None


def free_port() -> int:
    """A loopback TCP port for this test alone (see the module's rule)."""
    global _pool
    if _pool is None:
        _pool = PortPool(_default_range(), lock_path())
    return _pool.take()
