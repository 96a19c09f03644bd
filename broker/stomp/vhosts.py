"""STOMP virtual hosts: what one is, the default set, how a configured list is checked,
and the namespace a virtual host's destinations live in.

Rules (the Apollo manual, "Connecting"; the checks are ours):

* a virtual host has a ``name`` and the ``host_names`` a 1.1+ CONNECT ``host`` header
  may give to reach it (its name reaches it too); the first configured one is where a
  STOMP 1.0 client lands;
* no list configured: one virtual host, ``default``, reached as ``localhost``,
  ``127.0.0.1`` and ``::1``;
* a name is 1 to :data:`MAX_NAME_LENGTH` characters of ``a-z A-Z 0-9 _ -`` (never
  ``/``, which separates it from a destination's name on the engine: see
  :func:`namespace_of`); a host name is 1 to :data:`MAX_HOST_NAME_LENGTH` printable
  ASCII characters without spaces; names and host names are unique across the list, a
  host name never being another virtual host's name; every virtual host has at least
  one host name;
* each virtual host is its own namespace: ``/queue/a`` of one is not ``/queue/a`` of
  another, and neither are durable subscription ids or temporary destinations.  The
  virtual host named ``default`` has the empty namespace (the engine mapping it always
  had); any other's namespace is its name.  A namespace follows the name, not the
  position in the list: reordering the list moves no queue.

Pure values and functions: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from broker.stomp.errors import VirtualHostError

#: The name of the virtual host whose destinations keep the engine's unprefixed mapping.
DEFAULT_NAME = "default"
#: Longest virtual host name (characters): it prefixes engine channel names (255 bytes).
MAX_NAME_LENGTH = 64
#: Longest host name (characters): a DNS name is at most 253.
MAX_HOST_NAME_LENGTH = 253
#: Most virtual hosts in a configuration, and host names per virtual host.
MAX_VIRTUAL_HOSTS = 256
MAX_HOST_NAMES = 256

_NAME = re.compile(r"[A-Za-z0-9_-]+")
_HOST_NAME = re.compile(r"[!-~]+")  # printable ASCII, no space


@dataclass(frozen=True, slots=True)
class VirtualHost:
    name: str
    host_names: tuple[str, ...]

    @property
    def namespace(self) -> str:
        return namespace_of(self.name)


DEFAULT_VIRTUAL_HOSTS = (VirtualHost(DEFAULT_NAME, ("localhost", "127.0.0.1", "::1")),)


def namespace_of(virtual_host: str) -> str:
    """The namespace of virtual host ``virtual_host``'s destinations: ``""`` for
    ``default``, else its name."""
    return "" if virtual_host == DEFAULT_NAME else virtual_host


def parse_virtual_hosts(entries: Any) -> tuple[VirtualHost, ...]:
    """The config's ``[[stomp.virtual_hosts]]`` list (each a table with ``name`` and
    ``host_names``) as virtual hosts, checked as the module docstring says
    (:class:`~broker.stomp.errors.VirtualHostError`, one line, otherwise)."""
    if not isinstance(entries, list) or not entries:
        raise VirtualHostError("virtual_hosts must be a non-empty list of tables")
    if len(entries) > MAX_VIRTUAL_HOSTS:
        raise VirtualHostError(f"virtual_hosts: more than {MAX_VIRTUAL_HOSTS}")
    hosts = tuple(_entry(i, entry) for i, entry in enumerate(entries))
    check_virtual_hosts(hosts)
    return hosts


def check_virtual_hosts(hosts: Sequence[VirtualHost]) -> None:
    """Names unique, host names unique and never another virtual host's name."""
    owner: dict[str, str] = {}  # name or host name -> the virtual host it reaches
    for vhost in hosts:
        if vhost.name in owner:
            raise VirtualHostError(f"virtual host {vhost.name!r} is named twice")
        owner[vhost.name] = vhost.name
    for vhost in hosts:
        for host in vhost.host_names:
            if host == vhost.name:
                continue  # its own name: reaches it anyway
            if host in owner:
                raise VirtualHostError(
                    f"host name {host!r} of virtual host {vhost.name!r} "
                    f"already reaches {owner[host]!r}"
                )
            owner[host] = vhost.name


def _entry(index: int, entry: Any) -> VirtualHost:
    where = f"virtual_hosts[{index}]"
    if not isinstance(entry, dict):
        raise VirtualHostError(f"{where}: expected a table with name and host_names")
    unknown = set(entry) - {"name", "host_names"}
    if unknown:
        raise VirtualHostError(f"{where}: unknown keys {sorted(unknown)}")
    name = entry.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name) or len(name) > MAX_NAME_LENGTH:
        raise VirtualHostError(
            f"{where}: name must be 1 to {MAX_NAME_LENGTH} characters of "
            f"a-z A-Z 0-9 _ - (got {_short(name)})"
        )
    names = entry.get("host_names")
    if not isinstance(names, list) or not names:
        raise VirtualHostError(f"{where} ({name}): host_names must be a non-empty list")
    if len(names) > MAX_HOST_NAMES:
        raise VirtualHostError(f"{where} ({name}): more than {MAX_HOST_NAMES} host_names")
    for host in names:
        if (
            not isinstance(host, str)
            or not _HOST_NAME.fullmatch(host)
            or len(host) > MAX_HOST_NAME_LENGTH
        ):
            raise VirtualHostError(
                f"{where} ({name}): a host name is 1 to {MAX_HOST_NAME_LENGTH} printable "
                f"ASCII characters without spaces (got {_short(host)})"
            )
    if len(set(names)) != len(names):
        raise VirtualHostError(f"{where} ({name}): a host name is listed twice")
    return VirtualHost(name, tuple(names))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
