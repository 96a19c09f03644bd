"""Generated message classes: frozen dataclasses with fresh defaults and replace()."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import weakref

import pytest

import zproto.runtime
from broker import tmqp
from filemq import fmq_msg, fmq_msg_czmq
from tests.zproto.support import MODELS_DIR, codec


def test_messages_are_frozen_dataclasses() -> None:
    msg = tmqp.Frame(message_type=5, ttl=3)
    assert dataclasses.is_dataclass(msg)
    names = [f.name for f in dataclasses.fields(msg)]
    assert names[:3] == ["first_acquirer", "high_priority", "message_type"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        msg.ttl = 6  # type: ignore[misc]
    assert msg == tmqp.Frame(message_type=5, ttl=3) and msg != tmqp.Frame(message_type=5)
    assert hash(msg) == hash(tmqp.Frame(message_type=5, ttl=3))
    assert repr(msg).startswith("Frame(first_acquirer=False, ")


def test_plain_classes_are_frozen_typed_and_compared_like_dataclasses() -> None:
    """A model with ``classes = "plain"`` (FILEMQ's) makes no dataclass at import: the
    methods ``@dataclass(frozen=True)`` would compile are ``zproto.runtime.FrozenMessage``'s.
    Equality, hash, repr, frozenness, pattern matching and the annotations are the ones
    a dataclass of the same fields has."""
    msg = fmq_msg.Nom(credit=5, sequence=1)
    assert not dataclasses.is_dataclass(msg) and isinstance(msg, zproto.runtime.FrozenMessage)
    assert msg.__match_args__ == ("credit", "sequence")
    assert fmq_msg.Nom.__annotations__ == {
        "ID": "ClassVar[MessageId]",
        "credit": "int",
        "sequence": "int",
    }
    with pytest.raises(dataclasses.FrozenInstanceError, match="credit"):
        msg.credit = 6
    with pytest.raises(dataclasses.FrozenInstanceError):
        del msg.credit
    assert msg == fmq_msg.Nom(5, 1) and msg != fmq_msg.Nom(5, 2) and msg != (5, 1)
    assert fmq_msg.Nom(5, 1) != fmq_msg_czmq.Nom(5, 1)  # (same fields, another class)
    assert hash(msg) == hash(fmq_msg.Nom(5, 1)) == hash((5, 1))
    assert repr(msg) == "Nom(credit=5, sequence=1)" and repr(fmq_msg.Hugz()) == "Hugz()"
    assert fmq_msg.Hugz() == fmq_msg.Hugz() and fmq_msg.Hugz() != fmq_msg.HugzOk()
    with pytest.raises(TypeError, match="unhashable"):
        hash(fmq_msg.Icanhaz("/p"))  # (a dict field: as a dataclass's hash of it)
    match msg:
        case fmq_msg.Nom(credit, sequence):
            assert (credit, sequence) == (5, 1)
        case _:
            pytest.fail("a plain class matches by its fields")


def test_mutable_defaults_are_fresh_per_instance() -> None:
    a, b = fmq_msg.Icanhaz(), fmq_msg.Icanhaz()
    assert a.options == {} and a.options is not b.options
    assert fmq_msg.Ohai().protocol == "FILEMQ" and fmq_msg.Ohai().version == 2


def test_replace_changes_only_what_is_named() -> None:
    frame = tmqp.Frame(message_type=0x11, target="orders", payload=b"x")
    moved = frame.replace(target="audit", ttl=3)
    assert (moved.target, moved.ttl, moved.payload) == ("audit", 3, b"x")
    assert (frame.target, frame.ttl) == ("orders", 16)
    assert type(moved) is tmqp.Frame and moved == dataclasses.replace(frame, target="audit", ttl=3)
    with pytest.raises(TypeError, match="nope"):
        frame.replace(nope=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        moved.ttl = 4  # type: ignore[misc]


def test_messages_copy_pickle_and_take_weak_references() -> None:
    """The fields live in the slots of a twin class (no instance dict): the messages still
    copy, pickle and take weak references like plain dataclasses."""
    frame = tmqp.Frame(message_type=17, headers=(("k", "v"),), payload=b"x")
    icanhaz = fmq_msg.Icanhaz(path="/p", options={"RESYNC": "1"})
    for msg in (frame, icanhaz):
        assert copy.copy(msg) == msg and copy.deepcopy(msg) == msg
        assert pickle.loads(pickle.dumps(msg)) == msg
        assert weakref.ref(msg)() is msg
        assert msg.replace() == msg
        assert not hasattr(msg, "__dict__")


def test_a_decoded_message_is_its_class_and_stays_frozen() -> None:
    """Decoders fill a twin and give it the message class: the result is an ordinary,
    frozen, hashable instance of that class, equal to one built by keywords."""
    frame = tmqp.Frame(message_type=0x11, pending_ack=True, target="orders", payload=b"x")
    cases = [(tmqp, frame), (fmq_msg, fmq_msg.Nom(7, 3)), (fmq_msg, fmq_msg.Icanhaz("/p"))]
    for module, msg in cases:
        decoded = module.decode(msg.encode())
        assert type(decoded) is type(msg) and decoded == msg
        assert repr(decoded) == repr(msg)
        with pytest.raises(dataclasses.FrozenInstanceError):
            decoded.__setattr__(msg.__match_args__[0], 1)
    assert hash(tmqp.decode(frame.encode())) == hash(frame)
    assert tmqp.Frame(target="orders") != fmq_msg.Srsly()


def test_replace_takes_fields_named_like_its_parameters() -> None:
    """replace(self, /, **changes) and __new__(_cls, ...): a field may be called ``self``,
    ``cls`` or ``changes``."""
    _, module = codec(MODELS_DIR / "name_clash.xml", None)
    msg = module.Parameters(self=1, cls="c", changes=2, name="n", value=3)
    assert (msg.self, msg.cls, msg.changes, msg.name, msg.value) == (1, "c", 2, "n", 3)
    moved = msg.replace(self=5, changes=6)
    assert moved == module.Parameters(5, "c", 6, "n", 3) and msg.self == 1
    assert module.decode(module.encode(moved)) == moved
    assert dataclasses.replace(msg, cls="d").cls == "d"
    nom = fmq_msg.Nom(credit=1, sequence=2)
    assert nom.replace(credit=5) == fmq_msg.Nom(5, 2)
    assert nom.replace() == nom and nom.replace() is not nom
    with pytest.raises(TypeError, match="self"):
        nom.replace(self=1)
