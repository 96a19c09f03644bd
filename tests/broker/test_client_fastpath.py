"""The client's hand-written QUEUE frame encoder matches the generated codec exactly."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker import tmqp
from broker.client import queue_frame_bytes
from broker.protocol import MessageType


@settings(max_examples=200, deadline=None)
@given(
    high=st.booleans(),
    ack=st.booleans(),
    queue_id=st.integers(0, 0xFFFF),
    message_id=st.text(max_size=30),
    source=st.text(max_size=30),
    target=st.text(min_size=1, max_size=30),
    payload=st.one_of(st.binary(max_size=300), st.sampled_from([b"x" * 65535, b"y" * 65536])),
)
def test_fast_queue_frame_equals_codec(
    high: bool,
    ack: bool,
    queue_id: int,
    message_id: str,
    source: str,
    target: str,
    payload: bytes,
) -> None:
    fast = queue_frame_bytes(
        high, ack, queue_id, message_id, target.encode(), payload, source.encode()
    )
    frame = tmqp.Frame(
        high_priority=high,
        message_type=MessageType.QUEUE,
        pending_ack=ack,
        content_type=queue_id,
        message_id=message_id,
        source=source,
        target=target,
        payload=payload,
    )
    if len(message_id.encode()) > 255 or len(source.encode()) > 255:
        assert fast is None
    else:
        assert fast == tmqp.encode(frame)[0]
        assert tmqp.decode([fast]) == frame


@pytest.mark.parametrize("queue_id", [-1, 65536])
def test_out_of_range_falls_back_to_the_codec(queue_id: int) -> None:
    assert queue_frame_bytes(False, False, queue_id, "m", b"ch", b"p") is None
