"""Per-user quotas: the channels, queues and durable subscriptions each user holds.

The broker's own bounds (``Limits.max_channels``, ``max_queues``,
``max_durable_subscriptions``) let one client take everything; these entities outlive
the connection that made them, so they are counted per *user*, the identity the
authorizer gives (``Authorizer.user``), every connection and door of it together.

Rules:

* a user holds what it created: a channel or queue made by an operation or on the fly
  (a push, a JOIN, a queue create naming an unknown channel, a STOMP SEND or SUBSCRIBE),
  a durable subscription (its backing channel and queue are part of it and count only
  as the subscription);
* removing one (an operation, ``DestroyWhenEmpty``, a STOMP temporary destination whose
  connection ended, a destroyed durable subscription) frees its slot; a channel removed
  frees its queues' slots too, whoever made them;
* past ``Limits.max_channels_per_user`` / ``max_queues_per_user`` /
  ``max_durable_subscriptions_per_user`` the creation fails with LimitExceeded (482)
  before anything is made;
* no quota (user ``None``): what the engine makes itself (recovery, the config's
  routers, the Python API without a creator), the federation's own client, and a user
  the authorizer exempts (a token granted ``admin``);
* the creator of each held entity is kept in the store (``creator/<kind>/<key>``,
  ``broker.engine.definitions``) so a restart counts it again; a record whose entity
  did not come back is forgotten.  A data directory from before these records holds
  entities counted for no one.

Sans-IO: the ledger is dictionaries and the definitions it writes.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import IntEnum
from typing import TYPE_CHECKING

from broker.engine.auth import Authorizer
from broker.engine.definitions import Definitions
from broker.engine.errors import OperationError
from broker.engine.federated import FEDERATION_CLIENT
from broker.engine.limits import Limits
from broker.protocol import ResultCode

if TYPE_CHECKING:
    from broker.engine.channel import Client


class Kind(IntEnum):
    """What a user holds (the index of its count)."""

    CHANNEL = 0
    QUEUE = 1
    DURABLE_SUBSCRIPTION = 2


#: Each kind's key prefix, its name in a refusal and its limit's field.
_KINDS: dict[Kind, tuple[str, str, str]] = {
    Kind.CHANNEL: ("channel/", "channels", "max_channels_per_user"),
    Kind.QUEUE: ("queue/", "queues", "max_queues_per_user"),
    Kind.DURABLE_SUBSCRIPTION: (
        "dsub/",
        "durable subscriptions",
        "max_durable_subscriptions_per_user",
    ),
}


def channel_key(name: str) -> str:
    return "channel/" + name


def queue_key(channel: str, queue_id: int) -> str:
    return f"queue/{queue_id}/{channel}"  # (the id first: a channel name may hold a "/")


def dsub_key(sub_id: str) -> str:
    return "dsub/" + sub_id


def kind_of(key: str) -> Kind | None:
    found = split_key(key)
    return found[0] if found is not None else None


def split_key(key: str) -> tuple[Kind, str, int] | None:
    """A key's kind, channel name (durable subscription id) and queue id (0 unless a
    queue); None for a key of none of these forms."""
    for kind, (prefix, _, _) in _KINDS.items():
        if not key.startswith(prefix) or len(key) == len(prefix):
            continue
        rest = key[len(prefix) :]
        if kind is not Kind.QUEUE:
            return kind, rest, 0
        qid, _, channel = rest.partition("/")
        if qid.isdigit() and channel:
            return kind, channel, int(qid)
        return None
    return None


def user_of(authorizer: Authorizer, client: Client) -> str | None:
    """The user whose quotas count what ``client`` creates (``Client.user``, set once
    at connect); None: no quota (the federation's client, an exempt user)."""
    if client.id == FEDERATION_CLIENT:
        return None
    return authorizer.user(client)


class UserQuotas:
    """Who created what, and how much each user holds (see the module docstring)."""

    __slots__ = ("counts", "creators", "definitions", "limits")

    def __init__(self, limits: Limits, definitions: Definitions) -> None:
        #: The quota of each kind, by :class:`Kind`.
        self.limits: tuple[int, ...] = tuple(getattr(limits, _KINDS[k][2]) for k in Kind)
        self.definitions = definitions
        #: Held entity key (``channel/NAME``, ``queue/ID/CHANNEL``, ``dsub/ID``) -> its
        #: creator and kind.
        self.creators: dict[str, tuple[str, Kind]] = {}
        #: User -> what it holds, by :class:`Kind` (a user holding nothing has no entry).
        self.counts: dict[str, list[int]] = {}

    def held(self, user: str) -> tuple[int, int, int]:
        """Channels, queues and durable subscriptions ``user`` holds."""
        counts = self.counts.get(user)
        return (counts[0], counts[1], counts[2]) if counts is not None else (0, 0, 0)

    def check(self, user: str | None, kind: Kind) -> None:
        """OperationError (482) when ``user`` may not create one more of ``kind``."""
        if user is None:
            return
        counts = self.counts.get(user)
        if counts is None or counts[kind] < self.limits[kind]:
            return
        _, plural, field = _KINDS[kind]
        raise OperationError(
            ResultCode.LIMIT_EXCEEDED,
            f"this user holds {counts[kind]} {plural} ({field}={self.limits[kind]})",
        )

    def charge(self, user: str | None, kind: Kind, key: str, save: bool = True) -> None:
        """``user`` created the entity ``key`` of ``kind`` (nothing when None)."""
        if user is None:
            return
        if key in self.creators:
            self.release(key, save=False)
        self.creators[key] = (user, kind)
        counts = self.counts.get(user)
        if counts is None:
            counts = self.counts[user] = [0, 0, 0]
        counts[kind] += 1
        if save:
            self.definitions.creator(key, user)

    def release(self, key: str, save: bool = True) -> None:
        """The entity ``key`` is gone: its creator's slot is free."""
        held = self.creators.pop(key, None)
        if held is None:
            return
        user, kind = held
        counts = self.counts.get(user)
        if counts is not None:
            counts[kind] -= 1
            if not any(counts):
                del self.counts[user]
        if save:
            self.definitions.forget_creator(key)

    def recover(self, exists: Callable[[str], bool]) -> int:
        """Count again the kept creators (``Definitions.creators``) of the entities that
        came back (``exists(key)``); forget the others.  A user may come back above a
        limit lowered meanwhile: it creates nothing more until below.  Returns how many
        were counted."""
        count = 0
        for key, user in sorted(self.definitions.creators().items()):
            kind = kind_of(key)
            if user and kind is not None and exists(key):
                self.charge(user, kind, key, save=False)
                count += 1
            else:
                self.definitions.forget_creator(key)
        return count

    def users(self) -> int:
        """Users holding something."""
        return len(self.counts)
