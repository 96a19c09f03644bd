"""Server operations (message type 0x10) and event subscriptions, on the engine's parts
(:class:`broker.engine.parts.EngineParts`).

One function per operation content type; each returns the JSON model to send back
(operations answered by a RESPONSE; lists as a :class:`broker.paging.Page`, which adds a
``Page-Next`` header when the list goes on) or None (operations answered by an ACK), and raises
:class:`~broker.engine.errors.OperationError` (or an options/router parse error, reported as
400) to fail.  The reply goes out before any frame the operation caused (for instance
the messages a join releases), so a client sees its join acknowledged first.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from broker import tmqp
from broker.engine import join_rules, models
from broker.engine.auth import Action
from broker.engine.channels import Channel, Client
from broker.engine.delivery import per_message_rules
from broker.engine.dsubs import channel_name as dsub_channel
from broker.engine.errors import OperationError, PatternError
from broker.engine.options import ChannelOptions, OptionsError
from broker.engine.parts import EngineParts
from broker.engine.patterns import PatternJoin
from broker.engine.patterns import parse as parse_pattern
from broker.engine.queue import reading
from broker.engine.queue.queue import Queue
from broker.engine.quotas import Kind
from broker.engine.replies import reply
from broker.engine.router import Router, RouterError, binding_from_json, method_from_json
from broker.engine.tmqp_door import encode as encode_message
from broker.fanout import FANOUT
from broker.fanout import VERSION as FANOUT_VERSION
from broker.paging import Page, cut, parse_after
from broker.protocol import (
    EVENT_NAMES,
    EventName,
    Header,
    NackReason,
    Operation,
    Outgoing,
    ResultCode,
    RouterOperation,
    header,
)
from broker.sequence import DEFAULT_BROWSE_LIMIT, MAX_BROWSE_LIMIT, encode_browse

_Op = Callable[[EngineParts, Client, tmqp.Frame, float, list[Outgoing]], Any]


def _error(code: ResultCode, reason: str, token: str | None = None) -> Exception:
    return OperationError(code, reason, token)


def dispatch(
    parts: EngineParts, client: Client, frame: tmqp.Frame, now: float, out: list[Outgoing]
) -> None:
    entry = _OPERATIONS.get(frame.content_type)
    if entry is None:
        err = OperationError(ResultCode.BAD_REQUEST, f"unknown operation {frame.content_type}")
        reply(client, frame, out, response=frame.pending_response, error=err)
        return
    op, is_response = entry
    caused: list[Outgoing] = []
    try:
        model = op(parts, client, frame, now, caused)
    except (OperationError, OptionsError, RouterError) as exc:
        failure = (
            exc
            if isinstance(exc, OperationError)
            else OperationError(ResultCode.BAD_REQUEST, str(exc))
        )
        reply(client, frame, out, response=is_response, error=failure)
        out.extend(caused)
        return
    headers: tuple[tuple[str, str], ...] = ()
    if isinstance(model, Headed):
        headers, model = model.headers, None
    if isinstance(model, Page):
        if model.next is not None:
            headers = ((Header.PAGE_NEXT, model.next),)
        model = model.items
    if isinstance(model, bytes):  # a binary answer (a browse)
        payload = model
    else:
        payload = json.dumps(model, separators=(",", ":")).encode() if is_response else b""
    reply(client, frame, out, response=is_response, payload=payload, headers=headers)
    out.extend(caused)


# ---------------------------------------------------------------------- helpers


def _allow(
    parts: EngineParts,
    client: Client,
    action: Action,
    channel: str | None = None,
    queue: int | None = None,
    target: str | None = None,
) -> None:
    if not parts.authorizer.allows(client, action, channel, queue, target):
        raise _error(ResultCode.UNAUTHORIZED, f"{action.value} not allowed")


def _channel(parts: EngineParts, frame: tmqp.Frame) -> Channel:
    channel = parts.channels.channels.get(frame.target)
    if channel is None:
        raise _error(ResultCode.NOT_FOUND, f"no channel {frame.target!r}", NackReason.NO_CHANNEL)
    return channel


def _queue_id(frame: tmqp.Frame) -> int:
    raw = header(frame, Header.QUEUE_ID)
    if raw is None:
        raise _error(ResultCode.BAD_REQUEST, "Queue-Id header required")
    try:
        qid = int(raw.strip())
    except ValueError:
        raise _error(ResultCode.BAD_REQUEST, f"bad Queue-Id {raw!r}") from None
    if not 0 <= qid <= 0xFFFF:
        raise _error(ResultCode.BAD_REQUEST, f"bad Queue-Id {raw!r}")
    return qid


def _queue(parts: EngineParts, frame: tmqp.Frame) -> Queue:
    channel = _channel(parts, frame)
    qid = _queue_id(frame)
    queue = channel.queues.get(qid)
    if queue is None:
        raise _error(ResultCode.NOT_FOUND, f"no queue {qid}", NackReason.NO_QUEUE)
    return queue


def _after(frame: tmqp.Frame, numeric: bool = False) -> Any:
    """The request's ``Page-After`` key (None: the first page)."""
    raw = header(frame, Header.PAGE_AFTER)
    try:
        return parse_after(raw, numeric)
    except ValueError:
        raise _error(ResultCode.BAD_REQUEST, f"bad {Header.PAGE_AFTER} {raw!r}") from None


def _budget(parts: EngineParts) -> int:
    return parts.config.limits.max_reply_size


def _has_payload(frame: tmqp.Frame) -> bool:
    return bool(frame.payload.strip())


def _matcher(pattern: str) -> Callable[[str], bool]:
    if not pattern:
        return lambda name: True
    regex = re.compile("^" + ".*".join(re.escape(p) for p in pattern.split("*")) + "$")
    return lambda name: regex.match(name) is not None


# ---------------------------------------------------------------------- channels


def channel_create(
    parts: EngineParts, client: Client, frame: tmqp.Frame, now: float, out: list[Outgoing]
) -> None:
    _allow(parts, client, Action.CHANNEL_CREATE, frame.target)
    options = parts.config.channel_defaults
    if _has_payload(frame):
        options = ChannelOptions.from_json(frame.payload, base=options)
    parts.channels.create_channel(frame.target, options, out, by=client)


def channel_update(
    parts: EngineParts, client: Client, frame: tmqp.Frame, now: float, out: list[Outgoing]
) -> None:
    channel = _channel(parts, frame)
    _allow(parts, client, Action.CHANNEL_UPDATE, channel.name)
    if not _has_payload(frame):
        raise _error(ResultCode.BAD_REQUEST, "ChannelOptions JSON required")
    channel.options = channel.options.updated(frame.payload)
    parts.channels.definitions.channel(channel.name, channel.options.to_json())


def channel_delete(
    parts: EngineParts, client: Client, frame: tmqp.Frame, now: float, out: list[Outgoing]
) -> None:
    channel = _channel(parts, frame)
    _allow(parts, client, Action.CHANNEL_REMOVE, channel.name)
    parts.channels.remove_channel(channel, out)


def channel_list(
    parts: EngineParts, client: Client, frame: tmqp.Frame, now: float, out: list[Outgoing]
) -> Page:
    _allow(parts, client, Action.CHANNEL_LIST, target=frame.target or None)
    match = _matcher(frame.target)
    channels = parts.channels.channels
    names = sorted(name for name in channels if match(name))
    return cut(
        names, _after(frame), lambda n: models.channel_information(channels[n]), _budget(parts)
    )


def channel_info(
    parts: EngineParts, client: Client, frame: tmqp.Frame, now: float, out: list[Outgoing]
) -> dict[str, Any]:
    channel = _channel(parts, frame)
    _allow(parts, client, Action.CHANNEL_LIST, channel.name)
    return models.channel_information(channel)


@dataclass(frozen=True, slots=True)
class Headed:
    """An operation's answer that is only headers (a JOIN granting fan-out)."""

    headers: tuple[tuple[str, str], ...]


def join(
    parts: EngineParts, client: Client, frame: tmqp.Frame, now: float, out: list[Outgoing]
) -> Headed | None:
    rules = join_rules.read(frame)
    if frame.headers and _pattern(frame):
        if rules:
            raise _error(
                ResultCode.BAD_REQUEST, "Selector and Credit apply to channel joins, not patterns"
            )
        join_pattern(parts, client, frame.target, _prefetch(parts, frame), now, out)
        return None  # (no fan-out grant: a pattern joins channels one by one)
    _join_ruled(parts, client, frame.target, rules, _prefetch(parts, frame), now, out)
    if parts.channels.patterns.by_client:
        parts.channels.patterns.release(client.id, frame.target)  # held by name now
    fanout = parts.channels.fanout
    if fanout is None:
        return None
    channel = parts.channels.channels.get(frame.target)
    if channel is None or client.id not in channel.consumers:
        return None
    asked = bool(frame.headers) and header(frame, FANOUT) == FANOUT_VERSION and not rules
    # (an ACK carries no headers: a grant would not reach the client)
    if not asked or not frame.pending_response or frame.pending_ack:
        # a join without fan-out (a re-join after a reconnect) ends a membership: that
        # client gets every delivery one by one again
        fanout.leave(channel, client.id, out)
        return None
    return Headed(fanout.grant(channel, client.id))


def _join_ruled(
    parts: EngineParts,
    client: Client,
    name: str,
    rules: join_rules.JoinRules,
    prefetch: int | None,
    now: float,
    out: list[Outgoing],
) -> None:
    """:func:`join_channel` with the JOIN's selector and credit (``join_rules``; none: a
    member's earlier ones removed), and the channel's retained message first to a client
    that was not a member (``broker.engine.retain``)."""
    channel = parts.channels.channels.get(name)
    handlers = parts.services.handlers
    per = per_message_rules(handlers)
    if rules:
        queues = list(channel.queues.values()) if channel is not None else []
        defaults = channel.options if channel is not None else parts.config.channel_defaults
        per = join_rules.check_channel(per, queues, defaults.queue)
        config = parts.config
        prefetch = join_rules.window(rules, prefetch, config.prefetch, config.max_prefetch)
    member = channel is not None and client.id in channel.consumers
    if per is not None and rules:
        join_rules.register(per, name, client.id, rules)  # (before the join's drain)
    elif per is not None and member:
        per.forget(name, client.id)  # a member's JOIN without them: they end
    joined: list[Outgoing] = []
    try:
        join_channel(parts, client, name, prefetch, now, joined)
    except Exception:
        if per is not None and not member:
            per.forget(name, client.id)
        raise
    if member and per is not None:  # its rules changed: what waits may be its now
        for queue in list(parts.channels.channels[name].queues.values()):
            queue.drain(now, joined)
    kept = None if member else parts.channels.retained.get(name)
    if kept is not None and (rules.selector is None or rules.selector.selects(kept.headers)):
        out.append(Outgoing(client.id, kept))
    out.extend(joined)


def join_channel(
    parts: EngineParts,
    client: Client,
    name: str,
    prefetch: int | None,
    now: float,
    out: list[Outgoing],
) -> None:
    """Make ``client`` a consumer of channel ``name`` (created on the fly if allowed)."""
    channel = parts.channels.channels.get(name)
    if channel is None:
        if not parts.config.auto_create_channel:
            raise _error(ResultCode.NOT_FOUND, f"no channel {name!r}", NackReason.NO_CHANNEL)
        _allow(parts, client, Action.JOIN, name)
        _allow(parts, client, Action.CHANNEL_CREATE, name)
        channel = parts.channels.create_channel(name, out=out, by=client)
    else:
        _allow(parts, client, Action.JOIN, channel.name)
    parts.channels.join(client, channel, now, out, prefetch)


def _prefetch(parts: EngineParts, frame: tmqp.Frame) -> int | None:
    """The JOIN's ``Prefetch`` header: 1.. (capped at the broker's max_prefetch) or None."""
    raw = header(frame, Header.PREFETCH) if frame.headers else None
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        value = 0
    if value < 1:
        raise _error(ResultCode.BAD_REQUEST, f"Prefetch must be a positive integer: {raw!r}")
    return min(value, parts.config.max_prefetch)


def _pattern(frame: tmqp.Frame) -> bool:
    """The frame's ``Pattern`` header: ``yes`` (its target is a pattern) or absent."""
    value = header(frame, Header.PATTERN)
    if value is None:
        return False
    if value.strip().lower() != "yes":
        raise _error(ResultCode.BAD_REQUEST, f"Pattern must be 'yes' when present: {value!r}")
    return True


def join_pattern(
    parts: EngineParts,
    client: Client,
    text: str,
    prefetch: int | None,
    now: float,
    out: list[Outgoing],
) -> None:
    """Join every channel pattern ``text`` matches that ``client`` may join, now and as
    such channels are created (``broker.engine.patterns``).  A channel the client is a
    consumer of already stays as it is; past ``max_joined_channels`` the rest are
    skipped.  The same pattern again changes nothing but its window."""
    patterns = parts.channels.patterns
    try:
        pattern = parse_pattern(text)
    except PatternError as exc:
        raise _error(ResultCode.BAD_REQUEST, exc.reason) from None
    joins = patterns.of(client.id)
    same = joins.get(text)
    if same is not None:
        same.prefetch = prefetch
        return
    if len(joins) >= parts.config.limits.max_pattern_joins:
        raise _error(ResultCode.LIMIT_EXCEEDED, "this client has too many pattern joins")
    if patterns.held() >= parts.config.limits.max_patterns and not patterns.joined(text):
        raise _error(ResultCode.LIMIT_EXCEEDED, "the broker has too many distinct patterns")
    held = PatternJoin(pattern, prefetch)
    patterns.add(client.id, held)
    registry = parts.channels
    for name, channel in list(registry.channels.items()):
        if name in client.channels or not pattern.matches(name):
            continue
        if not parts.authorizer.allows(client, Action.JOIN, name):
            continue  # a channel this client may not read: not joined
        try:
            registry.join(client, channel, now, out, prefetch)
        except OperationError:
            continue  # (a channel's client limit, this client's channel limit)
        held.channels.add(name)


def leave_pattern(parts: EngineParts, client: Client, text: str, out: list[Outgoing]) -> None:
    """Drop pattern join ``text`` (404 if none): the channels it joined are left, but
    for those another of the client's patterns matches (that one holds them now)."""
    patterns = parts.channels.patterns
    held = patterns.remove(client.id, text)
    if held is None:
        raise _error(ResultCode.NOT_FOUND, f"no pattern join {text[:80]!r}")
    registry = parts.channels
    for name in sorted(held.channels):
        heir = patterns.holder(client.id, name)
        if heir is not None:
            heir.channels.add(name)
            continue
        channel = registry.channels.get(name)
        if channel is not None:
            registry.leave(client, channel, out)


def leave(
    parts: EngineParts, client: Client, frame: tmqp.Frame, now: float, out: list[Outgoing]
) -> None:
    if frame.headers and _pattern(frame):
        leave_pattern(parts, client, frame.target, out)
        return
    leave_channel(parts, client, frame.target, out)
    if parts.channels.patterns.by_client:
        parts.channels.patterns.release(client.id, frame.target)


def leave_channel(parts: EngineParts, client: Client, name: str, out: list[Outgoing]) -> None:
    """``client`` stops consuming channel ``name`` (404 when it does not)."""
    channel = parts.channels.channels.get(name)
    if channel is None:
        raise _error(ResultCode.NOT_FOUND, f"no channel {name!r}", NackReason.NO_CHANNEL)
    if not parts.channels.leave(client, channel, out):
        raise _error(ResultCode.NOT_FOUND, "not a member of this channel", NackReason.NO_CHANNEL)


# ---------------------------------------------------------------------- queues


def queue_create(
    parts: EngineParts, client: Client, frame: tmqp.Frame, now: float, out: list[Outgoing]
) -> None:
    qid = _queue_id(frame)
    channel = parts.channels.channels.get(frame.target)
    if channel is None and not parts.config.auto_create_channel:
        _channel(parts, frame)  # raises 404
    _allow(parts, client, Action.QUEUE_CREATE, frame.target, qid)
    if channel is None:
        _allow(parts, client, Action.CHANNEL_CREATE, frame.target)
    base = (channel.options if channel is not None else parts.config.channel_defaults).queue
    options = base.updated(frame.payload) if _has_payload(frame) else base
    if channel is None:
        parts.channels.quotas.check(client.user, Kind.QUEUE)
        parts.channels.create_channel(frame.target, out=out, by=client)
    parts.channels.create_queue(frame.target, qid, options, out, by=client)


def queue_update(
    parts: EngineParts, client: Client, frame: tmqp.Frame, now: float, out: list[Outgoing]
) -> None:
    queue = _queue(parts, frame)
    _allow(parts, client, Action.QUEUE_UPDATE, queue.channel.name, queue.id)
    if not _has_payload(frame):
        raise _error(ResultCode.BAD_REQUEST, "ChannelQueueOptions JSON required")
    options = queue.options.updated(frame.payload)
    parts.services.check_handler(options.message_delivery_handler)
    queue.apply_options(options, now, out)
    channel = queue.channel
    parts.channels.definitions.queue(channel.name, queue.id, queue.options.to_json())
    parts.events.emit(
        EventName.QUEUE_UPDATED, models.queue_summary(queue), out, channel.name, queue.id
    )


def queue_delete(
    parts: EngineParts, client: Client, frame: tmqp.Frame, now: float, out: list[Outgoing]
) -> None:
    queue = _queue(parts, frame)
    _allow(parts, client, Action.QUEUE_REMOVE, queue.channel.name, queue.id)
    parts.channels.remove_queue(queue, out)


def queue_purge(
    parts: EngineParts, client: Client, frame: tmqp.Frame, now: float, out: list[Outgoing]
) -> dict[str, int]:
    """Remove the messages waiting in a queue (not those delivered and not acknowledged
    yet); their producers waiting for an acknowledge are nacked.  ``{"Removed": n}``."""
    queue = _queue(parts, frame)
    _allow(parts, client, Action.QUEUE_UPDATE, queue.channel.name, queue.id)
    removed = queue.clear(out, priority=True, regular=True, in_flight=False)
    return {"Removed": removed}


def queue_list(
    parts: EngineParts, client: Client, frame: tmqp.Frame, now: float, out: list[Outgoing]
) -> Page:
    channel = _channel(parts, frame)
    _allow(parts, client, Action.QUEUE_LIST, channel.name)
    queues = channel.queues
    ids = sorted(queues)
    return cut(ids, _after(frame, numeric=True), lambda i: queues[i].summary(), _budget(parts))


def queue_info(
    parts: EngineParts, client: Client, frame: tmqp.Frame, now: float, out: list[Outgoing]
) -> dict[str, Any]:
    queue = _queue(parts, frame)
    _allow(parts, client, Action.QUEUE_LIST, queue.channel.name, queue.id)
    return queue.information(parts.config.wall_clock(), now)


# ---------------------------------------------------------------------- reading by sequence


def _seq_header(frame: tmqp.Frame, name: str, default: int | None, lowest: int) -> int:
    raw = header(frame, name)
    if raw is None:
        if default is None:
            raise _error(ResultCode.BAD_REQUEST, f"{name} header required")
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise _error(ResultCode.BAD_REQUEST, f"bad {name} {raw!r}: an integer") from None
    if not lowest <= value <= 2**63 - 1:
        raise _error(ResultCode.BAD_REQUEST, f"bad {name} {raw!r}: at least {lowest}")
    return value


def _browse_payload(parts: EngineParts, items: list[tuple[int, Any]]) -> bytes:
    encoded = ((seq, encode_message(message)) for seq, message in items)
    return encode_browse(encoded, _budget(parts))


def queue_bounds(
    parts: EngineParts, client: Client, frame: tmqp.Frame, now: float, out: list[Outgoing]
) -> dict[str, Any]:
    queue = _queue(parts, frame)
    _allow(parts, client, Action.BROWSE, queue.channel.name, queue.id)
    b = reading.bounds(queue)
    return {"First": b.first, "Last": b.last}


def queue_browse(
    parts: EngineParts, client: Client, frame: tmqp.Frame, now: float, out: list[Outgoing]
) -> bytes:
    """Held messages from ``From-Seq`` on (``Limit`` at most; the reply budget may cut the
    list shorter, never below one message), as ``broker.sequence`` entries."""
    queue = _queue(parts, frame)
    _allow(parts, client, Action.BROWSE, queue.channel.name, queue.id)
    from_seq = _seq_header(frame, Header.FROM_SEQ, None, -1)
    limit = _seq_header(frame, Header.LIMIT, DEFAULT_BROWSE_LIMIT, 1)
    return _browse_payload(parts, reading.browse(queue, from_seq, min(limit, MAX_BROWSE_LIMIT)))


def queue_release(
    parts: EngineParts, client: Client, frame: tmqp.Frame, now: float, out: list[Outgoing]
) -> dict[str, Any]:
    queue = _queue(parts, frame)
    _allow(parts, client, Action.RELEASE, queue.channel.name, queue.id)
    if not queue.options.allow_release:
        raise _error(
            ResultCode.UNACCEPTABLE,
            f"queue {queue.channel.name}/{queue.id} does not allow release (option AllowRelease)",
        )
    through = _seq_header(frame, Header.THROUGH_SEQ, None, 0)
    released = reading.release(queue, through, out)
    queue.store.removals_answered()  # (the answer waits for them: durable before it leaves)
    queue.drain(now, out)
    return {"Released": released}


def _sequences(frame: tmqp.Frame) -> set[int] | None:
    raw = header(frame, Header.SEQUENCES)
    if raw is None:
        return None
    out: set[int] = set()
    for part in raw.split(","):
        part = part.strip()
        if not part.isdigit() or len(part) > 19:
            raise _error(ResultCode.BAD_REQUEST, f"bad {Header.SEQUENCES} {raw!r}")
        out.add(int(part))
    return out


def trash_list(
    parts: EngineParts, client: Client, frame: tmqp.Frame, now: float, out: list[Outgoing]
) -> bytes:
    queue = _queue(parts, frame)
    _allow(parts, client, Action.BROWSE, queue.channel.name, queue.id)
    from_seq = _seq_header(frame, Header.FROM_SEQ, 0, 0)
    limit = min(_seq_header(frame, Header.LIMIT, DEFAULT_BROWSE_LIMIT, 1), MAX_BROWSE_LIMIT)
    queue.trash.prune(now, queue.options.trash_retention)
    return _browse_payload(parts, queue.trash.listing(from_seq, limit))


def trash_resubmit(
    parts: EngineParts, client: Client, frame: tmqp.Frame, now: float, out: list[Outgoing]
) -> dict[str, Any]:
    """Push trashed messages back into their queue (oldest first) as new messages; one
    the queue refuses (full, Stopped) stays in the trash, with those after it."""
    queue = _queue(parts, frame)
    _allow(parts, client, Action.TRASH, queue.channel.name, queue.id)
    trash = queue.trash
    trash.prune(now, queue.options.trash_retention)
    done = 0
    for seq in trash.chosen(_sequences(frame)):
        item = trash.peek(seq)
        if queue.check_push(len(item.message.payload)):
            break
        queue.accept(item.message.replace(wants_ack=False), None, now, out, False)
        trash.pop(seq)  # (after: saved as a new message first, then forgotten there)
        done += 1
    return {"Resubmitted": done}


def trash_purge(
    parts: EngineParts, client: Client, frame: tmqp.Frame, now: float, out: list[Outgoing]
) -> dict[str, Any]:
    queue = _queue(parts, frame)
    _allow(parts, client, Action.TRASH, queue.channel.name, queue.id)
    return {"Purged": len(queue.trash.take(_sequences(frame)))}


# ---------------------------------------------------------------------- connections


def node_list(
    parts: EngineParts, client: Client, frame: tmqp.Frame, now: float, out: list[Outgoing]
) -> list[dict[str, Any]]:
    _allow(parts, client, Action.ADMIN)
    return []  # no federation peers yet


def client_list(
    parts: EngineParts, client: Client, frame: tmqp.Frame, now: float, out: list[Outgoing]
) -> Page:
    _allow(parts, client, Action.ADMIN)
    wanted = frame.target or None
    clients = parts.clients.clients
    ids = sorted(i for i, c in clients.items() if wanted is None or c.type == wanted)
    return cut(
        ids, _after(frame), lambda i: models.client_information(clients[i], now), _budget(parts)
    )


# ---------------------------------------------------------------------- routers


def _router(parts: EngineParts, frame: tmqp.Frame) -> Router:
    router = parts.routers.routers.get(frame.target)
    if router is None:
        raise _error(ResultCode.NOT_FOUND, f"no router {frame.target!r}", NackReason.NO_ROUTE)
    return router


def router_create(
    parts: EngineParts, client: Client, frame: tmqp.Frame, now: float, out: list[Outgoing]
) -> None:
    _allow(parts, client, Action.ROUTER_MANAGE, target=frame.target)
    if not frame.target or len(frame.target.encode()) > 255:
        raise _error(ResultCode.BAD_REQUEST, "router name required")
    router = parts.routers.add(Router(frame.target, method_from_json(frame.payload)))
    _keep_router(parts, router)


def router_remove(
    parts: EngineParts, client: Client, frame: tmqp.Frame, now: float, out: list[Outgoing]
) -> None:
    router = _router(parts, frame)
    _allow(parts, client, Action.ROUTER_MANAGE, target=router.name)
    parts.routers.remove(router.name)
    parts.channels.definitions.forget_router(router.name)


def router_list(
    parts: EngineParts, client: Client, frame: tmqp.Frame, now: float, out: list[Outgoing]
) -> Page:
    _allow(parts, client, Action.ROUTER_MANAGE, target=frame.target or None)
    match = _matcher(frame.target)
    routers = parts.routers.routers
    names = sorted(name for name in routers if match(name))
    return cut(names, _after(frame), lambda n: routers[n].to_json(), _budget(parts))


def binding_add(
    parts: EngineParts, client: Client, frame: tmqp.Frame, now: float, out: list[Outgoing]
) -> None:
    router = _router(parts, frame)
    _allow(parts, client, Action.ROUTER_MANAGE, target=router.name)
    binding = binding_from_json(frame.payload)
    if len(router.bindings) >= parts.config.limits.max_bindings_per_router:
        raise _error(ResultCode.LIMIT_EXCEEDED, "too many bindings in this router")
    try:
        router.add(binding)
    except RouterError as exc:
        raise _error(ResultCode.ALREADY_CREATED, str(exc)) from None
    _keep_router(parts, router)


def binding_remove(
    parts: EngineParts, client: Client, frame: tmqp.Frame, now: float, out: list[Outgoing]
) -> None:
    router = _router(parts, frame)
    _allow(parts, client, Action.ROUTER_MANAGE, target=router.name)
    name = header(frame, "Binding-Name")
    if name is None and _has_payload(frame):
        try:
            obj = json.loads(frame.payload)
        except ValueError:
            obj = None
        name = obj.get("Name") if isinstance(obj, dict) else None
    if not isinstance(name, str) or not name:
        raise _error(ResultCode.BAD_REQUEST, 'binding name required ({"Name": ...})')
    if not router.remove(name):
        raise _error(ResultCode.NOT_FOUND, f"no binding {name!r}")
    _keep_router(parts, router)


def binding_list(
    parts: EngineParts, client: Client, frame: tmqp.Frame, now: float, out: list[Outgoing]
) -> Page:
    router = _router(parts, frame)
    _allow(parts, client, Action.ROUTER_MANAGE, target=router.name)
    bindings = list(router.bindings)  # in the router's order: the key is the position
    positions = list(range(len(bindings)))
    return cut(
        positions, _after(frame, numeric=True), lambda i: bindings[i].to_json(), _budget(parts)
    )


def _keep_router(parts: EngineParts, router: Router) -> None:
    """Keep the router's definition (with its bindings) for a restart."""
    parts.channels.definitions.router(router.name, router.to_json())


# ---------------------------------------------------------------------- durable subscriptions


def dsub_create(
    parts: EngineParts, client: Client, frame: tmqp.Frame, now: float, out: list[Outgoing]
) -> None:
    """Create (or update the topics of) durable subscription ``target``: JSON
    ``{"Topics": [channel, ...]}``; needs channel-create on its channel and join on each
    topic."""
    sub_id = frame.target
    try:
        obj = json.loads(frame.payload) if _has_payload(frame) else None
    except ValueError:
        obj = None
    topics = obj.get("Topics") if isinstance(obj, dict) else None
    if not isinstance(topics, list) or not all(isinstance(t, str) for t in topics):
        raise _error(ResultCode.BAD_REQUEST, 'topics required ({"Topics": [channel, ...]})')
    _allow(parts, client, Action.CHANNEL_CREATE, dsub_channel(sub_id))
    for topic in topics:
        _allow(parts, client, Action.JOIN, topic)
    parts.durable.create(sub_id, topics, out, by=client)


def dsub_destroy(
    parts: EngineParts, client: Client, frame: tmqp.Frame, now: float, out: list[Outgoing]
) -> None:
    _allow(parts, client, Action.CHANNEL_REMOVE, dsub_channel(frame.target))
    parts.durable.destroy(frame.target, out)


def dsub_list(
    parts: EngineParts, client: Client, frame: tmqp.Frame, now: float, out: list[Outgoing]
) -> Page:
    _allow(parts, client, Action.CHANNEL_LIST)
    subs = parts.durable.listing()
    by_id = {item["Id"]: item for item in subs}
    return cut(sorted(by_id), _after(frame), lambda i: by_id[i], _budget(parts))


# operation content type -> (function, answered by a RESPONSE)
_OPERATIONS: dict[int, tuple[_Op, bool]] = {
    Operation.CHANNEL_CREATE: (channel_create, False),
    Operation.CHANNEL_UPDATE: (channel_update, False),
    Operation.CHANNEL_DELETE: (channel_delete, False),
    Operation.CHANNEL_LIST: (channel_list, True),
    Operation.CHANNEL_INFO: (channel_info, True),
    Operation.JOIN: (join, False),
    Operation.LEAVE: (leave, False),
    Operation.QUEUE_CREATE: (queue_create, False),
    Operation.QUEUE_UPDATE: (queue_update, False),
    Operation.QUEUE_DELETE: (queue_delete, False),
    Operation.QUEUE_LIST: (queue_list, True),
    Operation.QUEUE_INFO: (queue_info, True),
    Operation.QUEUE_PURGE: (queue_purge, True),
    Operation.QUEUE_BOUNDS: (queue_bounds, True),
    Operation.QUEUE_BROWSE: (queue_browse, True),
    Operation.QUEUE_RELEASE: (queue_release, True),
    Operation.TRASH_LIST: (trash_list, True),
    Operation.TRASH_RESUBMIT: (trash_resubmit, True),
    Operation.TRASH_PURGE: (trash_purge, True),
    Operation.NODE_LIST: (node_list, True),
    Operation.CLIENT_LIST: (client_list, True),
    Operation.DSUB_CREATE: (dsub_create, False),
    Operation.DSUB_DESTROY: (dsub_destroy, False),
    Operation.DSUB_LIST: (dsub_list, True),
    RouterOperation.ROUTER_CREATE: (router_create, False),
    RouterOperation.ROUTER_REMOVE: (router_remove, False),
    RouterOperation.ROUTER_LIST: (router_list, True),
    RouterOperation.BINDING_ADD: (binding_add, False),
    RouterOperation.BINDING_REMOVE: (binding_remove, False),
    RouterOperation.BINDING_LIST: (binding_list, True),
}


# ---------------------------------------------------------------------- events


def event_subscription(
    parts: EngineParts, client: Client, frame: tmqp.Frame, out: list[Outgoing]
) -> None:
    """EVENT from a client: content type 1 subscribes, 0 unsubscribes; always acknowledged."""
    name = frame.target
    try:
        if name not in EVENT_NAMES:
            raise _error(ResultCode.NOT_FOUND, f"unknown event {name!r}")
        channel = header(frame, Header.CHANNEL_NAME) or None
        queue = _queue_id(frame) if header(frame, Header.QUEUE_ID) is not None else None
        if frame.content_type == 1:
            _allow(parts, client, Action.EVENT, channel, queue, name)
            events, limit = parts.events, parts.config.limits.max_event_subscriptions
            if events.count(client.id) >= limit and not events.has_subscription(
                client.id, name, channel, queue
            ):
                raise _error(ResultCode.LIMIT_EXCEEDED, "too many event subscriptions")
            parts.events.subscribe(client.id, name, channel, queue)
        elif frame.content_type == 0:
            parts.events.unsubscribe(client.id, name, channel, queue)
        else:
            raise _error(ResultCode.BAD_REQUEST, "content type must be 1 (subscribe) or 0")
    except OperationError as err:
        reply(client, frame, out, response=False, error=err)
        return
    reply(client, frame, out, response=False)
