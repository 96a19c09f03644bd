"""Routers and bindings (document section "Routers and Bindings").

A router has a unique name, a method and bindings.  A *queue binding* pushes the
message into a channel queue; a *direct binding* sends it to clients (a client id,
``@name:...`` or ``@type:...``).  Methods:

- ``Distribute``: every binding gets the message;
- ``OnlyFirst``: the highest-priority binding that can take it (failing over in priority
  order);
- ``RoundRobin``: one binding per message, rotating, skipping bindings that fail.

Interaction ``Acknowledge`` / ``Response`` keeps the publisher's message id and passes
its wait flag on, so the queue's acknowledge or the receiver's response reaches the
publisher; with ``None`` the binding gets a fresh id and the publisher is not told.

zerohub's wire operations (the document has none): server operation content types 601
(create, target = router name, JSON ``{"Method": ...}``), 602 (remove), 603 (list), 605
(add binding, JSON binding), 606 (remove binding, JSON ``{"Name": ...}``), 607 (list
bindings).  Publishing is a message of type ROUTER (0x17) whose target is the router name
(``broker.engine.routing``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from broker.engine.errors import OperationError
from broker.engine.limits import Limits
from broker.protocol import ResultCode


class RouterError(ValueError):
    """A router or binding definition is invalid."""


class RouteMethod(Enum):
    DISTRIBUTE = "Distribute"
    ONLY_FIRST = "OnlyFirst"
    ROUND_ROBIN = "RoundRobin"


class Interaction(Enum):
    NONE = "None"
    ACKNOWLEDGE = "Acknowledge"
    RESPONSE = "Response"


@dataclass(frozen=True)
class QueueBinding:
    name: str
    channel: str
    queue: int
    priority: int = 0
    interaction: Interaction = Interaction.NONE

    def to_json(self) -> dict[str, Any]:
        return {
            "Name": self.name,
            "Type": "Queue",
            "Target": self.channel,
            "Queue": self.queue,
            "Priority": self.priority,
            "Interaction": self.interaction.value,
        }


@dataclass(frozen=True)
class DirectBinding:
    """Sends to a client id, ``@name:X`` or ``@type:X``; ``content_type`` None keeps it."""

    name: str
    target: str
    priority: int = 0
    interaction: Interaction = Interaction.NONE
    content_type: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "Name": self.name,
            "Type": "Direct",
            "Target": self.target,
            "Priority": self.priority,
            "Interaction": self.interaction.value,
            "ContentType": self.content_type,
        }


Binding = QueueBinding | DirectBinding


def _enum(kind: type[Enum], value: Any, what: str) -> Any:
    for member in kind:
        if isinstance(value, str) and value.replace("-", "").lower() == str(member.value).lower():
            return member
    raise RouterError(f"unknown {what} {value!r}")


def _int(obj: Mapping[str, Any], key: str, default: int, lo: int, hi: int) -> int:
    value = obj.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise RouterError(f"{key} must be an integer {lo}..{hi}")
    return value


def binding_from_json(data: bytes | str | Mapping[str, Any]) -> Binding:
    """Parse a binding: ``{"Name", "Type": "Queue"|"Direct", "Target", "Queue", ...}``."""
    obj = _object(data)
    name = obj.get("Name")
    target = obj.get("Target")
    if not isinstance(name, str) or not name:
        raise RouterError("binding Name is required")
    if not isinstance(target, str) or not target:
        raise RouterError("binding Target is required")
    kind = obj.get("Type", "Queue")
    priority = _int(obj, "Priority", 0, -(2**31), 2**31 - 1)
    interaction = _enum(Interaction, obj.get("Interaction", "None"), "interaction")
    if kind == "Queue":
        if "Queue" not in obj:
            raise RouterError("queue binding needs Queue")
        queue = _int(obj, "Queue", 0, 0, 0xFFFF)
        return QueueBinding(name, target, queue, priority, interaction)
    if kind == "Direct":
        ct = obj.get("ContentType")
        if ct is not None:
            ct = _int(obj, "ContentType", 0, 0, 0xFFFF)
        return DirectBinding(name, target, priority, interaction, ct)
    raise RouterError(f"unknown binding Type {kind!r}")


def router_from_json(data: bytes | str | Mapping[str, Any]) -> Router:
    """A router with its bindings: ``{"Name", "Method", "Bindings": [...]}``."""
    obj = _object(data)
    name = obj.get("Name")
    if not isinstance(name, str) or not name or len(name.encode()) > 255:
        raise RouterError("router Name is required (at most 255 octets)")
    router = Router(name, method_from_json(obj))
    bindings = obj.get("Bindings", [])
    if not isinstance(bindings, list):
        raise RouterError("Bindings must be an array")
    for item in bindings:
        router.add(binding_from_json(item))
    return router


def method_from_json(data: bytes | str | Mapping[str, Any]) -> RouteMethod:
    if isinstance(data, bytes | str) and not data:
        return RouteMethod.DISTRIBUTE
    obj = _object(data)
    return _enum(RouteMethod, obj.get("Method", "Distribute"), "router method")


def _object(data: bytes | str | Mapping[str, Any]) -> Mapping[str, Any]:
    if isinstance(data, Mapping):
        return data
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise RouterError("not valid JSON") from None
    if not isinstance(obj, dict):
        raise RouterError("expected a JSON object")
    return obj


class Router:
    """A named router; the engine asks it in which order to try its bindings."""

    def __init__(self, name: str, method: RouteMethod = RouteMethod.DISTRIBUTE) -> None:
        self.name = name
        self.method = method
        self.enabled = True
        self._bindings: list[Binding] = []  # highest priority first, then insertion order
        self._cursor = 0

    @property
    def bindings(self) -> tuple[Binding, ...]:
        return tuple(self._bindings)

    def add(self, binding: Binding) -> None:
        if any(b.name == binding.name for b in self._bindings):
            raise RouterError(f"binding {binding.name!r} exists")
        self._bindings.append(binding)
        self._bindings.sort(key=lambda b: -b.priority)

    def remove(self, name: str) -> bool:
        before = len(self._bindings)
        self._bindings = [b for b in self._bindings if b.name != name]
        return len(self._bindings) != before

    def candidates(self) -> tuple[list[Binding], bool]:
        """Bindings in trial order and whether to stop at the first one that takes it."""
        bindings = self._bindings
        if self.method is RouteMethod.DISTRIBUTE or not bindings:
            return list(bindings), False
        if self.method is RouteMethod.ONLY_FIRST:
            return list(bindings), True
        n = len(bindings)
        start = self._cursor % n
        self._cursor = (start + 1) % n
        return bindings[start:] + bindings[:start], True

    def to_json(self) -> dict[str, Any]:
        return {
            "Name": self.name,
            "Method": self.method.value,
            "IsEnabled": self.enabled,
            "Bindings": [b.to_json() for b in self._bindings],
        }


# ---------------------------------------------------------------------- publishing


class RouterTable:
    """The broker's routers by name, bounded by the limits (``max_routers``,
    ``max_bindings_per_router``)."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.routers: dict[str, Router] = {}

    def add(self, router: Router) -> Router:
        """Register a router (Python API; the wire has operation 601)."""
        if router.name in self.routers:
            raise OperationError(ResultCode.ALREADY_CREATED, f"router {router.name!r} exists")
        if len(self.routers) >= self.limits.max_routers:
            raise OperationError(ResultCode.LIMIT_EXCEEDED, "too many routers")
        if len(router.bindings) > self.limits.max_bindings_per_router:
            raise OperationError(ResultCode.LIMIT_EXCEEDED, "too many bindings")
        self.routers[router.name] = router
        return router

    def remove(self, name: str) -> bool:
        return self.routers.pop(name, None) is not None
