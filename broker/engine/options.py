"""Channel, queue and broker options, with JSON in the document's PascalCase names.

``ChannelQueueOptions`` and ``ChannelOptions`` are the models of the Twino MQ 3.0 document
(sections "Channel Queue Options" and "Channel Options"); JSON keys are matched
case-insensitively, missing keys take the defaults of a base object, unknown keys and
wrong types raise :class:`OptionsError`.  ``BrokerConfig`` is the engine's own
configuration (Python only).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from broker.engine.limits import Limits
from broker.protocol import QueueStatus

#: Consumed messages a ``Retain`` queue keeps readable unless its ``RetainLimit`` says
#: otherwise (0 there means this default too).
DEFAULT_RETAIN_LIMIT = 10_000


class OptionsError(ValueError):
    """Options JSON is malformed, has an unknown key or a value of the wrong type."""


def _status(value: Any) -> QueueStatus:
    if isinstance(value, bool):
        raise OptionsError("Status must be an integer 0..6 or a status name")
    if isinstance(value, int):
        try:
            return QueueStatus(value)
        except ValueError:
            raise OptionsError(f"unknown queue status {value}") from None
    if isinstance(value, str):
        key = value.strip().upper().replace("-", "_").replace(" ", "_")
        key = {"ROUNDROBIN": "ROUND_ROBIN", "PAUSE": "PAUSED", "STOP": "STOPPED"}.get(key, key)
        try:
            return QueueStatus[key]
        except KeyError:
            raise OptionsError(f"unknown queue status {value!r}") from None
    raise OptionsError("Status must be an integer 0..6 or a status name")


def status_name(status: QueueStatus) -> str:
    """The status as the document's QueueInformation shows it (``"RoundRobin"``)."""
    return _STATUS_NAMES[status]


#: (made once: the statistics name every queue's status at each read)
_STATUS_NAMES = {s: "".join(part.capitalize() for part in s.name.split("_")) for s in QueueStatus}


def _bool(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise OptionsError(f"{key} must be a boolean")
    return value


def _count(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise OptionsError(f"{key} must be a non-negative integer")
    return value


def _text(value: Any, key: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise OptionsError(f"{key} must be a string or null")


def _queue_ids(value: Any, key: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise OptionsError(f"{key} must be an array of queue ids or null")
    out = []
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int) or not 0 <= item <= 0xFFFF:
            raise OptionsError(f"{key} must hold queue ids 0..65535")
        out.append(item)
    return tuple(out)


# JSON key -> (attribute, converter)
_QUEUE_FIELDS: dict[str, tuple[str, Callable[[Any, str], Any]]] = {
    "SendOnlyFirstAcquirer": ("send_only_first_acquirer", _bool),
    "OnlyFirstAcquirer": ("send_only_first_acquirer", _bool),  # alias used by *Information
    "RequestAcknowledge": ("request_acknowledge", _bool),
    "AcknowledgeTimeout": ("acknowledge_timeout", _count),
    "MessageTimeout": ("message_timeout", _count),
    "UseMessageId": ("use_message_id", _bool),
    "WaitForAcknowledge": ("wait_for_acknowledge", _bool),
    "HideClientNames": ("hide_client_names", _bool),
    "Status": ("status", lambda v, k: _status(v)),
    "MessageDeliveryHandler": ("message_delivery_handler", _text),
    "MessageLimit": ("message_limit", _count),
    "MessageSizeLimit": ("message_size_limit", _count),
    "PutBackLimit": ("put_back_limit", _count),
    "PutBackDelay": ("put_back_delay", _count),
    "Prefetch": ("prefetch", _count),
    "Tag": ("tag", _text),
    "Retain": ("retain", _bool),
    "RetainLimit": ("retain_limit", _count),
    "AllowRelease": ("allow_release", _bool),
    "DuplicateWindow": ("duplicate_window", _count),
    "DuplicateWindowTime": ("duplicate_window_time", _count),
    "TrashLimit": ("trash_limit", _count),
    "TrashRetention": ("trash_retention", _count),
}

_CHANNEL_FIELDS: dict[str, tuple[str, Callable[[Any, str], Any]]] = {
    "AllowMultipleQueues": ("allow_multiple_queues", _bool),
    "AllowedQueues": ("allowed_queues", _queue_ids),
    "EventHandler": ("event_handler", _text),
    "Authenticator": ("authenticator", _text),
    "ClientLimit": ("client_limit", _count),
    "QueueLimit": ("queue_limit", _count),
    "DestroyWhenEmpty": ("destroy_when_empty", _bool),
}

_QUEUE_KEYS = {key.lower(): spec for key, spec in _QUEUE_FIELDS.items()}
_CHANNEL_KEYS = {key.lower(): spec for key, spec in _CHANNEL_FIELDS.items()}


def _load_json(data: bytes | str | Mapping[str, Any]) -> Mapping[str, Any]:
    if isinstance(data, Mapping):
        return data
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise OptionsError(f"options are not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise OptionsError("options must be a JSON object")
    return obj


@dataclass(frozen=True, slots=True)
class ChannelQueueOptions:
    """Options of one queue (document: "Channel Queue Options").

    Times are milliseconds; 0 means "none" for timeouts and "unlimited" for limits.
    ``put_back_limit``/``put_back_delay``/``tag`` are zerohub additions the document
    mentions without naming (put back limit) or shows in events (tag).  ``prefetch``
    (zerohub) is each consumer's window of deliveries in flight (``broker.flow``); 0 takes
    the broker's ``BrokerConfig.prefetch``, and values above ``max_prefetch`` are capped.
    """

    send_only_first_acquirer: bool = False
    request_acknowledge: bool = False
    acknowledge_timeout: int = 15_000
    message_timeout: int = 0
    use_message_id: bool = True
    wait_for_acknowledge: bool = False
    hide_client_names: bool = False
    status: QueueStatus = QueueStatus.PUSH
    message_delivery_handler: str | None = None
    message_limit: int = 0
    message_size_limit: int = 0
    put_back_limit: int = 0
    put_back_delay: int = 0
    prefetch: int = 0
    tag: str | None = None
    #: zerohub (``broker.sequence``): consumed messages stay readable by sequence
    #: (browse) until released or pushed out by newer ones past ``retain_limit``.
    retain: bool = False
    retain_limit: int = DEFAULT_RETAIN_LIMIT
    #: zerohub: clients with the ``release`` permission may remove messages by sequence.
    allow_release: bool = False
    #: zerohub (``broker.engine.queue.dedupe``): with ``use_message_id``, the latest
    #: producer message ids remembered (0: no duplicate suppression) and for how long (ms).
    duplicate_window: int = 10_000
    duplicate_window_time: int = 300_000
    #: zerohub (``broker.engine.queue.trash``): messages the trash keeps (0: none) and for
    #: how long (ms; 0: no time bound).
    trash_limit: int = 1_000
    trash_retention: int = 86_400_000

    def to_json(self) -> dict[str, Any]:
        return {
            "SendOnlyFirstAcquirer": self.send_only_first_acquirer,
            "RequestAcknowledge": self.request_acknowledge,
            "AcknowledgeTimeout": self.acknowledge_timeout,
            "MessageTimeout": self.message_timeout,
            "UseMessageId": self.use_message_id,
            "WaitForAcknowledge": self.wait_for_acknowledge,
            "HideClientNames": self.hide_client_names,
            "Status": int(self.status),
            "MessageDeliveryHandler": self.message_delivery_handler,
            "MessageLimit": self.message_limit,
            "MessageSizeLimit": self.message_size_limit,
            "PutBackLimit": self.put_back_limit,
            "PutBackDelay": self.put_back_delay,
            "Prefetch": self.prefetch,
            "Tag": self.tag,
            "Retain": self.retain,
            "RetainLimit": self.retain_limit,
            "AllowRelease": self.allow_release,
            "DuplicateWindow": self.duplicate_window,
            "DuplicateWindowTime": self.duplicate_window_time,
            "TrashLimit": self.trash_limit,
            "TrashRetention": self.trash_retention,
        }

    def updated(self, data: bytes | str | Mapping[str, Any]) -> ChannelQueueOptions:
        """A copy with the properties present in ``data`` (JSON) replaced."""
        return _apply(self, _load_json(data), _QUEUE_KEYS, None)

    @classmethod
    def from_json(
        cls, data: bytes | str | Mapping[str, Any], base: ChannelQueueOptions | None = None
    ) -> ChannelQueueOptions:
        return (base or cls()).updated(data)


@dataclass(frozen=True, slots=True)
class ChannelOptions:
    """Options of a channel (document: "Channel Options"); includes the queue defaults."""

    queue: ChannelQueueOptions = field(default_factory=ChannelQueueOptions)
    allow_multiple_queues: bool = True
    allowed_queues: tuple[int, ...] | None = None
    event_handler: str | None = None
    authenticator: str | None = None
    client_limit: int = 0
    queue_limit: int = 0
    destroy_when_empty: bool = False

    def to_json(self) -> dict[str, Any]:
        out = self.queue.to_json()
        out.update(
            {
                "AllowMultipleQueues": self.allow_multiple_queues,
                "AllowedQueues": None
                if self.allowed_queues is None
                else list(self.allowed_queues),
                "EventHandler": self.event_handler,
                "Authenticator": self.authenticator,
                "ClientLimit": self.client_limit,
                "QueueLimit": self.queue_limit,
                "DestroyWhenEmpty": self.destroy_when_empty,
            }
        )
        return out

    def updated(self, data: bytes | str | Mapping[str, Any]) -> ChannelOptions:
        obj = _load_json(data)
        queue_part = {k: v for k, v in obj.items() if k.lower() in _QUEUE_KEYS}
        channel_part = {k: v for k, v in obj.items() if k.lower() not in _QUEUE_KEYS}
        queue = _apply(self.queue, queue_part, _QUEUE_KEYS, None)
        return _apply(self, channel_part, _CHANNEL_KEYS, queue)

    @classmethod
    def from_json(
        cls, data: bytes | str | Mapping[str, Any], base: ChannelOptions | None = None
    ) -> ChannelOptions:
        return (base or cls()).updated(data)


def _apply(
    base: Any,
    obj: Mapping[str, Any],
    keys: dict[str, tuple[str, Callable[[Any, str], Any]]],
    queue: ChannelQueueOptions | None,
) -> Any:
    changes: dict[str, Any] = {}
    for key, value in obj.items():
        spec = keys.get(str(key).lower())
        if spec is None:
            raise OptionsError(f"unknown option {key!r}")
        attr, convert = spec
        changes[attr] = convert(value, key)
    if queue is not None:
        changes["queue"] = queue
    return dataclasses.replace(base, **changes) if changes else base


@dataclass(frozen=True)
class BrokerConfig:
    """Engine configuration (Python API; not sent over the wire).

    ``wall_clock`` gives UNIX seconds for the informational timestamps
    (LastMessageReceived ...), read only when such a model is built; every timer runs on
    the monotonic ``now`` the caller passes in.
    """

    channel_defaults: ChannelOptions = field(default_factory=ChannelOptions)
    auto_create_channel: bool = True
    auto_create_queue: bool = True
    node_name: str = "zerohub"
    wall_clock: Callable[[], float] = time.time
    #: Deliveries of one queue a consumer may hold in flight: unacknowledged (queues
    #: requesting acknowledges) or handed to the transport but not yet on the client's
    #: socket (the rest).  A queue's ``Prefetch`` option or a client's ``Prefetch`` JOIN
    #: header overrides it, up to ``max_prefetch``.  See ``broker.flow``.
    prefetch: int = 1000
    max_prefetch: int = 100_000
    #: Bounds of every table clients can grow (``broker.limits``; ``[limits]`` in the config).
    limits: Limits = field(default_factory=Limits)
    #: Routers to create at start, as JSON objects: ``{"Name": "r", "Method": "RoundRobin",
    #: "Bindings": [{"Name": "b", "Type": "Queue", "Target": "ch", "Queue": 1}, ...]}``.
    routers: tuple[Mapping[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if not 1 <= self.prefetch <= self.max_prefetch:
            raise OptionsError("need 1 <= prefetch <= max_prefetch")
