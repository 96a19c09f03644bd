"""What the connectors and the local side report to the bridge driver (one queue)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from broker.bridge.config import Route


@dataclass(frozen=True, slots=True)
class RemoteAccepted:
    token: int
    generation: int


@dataclass(frozen=True, slots=True)
class RemoteRefused:
    token: int
    generation: int
    reason: str


@dataclass(frozen=True, slots=True)
class RemoteMessage:
    route: Route | None
    payload: bytes
    ref: Any
    generation: int
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class LocalDelivery:
    route: Route
    message: Any  # a broker.client.Message


@dataclass(frozen=True, slots=True)
class LocalAccepted:
    token: int


@dataclass(frozen=True, slots=True)
class LocalRefused:
    token: int
    reason: str


Event = (
    RemoteAccepted | RemoteRefused | RemoteMessage | LocalDelivery | LocalAccepted | LocalRefused
)
