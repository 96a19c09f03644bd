"""Every message of every model round-trips through encode/decode."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.zproto.support import ALL_MODELS, CPU_BOUND, codec, message_strategy

pytestmark = CPU_BOUND

CASES = []
for _model, _module in ALL_MODELS:
    _proto, _codec = codec(_model, _module)
    for _msg in _proto.messages:
        CASES.append(pytest.param(_msg, _codec, id=f"{_proto.name}.{_msg.class_name}"))


@pytest.mark.parametrize(("msg", "module"), CASES)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_message_round_trips(msg, module, data) -> None:  # type: ignore[no-untyped-def]
    cls = getattr(module, msg.class_name)
    original = data.draw(message_strategy(msg, cls))
    frames = module.encode(original)
    # bytes, or the one growing buffer of a message with a hash field (not copied)
    assert all(isinstance(f, (bytes, bytearray)) for f in frames)
    again = module.decode(frames)
    assert type(again) is cls
    assert again == original
    # decoding accepts any bytes-like frame, as zmq gives memoryviews/Frames
    assert module.decode([memoryview(f) for f in frames]) == original
    assert module.encode(again) == frames


@pytest.mark.parametrize(("msg", "module"), CASES)
def test_defaults_round_trip(msg, module) -> None:  # type: ignore[no-untyped-def]
    """A message built with no arguments is valid (constants default to their value)."""
    cls = getattr(module, msg.class_name)
    assert module.decode(module.encode(cls())) == cls()
