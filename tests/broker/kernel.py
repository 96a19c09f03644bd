"""Facts of the machine's kernel that tests size their traffic by."""

from __future__ import annotations


def beyond_socket_buffers() -> int:
    """Octets that overflow one loopback TCP connection's kernel buffers (both ends at
    their autotuning maximum) one and a half times over."""
    most = 0
    for name in ("tcp_rmem", "tcp_wmem"):
        try:
            with open(f"/proc/sys/net/ipv4/{name}") as f:
                most += int(f.read().split()[-1])
        except (OSError, ValueError, IndexError):
            most += 8 << 20
    return most * 3 // 2
