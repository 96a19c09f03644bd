"""The engine's window of federation ids (``broker.engine.federated``) over a real log."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import pytest

from broker import tmqp
from broker.engine.delivery import PersistentDeliveryHandler
from broker.engine.engine import Engine
from broker.engine.errors import ClientRejected
from broker.engine.federated import FEDERATION_CLIENT, FederatedIds
from broker.engine.options import ChannelQueueOptions
from broker.message import Message
from broker.protocol import ConnectionInfo, Header, MessageType, Outgoing, ResultCode, header
from broker.store.durable import DurableStore
from broker.store.log import LogStore

PERSISTENT = ChannelQueueOptions(message_delivery_handler="persistent")


def _engine(store: DurableStore, *, limit: int = 0) -> Engine:
    engine = Engine(store=store, handlers={"persistent": PersistentDeliveryHandler()})
    if engine.recover(now=0.0) == 0 and "orders" not in engine.channels:
        engine.create_channel("orders")
        options = dataclasses.replace(PERSISTENT, message_limit=limit)
        engine.create_queue("orders", 1, options)
    return engine


_ids = itertools.count()


def _push(
    engine: Engine, client: str, fed_id: str, payload: bytes, *more: tuple[str, str]
) -> list[Outgoing]:
    """A push as a client makes it: each with a message id of its own."""
    m = Message(target="orders", content_type=1, message_id=f"m{next(_ids)}", wants_ack=True,
                headers=(("Fed-Id", fed_id), *more), payload=payload)  # fmt: skip
    return engine.publish(client, m, now=0.0)


def _acked(outs: list[Outgoing], client: str) -> bool:
    """A positive acknowledge to ``client`` among ``outs``."""
    return any(
        o.client_id == client
        and isinstance(o.frame, tmqp.Frame)
        and o.frame.message_type == MessageType.ACK
        and header(o.frame, Header.NACK_REASON) is None
        for o in outs
    )


def _waiting(engine: Engine) -> int:
    return engine.channels["orders"].queues[1].messages.count


def test_a_federated_push_is_taken_once_also_after_a_restart(tmp_path: Path) -> None:
    with LogStore(tmp_path) as log:
        store = DurableStore(log)
        engine = _engine(store)
        engine.connect(ConnectionInfo(client_id=FEDERATION_CLIENT), now=0.0, federation=True)
        before = store.appended
        assert _acked(_push(engine, FEDERATION_CLIENT, "P/1", b"m1"), FEDERATION_CLIENT)
        assert store.appended > before  # the id is a write the acknowledge waits for
        assert _acked(_push(engine, FEDERATION_CLIENT, "P/1", b"m1"), FEDERATION_CLIENT)
        assert _waiting(engine) == 1 and engine.federated.duplicates == 1
        log.flush()
    with LogStore(tmp_path) as log:  # a restart: the id comes back with the message
        engine = _engine(DurableStore(log))
        assert _waiting(engine) == 1
        engine.connect(ConnectionInfo(client_id=FEDERATION_CLIENT), now=0.0, federation=True)
        assert _acked(_push(engine, FEDERATION_CLIENT, "P/1", b"m1"), FEDERATION_CLIENT)
        assert _waiting(engine) == 1  # answered as done, not queued again
        assert _acked(_push(engine, FEDERATION_CLIENT, "P/2", b"m2"), FEDERATION_CLIENT)
        assert _waiting(engine) == 2


def test_a_federated_push_with_cc_headers_is_taken_once(tmp_path: Path) -> None:
    """The publisher's CC header travels with the message: its copies count too."""
    with LogStore(tmp_path) as log:
        engine = _engine(DurableStore(log))
        engine.create_queue("orders", 2, PERSISTENT)
        engine.connect(ConnectionInfo(client_id=FEDERATION_CLIENT), now=0.0, federation=True)
        for _ in range(2):
            outs = _push(engine, FEDERATION_CLIENT, "P/1", b"m1", ("CC", "orders;2"))
            assert _acked(outs, FEDERATION_CLIENT)
        assert _waiting(engine) == 1
        assert engine.channels["orders"].queues[2].messages.count == 1


def test_another_clients_fed_id_header_is_not_remembered(tmp_path: Path) -> None:
    """An impostor's push with a Fed-Id cannot make the broker drop the real message."""
    with LogStore(tmp_path) as log:
        engine = _engine(DurableStore(log))
        engine.connect(ConnectionInfo(client_id="impostor"), now=0.0)
        engine.connect(ConnectionInfo(client_id=FEDERATION_CLIENT), now=0.0, federation=True)
        assert _acked(_push(engine, "impostor", "P/1", b"fake"), "impostor")
        assert _acked(_push(engine, FEDERATION_CLIENT, "P/1", b"m1"), FEDERATION_CLIENT)
        assert _waiting(engine) == 2


def test_a_refused_federated_push_is_not_remembered(tmp_path: Path) -> None:
    """A push the queue refused (full) must be taken when it comes again."""
    with LogStore(tmp_path) as log:
        engine = _engine(DurableStore(log), limit=1)
        engine.connect(ConnectionInfo(client_id=FEDERATION_CLIENT), now=0.0, federation=True)
        assert _acked(_push(engine, FEDERATION_CLIENT, "P/1", b"m1"), FEDERATION_CLIENT)
        refused = _push(engine, FEDERATION_CLIENT, "P/2", b"m2")
        assert refused and not _acked(refused, FEDERATION_CLIENT)
        assert "P/2" not in engine.federated.ids


def test_the_window_keeps_the_newest_ids_in_their_order(tmp_path: Path) -> None:
    with LogStore(tmp_path) as log:
        ids = FederatedIds(DurableStore(log), window=3)
        for n in range(5):
            ids.add(f"P/{n}")
        assert list(ids.ids) == ["P/2", "P/3", "P/4"]
        log.flush()
    with LogStore(tmp_path) as log:
        store = DurableStore(log)
        assert sum(name.startswith("fedseen/") for name in store.definitions()) == 3
        ids = FederatedIds(store, window=3)
        assert ids.load() == 3
        assert list(ids.ids) == ["P/2", "P/3", "P/4"]
        assert ids.seen("P/4") and not ids.seen("P/1")
        ids.add("P/5")  # numbering goes on: the oldest slot is reused
        assert list(ids.ids) == ["P/3", "P/4", "P/5"]
        log.flush()
    with LogStore(tmp_path) as log:
        ids = FederatedIds(DurableStore(log), window=3)
        ids.load()
        assert list(ids.ids) == ["P/3", "P/4", "P/5"]


def test_the_federation_client_id_is_reserved_for_a_proven_connection(tmp_path: Path) -> None:
    """Without the front door's proof nobody gets the federation's id (401, said why):
    an impostor cannot pre-mark a federation id as seen; the proven client's push with
    that id is then taken."""
    with LogStore(tmp_path) as log:
        engine = _engine(DurableStore(log))
        with pytest.raises(ClientRejected, match="reserved") as refused:
            engine.connect(ConnectionInfo(client_id=FEDERATION_CLIENT), now=0.0)
        assert refused.value.code == ResultCode.UNAUTHORIZED
        assert FEDERATION_CLIENT not in engine.clients
        engine.connect(ConnectionInfo(client_id=FEDERATION_CLIENT), now=0.0, federation=True)
        assert _acked(_push(engine, FEDERATION_CLIENT, "P/1", b"m1"), FEDERATION_CLIENT)
        assert _waiting(engine) == 1


@pytest.mark.parametrize("cc", [False, True], ids=["plain", "cc"])
def test_a_kill_while_the_drain_holds_the_save_never_leaves_the_id_without_its_message(
    tmp_path: Path, cc: bool
) -> None:
    """The server's drain holds the store's appends (``Store.hold``) until the drain
    ends.  A kill -9 before then loses what was held, but nothing that reached the log.
    The federated push's id must not reach the log before its message: the id written
    first survived alone, and the link's resend after the restart was answered "taken
    before" and never queued -- an acknowledged persistent message lost (the federation
    kill -9 test: 2 of 20 stress runs).  After the fix the id's write gives the held
    message to the log first; whatever the kill leaves, the resend ends up queued once."""
    more = (("CC", "orders;2"),) if cc else ()
    with LogStore(tmp_path) as log:
        store = DurableStore(log)
        engine = _engine(store)
        engine.create_queue("orders", 2, PERSISTENT)
        engine.connect(ConnectionInfo(client_id=FEDERATION_CLIENT), now=0.0, federation=True)
        store.hold()  # a drain begins (``OutputGate.begin``)
        _push(engine, FEDERATION_CLIENT, "P/1", b"m1", *more)
        # the kill -9: what was given to the log is written, what is held is gone
        log.flush()
    with LogStore(tmp_path) as log:
        engine = _engine(DurableStore(log))
        engine.connect(ConnectionInfo(client_id=FEDERATION_CLIENT), now=0.0, federation=True)
        # no acknowledge left before the kill: the link sends it again
        assert _acked(_push(engine, FEDERATION_CLIENT, "P/1", b"m1", *more), FEDERATION_CLIENT)
        assert _waiting(engine) == 1, "the resend was dropped: its id survived, not the message"
        if cc:
            assert engine.channels["orders"].queues[2].messages.count == 1


def test_a_federated_push_the_store_refused_is_not_remembered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A save the store refused (a full or failed disk) answers the push "failed": its
    id is not remembered, so the link's resend is taken (and saved) when it comes."""
    with LogStore(tmp_path) as log:
        store = DurableStore(log)
        engine = _engine(store)
        engine.connect(ConnectionInfo(client_id=FEDERATION_CLIENT), now=0.0, federation=True)
        with monkeypatch.context() as patch:

            def full(*_args: object) -> None:
                raise OSError(28, "No space left on device")

            patch.setattr(store, "append", full)
            refused = _push(engine, FEDERATION_CLIENT, "P/1", b"m1")
        assert refused and not _acked(refused, FEDERATION_CLIENT)
        assert "P/1" not in engine.federated.ids
        assert _acked(_push(engine, FEDERATION_CLIENT, "P/1", b"m1"), FEDERATION_CLIENT)
        assert "P/1" in engine.federated.ids
