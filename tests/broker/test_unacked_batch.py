"""``ServerOptions.unacked_batch``: deliveries that need no acknowledge share delivery
batches (``broker.batch``) with a client that reads them, at most that many per message
(default 64) and ``unacked_batch_octets`` octets (default 8192, with the send pipe's
high-water mark ``pipe_hwm`` scaled to them); 0: one per message."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq

from broker import batch, tmqp
from broker.client.blocking import Client
from broker.client.sockets import open_dealer
from broker.engine.engine import Engine
from broker.protocol import GREETING, ConnectionInfo, Header, MessageType
from broker.server.server import Server, ServerOptions
from tests.polling import wait_until

from .conftest import MakeClient
from .test_batch import Raw

Ctx = zmq.Context[zmq.Socket[bytes]]


@pytest.fixture
def server(zctx: Ctx) -> Iterator[Server]:
    options = ServerOptions(endpoint="tcp://127.0.0.1:*", unacked_batch=8)
    with Server(Engine(), options, context=zctx) as srv:
        yield srv


@pytest.fixture
def raw(zctx: Ctx, server: Server) -> Iterator[Callable[..., Raw]]:
    made: list[Raw] = []

    def make(properties: dict[str, str] | None = None) -> Raw:
        assert server.endpoint is not None
        made.append(Raw(zctx, server.endpoint, properties))
        return made[-1]

    yield make
    for peer in made:
        peer.close()


def _join(peer: Raw, channel: str) -> None:
    join = tmqp.Frame(message_type=MessageType.SERVER, pending_response=True, content_type=110,
                      message_id=f"j-{channel}", target=channel,
                      headers=((Header.PREFETCH, "100"),))  # fmt: skip
    peer.send(tmqp.encode(join)[0])
    assert peer.frame().message_id == f"j-{channel}"


def _read(peer: Raw, count: int) -> tuple[list[bytes], list[int]]:
    """``count`` deliveries' payloads, and the entries of each message they came in."""
    payloads: list[bytes] = []
    sizes: list[int] = []
    while len(payloads) < count:
        f = peer.frame()
        if f.message_type == MessageType.SERVER:
            assert f.content_type == batch.DELIVERIES
            inner = [tmqp.decode((d,)) for d in batch.unpack(f.payload, 1024)]
            assert all(isinstance(i, tmqp.Frame) and not i.pending_ack for i in inner)
            payloads += [i.payload for i in inner]  # type: ignore[union-attr]
            sizes.append(len(inner))
        else:
            assert f.message_type == MessageType.QUEUE and not f.pending_ack
            payloads.append(f.payload)
            sizes.append(1)
    return payloads, sizes


def test_deliveries_without_acknowledge_share_batches_of_at_most_the_option(
    raw: Callable[..., Raw], make_client: MakeClient
) -> None:
    reader = raw({"Batch-Deliveries": "64"})  # asks more than the server gives
    small = raw({"Batch-Deliveries": "3"})  # asks fewer
    old = raw()  # reads no batches
    producer = make_client()
    for peer, name in ((reader, "r"), (small, "s"), (old, "o")):
        producer.create_queue(name, 1, {"Status": 1})
        _join(peer, name)
    sent = {name: [f"{name}-{i}".encode() for i in range(200)] for name in ("r", "s", "o")}
    for name, payloads in sent.items():
        assert producer.push_many(name, 1, payloads, ack=False) == []
    payloads, sizes = _read(reader, 200)
    assert payloads == sent["r"]  # nothing lost or reordered
    assert max(sizes) == 8 and len(sizes) < 200  # batched, never more than the option
    payloads, sizes = _read(small, 200)
    assert payloads == sent["s"] and max(sizes) == 3
    payloads, sizes = _read(old, 200)
    assert payloads == sent["o"] and set(sizes) == {1}


@pytest.mark.parametrize("bad", [-1, 1025])
def test_the_option_is_bounded(bad: int) -> None:
    with pytest.raises(ValueError, match="unacked_batch"):
        ServerOptions(unacked_batch=bad)


@pytest.mark.parametrize("bad", [255, batch.DELIVERY_OCTETS + 1])
def test_the_octet_bound_is_bounded(bad: int) -> None:
    with pytest.raises(ValueError, match="unacked_batch_octets"):
        ServerOptions(unacked_batch_octets=bad)


def test_the_defaults_batch_deliveries_without_acknowledge_within_8_kib() -> None:
    options = ServerOptions()
    assert (options.unacked_batch, options.unacked_batch_octets) == (64, 8192)
    # the send pipe holds 7x fewer messages: no more deliveries of any size than before
    assert (options.hwm, options.pipe_hwm) == (10_000, 1_428)


@pytest.mark.parametrize(
    ("hwm", "octets", "send_hwm", "pipe_hwm"),
    [
        (10_000, 2048, None, 10_000),  # session 9's bound: the hwm as it was
        (10_000, 4096, None, 3_333),
        (10_000, 256 * 1024, None, 39),
        (10_000, 256, None, 10_000),  # never more messages than hwm
        (3, 8192, None, 1),  # never 0 (that is ZeroMQ's "no limit")
        (0, 8192, None, 0),  # no limit stays no limit
        (10_000, 8192, 7, 7),  # said outright
    ],
)
def test_the_send_hwm_keeps_the_octets_a_stopped_consumer_holds(
    hwm: int, octets: int, send_hwm: int | None, pipe_hwm: int
) -> None:
    options = ServerOptions(hwm=hwm, unacked_batch_octets=octets, send_hwm=send_hwm)
    assert options.pipe_hwm == pipe_hwm


def _held(octets: int, entries: int, size: int) -> int:
    """Octets of deliveries of ``size`` octets (with their length) one message holds
    when batches hold at most ``entries`` and ``octets`` (a bigger one travels alone)."""
    return size if size > octets else min(entries, octets // size) * size


@pytest.mark.parametrize("octets", [256, 2048, 3000, 4096, 8192, 10_000, 65_536, 256 * 1024])
@pytest.mark.parametrize("entries", [64, 1024])
def test_a_stopped_consumers_pipe_holds_no_more_of_any_size_than_with_2_kib_batches(
    octets: int, entries: int
) -> None:
    """The scaled send hwm's claim, for every delivery size up to a batch and beyond:
    ``pipe_hwm`` messages of ``octets`` batches hold no more than ``hwm`` messages of
    2 KiB batches did (the worst size is 1,025 octets: one per 2 KiB, seven per 8 KiB)."""
    hwm = 10_000
    pipe = ServerOptions(hwm=hwm, unacked_batch_octets=octets).pipe_hwm
    for size in range(6, octets + 2):
        assert pipe * _held(octets, entries, size) <= hwm * _held(2048, entries, size), size


def test_a_negative_send_hwm_is_refused() -> None:
    with pytest.raises(ValueError, match="send_hwm"):
        ServerOptions(send_hwm=-1)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A folder whose path fits an ipc:// endpoint (at most 107 octets)."""
    path = Path(tempfile.mkdtemp(prefix="zh-ipc-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _stopped_reader(zctx: Ctx, endpoint: str) -> zmq.Socket[bytes]:
    """A raw consumer that reads batches and will stop reading: its own pipe holds one
    message and its kernel buffer little, so what the broker handed to libzmq for it sits
    in the broker's pipe (and the ipc socket's buffer)."""
    sock = zctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.rcvhwm = 1
    sock.rcvbuf = 4096
    sock.rcvtimeo = 10_000
    sock.connect(endpoint)
    sock.send(GREETING)
    assert sock.recv() == GREETING
    info = ConnectionInfo(client_id="", name="stopped", properties={"Batch-Deliveries": "64"})
    sock.send(tmqp.encode(info.to_frame("hs").replace(pending_response=True))[0])
    sock.recv()
    join = tmqp.Frame(
        message_type=MessageType.SERVER,
        pending_response=True,
        content_type=110,
        message_id="j",
        target="stop",
        headers=((Header.PREFETCH, "100"),),
    )
    sock.send(tmqp.encode(join)[0])
    answer = tmqp.decode((sock.recv(),))
    while not isinstance(answer, tmqp.Frame):  # (a PING of a loaded machine first)
        answer = tmqp.decode((sock.recv(),))
    assert answer.message_id == "j"
    return sock


def _settled(client: Client) -> int:
    """The queue's sent count once it stops moving (the pipe is full): read every 0.1 s
    until 5 reads agree."""
    reads: list[int] = []

    def still() -> bool:
        reads.append(int(client.queue_info("stop", 1)["SentMessages"]))
        return len(reads) >= 5 and len(set(reads[-5:])) == 1

    assert wait_until(still, timeout=60, step=0.1)
    return reads[-1]


def _unpacked(data: bytes) -> list[bytes]:
    """The deliveries (whole frames) one message carries (none: a PING)."""
    f = tmqp.decode((data,))
    if isinstance(f, tmqp.Ping):
        return []
    assert isinstance(f, tmqp.Frame)
    if f.message_type == MessageType.SERVER:
        assert f.content_type == batch.DELIVERIES
        return batch.unpack(f.payload, 1024)
    assert f.message_type == MessageType.QUEUE
    return [data]


def test_a_consumer_that_stops_reading_holds_hwm_messages_of_at_most_the_octet_bound(
    zctx: Ctx, short_dir: Path
) -> None:
    """The adversary of default no-ack batches: a consumer stops reading while 30,000
    deliveries of 100 octets need no acknowledge.  What the broker handed libzmq for it
    (its pipe of ``hwm`` messages, the socket buffer) is at most ``hwm`` x the octet bound
    plus the socket buffer, not ``hwm`` x 64 deliveries (with 256 KiB batches it held
    ~3.5x more); when it reads again every delivery comes, in order.  ipc://: loopback
    TCP's buffers grow to megaoctets and would hide the pipe."""
    hwm, count = 200, 30_000
    # (no PINGs while it does not read: it could not answer them in time on a loaded
    # machine, and a silent peer is ended)
    options = ServerOptions(
        endpoint=f"ipc://{short_dir}/b", hwm=hwm, ping_interval=60, peer_timeout=120
    )
    with Server(Engine(), options, context=zctx) as server:
        assert server.endpoint is not None
        reader = _stopped_reader(zctx, server.endpoint)
        producer = Client(server.endpoint, context=zctx, timeout=30).connect()
        try:
            producer.create_queue("stop", 1, {"Status": 1})
            payloads = [b"%099d" % i for i in range(count)]
            for i in range(0, count, 256):
                assert producer.push_many("stop", 1, payloads[i : i + 256], ack=False) == []
            producer.push("stop", 1, b"last", ack=True)
            taken = _settled(producer)
            assert taken < count  # it did stop: the rest waits in the queue
            got: list[bytes] = []
            while len(got) < count + 1:
                got += _unpacked(reader.recv())
            frames = [tmqp.decode((d,)) for d in got]
            assert [f.payload for f in frames] == [*payloads, b"last"]  # type: ignore[union-attr]
            # octets libzmq took (the window's 100 waited in the broker's backlog)
            held = sum(len(d) + 4 for d in got[: taken - 100])
            socket_buffer = 2 * int(Path("/proc/sys/net/core/wmem_default").read_text())
            # hwm x 2 KiB: session 9's bound, kept with 8 KiB batches by the send hwm
            assert held <= hwm * 2048 + socket_buffer
        finally:
            producer.close()
            reader.close(linger=0)


@pytest.mark.parametrize(("hwm", "receive"), [(10_000, 1_428), (3, 1), (0, 0)])
def test_the_clients_receive_pipe_holds_a_seventh_of_its_hwm(
    zctx: Ctx, hwm: int, receive: int
) -> None:
    """The client's side of the same bound: its DEALER's receive pipe counts the broker's
    8 KiB batches, so it holds ``hwm`` // 7 of them (no more deliveries of any size than
    ``hwm`` batches of 2 KiB); its send pipe keeps ``hwm``."""
    sock, watch = open_dealer(zctx, "tcp://127.0.0.1:1", hwm=hwm, curve=None, watch=False)
    try:
        assert watch is None
        assert (sock.sndhwm, sock.rcvhwm) == (hwm, receive)
    finally:
        sock.close(linger=0)
