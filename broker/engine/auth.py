"""Authorization hooks: who may connect, create, push, consume, subscribe and route.

The engine asks its :class:`Authorizer` once per operation with an :class:`Action`, the
client (which carries the ``Client-Token`` it connected with) and the resource concerned.
A refusal becomes ``Unauthorized`` (401): a negative acknowledge, a 401 response, or a
``No-Content: Unauthorized`` pull reply, depending on what the sender waits for.

It also names the *user* a client is (:meth:`Authorizer.user`), whose per-user quotas
(``broker.engine.quotas``) count what the client creates: the identity it checked.
Without tokens nothing is checked and a client is who it says it is (its
``Client-Name``, a STOMP ``login``); with tokens (:class:`TokenAuthorizer`) it is its
token (``Client-Token``, a STOMP ``passcode``), as a name is not checked.  A client
with neither is the one user :data:`ANONYMOUS`; ``None`` is a user without quota (an
admin).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from broker.engine.channel import Client
    from broker.protocol import ConnectionInfo


class Action(Enum):
    CHANNEL_CREATE = "channel-create"
    CHANNEL_UPDATE = "channel-update"
    CHANNEL_REMOVE = "channel-remove"
    CHANNEL_LIST = "channel-list"  # list and information
    JOIN = "join"  # consume: join a channel (receive its queue messages)
    QUEUE_CREATE = "queue-create"
    QUEUE_UPDATE = "queue-update"
    QUEUE_REMOVE = "queue-remove"
    QUEUE_LIST = "queue-list"  # list and information
    PUSH = "push"
    PULL = "pull"
    DIRECT = "direct"  # direct messages and responses
    EVENT = "event"  # subscribe to an event
    ROUTER_PUBLISH = "router-publish"
    ROUTER_MANAGE = "router-manage"
    ADMIN = "admin"  # client and node lists
    BROWSE = "browse"  # read a queue by sequence number (bounds, browse): consumes nothing
    RELEASE = "release"  # remove a queue's messages up to a sequence number
    TRASH = "trash"  # resubmit or purge what a queue's trash holds (listing: browse)


#: Everything a client may do.
ALL_ACTIONS: frozenset[Action] = frozenset(Action)

#: The user of every client that gives no identity (no token, no name).
ANONYMOUS = "anonymous"


class Authorizer:
    """Allows everything; subclass and override :meth:`authenticate` / :meth:`allows`."""

    def authenticate(self, info: ConnectionInfo) -> bool:
        """May this connection (its Client-Token) use the broker at all?"""
        return True

    def allows(
        self,
        client: Client,
        action: Action,
        channel: str | None = None,
        queue: int | None = None,
        target: str | None = None,
    ) -> bool:
        """May ``client`` perform ``action`` on the channel/queue/target given?"""
        return True

    def user(self, client: Client) -> str | None:
        """The user whose quotas count what ``client`` creates (None: no quota).  Here
        nothing is checked: the name it gave (``Client-Name``, a STOMP ``login``)."""
        return f"name:{client.name}" if client.name else ANONYMOUS


class AllowAll(Authorizer):
    """The default: no authentication, every action allowed."""


def bare_token(token: str | None) -> str | None:
    """The token without a ``Bearer`` scheme prefix."""
    if token is None:
        return None
    token = token.strip()
    if token[:7].lower() == "bearer ":
        token = token[7:].strip()
    return token or None


class TokenAuthorizer(Authorizer):
    """Grants actions per ``Client-Token`` value (with or without ``Bearer``).

    ``grants`` maps a token to the actions it allows (``ALL_ACTIONS`` for an admin);
    ``anonymous`` is what a connection without a token may do.  A token that is not in
    ``grants`` is refused at connect time; with ``require_token`` so is no token at all.
    Optionally ``channels`` limits a token to channel names (``fnmatch`` patterns).
    """

    def __init__(
        self,
        grants: Mapping[str, Iterable[Action]],
        *,
        anonymous: Iterable[Action] = (),
        require_token: bool = False,
        channels: Mapping[str, Iterable[str]] | None = None,
    ) -> None:
        self._grants = {token: frozenset(actions) for token, actions in grants.items()}
        self._anonymous = frozenset(anonymous)
        self._require = require_token
        self._channels = {t: tuple(p) for t, p in (channels or {}).items()}

    def authenticate(self, info: ConnectionInfo) -> bool:
        token = bare_token(info.token)
        if token is None:
            return not self._require
        return token in self._grants

    def allows(
        self,
        client: Client,
        action: Action,
        channel: str | None = None,
        queue: int | None = None,
        target: str | None = None,
    ) -> bool:
        token = bare_token(client.token)
        granted = self._anonymous if token is None else self._grants.get(token, frozenset())
        if action not in granted:
            return False
        if channel is not None and token is not None and token in self._channels:
            from fnmatch import fnmatchcase

            return any(fnmatchcase(channel, pattern) for pattern in self._channels[token])
        return True

    def user(self, client: Client) -> str | None:
        """The token checked at connect (``Client-Token``, a STOMP ``passcode``): a name
        is not checked, so one token renaming its connections stays one user.  Kept as a
        digest (it is written to the data directory); a token or anonymous granted
        ``admin`` has no quota."""
        token = bare_token(client.token)
        granted = self._anonymous if token is None else self._grants.get(token, frozenset())
        if Action.ADMIN in granted:
            return None
        if token is None:
            return ANONYMOUS
        return "token:" + hashlib.blake2b(token.encode(), digest_size=12).hexdigest()
