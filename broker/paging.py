"""Replies in pages: a list whose JSON would not fit one frame comes a page at a time.

List operations (channels, queues, clients, routers, bindings) and the server's
statistics answer with at most ``Limits.max_reply_size`` octets of JSON items.  A reply
that stops before the end of the list carries a ``Page-Next: KEY`` header; the client
asks again with the same request plus ``Page-After: KEY`` and gets the items after KEY,
until a reply comes without ``Page-Next``.  Items are in key order (names and ids sort as
text, queue ids and bindings as numbers), so that an item added or removed between two
requests does not shift the others: each item present throughout is listed exactly once.
A page always holds at least one item, however large.

Sans-IO: the engine (``broker.engine.operations``) and the server (statistics) cut the pages;
both clients gather them with ``merge`` below and ``broker.client.admin.next_page``.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

K = TypeVar("K", str, int)


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a list: its JSON items and the key to ask for the next page (or None)."""

    items: list[Any]
    next: str | None = None


def json_size(value: Any) -> int:
    """Octets of ``value`` as the broker encodes replies (compact, ASCII)."""
    return len(json.dumps(value, separators=(",", ":")))


def cut(
    keys: Sequence[K],
    after: K | None,
    model: Callable[[K], Any],
    budget: int,
) -> Page:
    """The page of ``keys`` (sorted) after ``after``: ``model(key)`` for as many keys as
    fit ``budget`` octets of JSON (at least one)."""
    start = bisect_right(keys, after) if after is not None else 0
    return fill(((k, model(k)) for k in keys[start:]), budget)


def fill(entries: Iterable[tuple[Any, Any]], budget: int) -> Page:
    """A page of the (key, item) entries, in order, within ``budget`` octets of JSON."""
    items: list[Any] = []
    used = 2  # the brackets
    last: Any = None
    for key, item in entries:
        size = json_size(item) + 1  # and its comma
        if items and used + size > budget:
            return Page(items, str(last))
        items.append(item)
        used += size
        last = key
    return Page(items)


def parse_after(raw: str | None, numeric: bool) -> str | int | None:
    """The ``Page-After`` value as a key (ValueError when a numeric key is not a number)."""
    if raw is None:
        return None
    return int(raw) if numeric else raw


def merge(first: Any, later: Any, path: tuple[str, ...] = ()) -> None:
    """Append the items of a later page to the first one (the list at ``path`` in dicts)."""
    target, extra = first, later
    for key in path:
        target, extra = target[key], extra[key]
    target.extend(extra)
