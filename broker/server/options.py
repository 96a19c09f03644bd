"""Settings of the broker's ZeroMQ front end (``broker.server``) and its error."""

from __future__ import annotations

from dataclasses import dataclass

from broker import batch
from broker.protocol import DEFAULT_ENDPOINT

#: One more octet than half the delivery batch bound ``hwm`` was sized for (2 KiB): a
#: batch of N octets holds at most N // 1025 times the deliveries (of any one size) a
#: 2 KiB batch holds, the worst case being deliveries of 1,025 octets (one per 2 KiB
#: batch, seven per 8 KiB one).  ``tests/broker/test_unacked_batch.py`` checks it for
#: every size.
_HALF_BATCH = 1025


class ServerError(Exception):
    """The server cannot start (bad endpoint, key files, insecure bind) or stop."""


@dataclass(frozen=True)
class ServerOptions:
    """Transport settings (the engine has its own ``BrokerConfig``)."""

    endpoint: str = DEFAULT_ENDPOINT
    #: CURVE: the server's ``.key_secret`` file and the folder of allowed client ``.key`` files.
    curve_secret: str | None = None
    allow_dir: str | None = None
    #: Allow a non-loopback bind without CURVE.
    insecure: bool = False
    #: The proof of this broker's own federation client: the client id
    #: ``zerohub-federation`` is given only to a connection whose connection info has the
    #: property ``Federation-Secret`` equal to ``federation_secret`` and, when
    #: ``federation_key`` is set (a CURVE broker), that authenticated with that public key
    #: (Z85).  None (a broker that does not federate): the id is refused to everyone.
    federation_secret: str | None = None
    federation_key: str | None = None
    #: Largest frame accepted.  It is the ROUTER's ZMQ_MAXMSGSIZE: libzmq drops the
    #: connection of a peer announcing a larger message before buffering any of it.
    max_frame_size: int = 16 * 1024 * 1024
    #: A peer silent this long gets a PING; silent for ``peer_timeout`` it is disconnected.
    ping_interval: float = 5.0
    peer_timeout: float = 15.0
    #: A connection that has not finished the handshake (from the TCP accept to the
    #: connection info) within this time is shut down.
    handshake_timeout: float = 10.0
    #: Peers between the greeting and the connection info at once; more are refused (503).
    max_handshakes: int = 1_000
    #: Connections at once (sessions, handshakes, and connections yet to say anything);
    #: more are shut down as soon as they are accepted.  Each costs a file descriptor.
    max_connections: int = 11_000
    #: ZeroMQ high-water marks (messages per peer pipe): the receive side's, and the
    #: send side's unless ``send_hwm`` says otherwise.
    hwm: int = 10_000
    #: The send high-water mark (messages per peer pipe toward a peer); None: ``hwm``
    #: scaled so that a stopped consumer's pipe holds no more deliveries of any size
    #: than ``hwm`` batches of at most 2 KiB would (``pipe_hwm``).  0, as for ZeroMQ:
    #: no limit.
    send_hwm: int | None = None
    #: Frames other than queue deliveries held for a peer whose pipe is full; beyond
    #: this they are discarded and counted (``overflowed``), the peer stays connected.
    #: Queue deliveries wait in the engine's queues instead (per-consumer windows).
    max_backlog: int = 100_000
    #: Messages handled per socket drain before timers are looked at again.
    batch: int = 1024
    #: Engine output handed to libzmq together: at the end of each drain, or once this
    #: many frames wait.  Batches let libzmq's I/O thread take many frames per wake-up
    #: (on 2 cores: 1.6x the throughput of sending each frame at once); a lone message
    #: goes out at once, so latency grows only under load (at most one batch's work).
    send_batch: int = 256
    #: Entries one TMQP batch may hold (``broker.batch``; announced to clients as the
    #: connect response's ``Batch-Max``); a batch with more is refused whole (482).
    max_batch_frames: int = 1024
    #: Deliveries that need no acknowledge carried in one delivery batch at most, to a
    #: client that reads batches (``broker.batch``; its ``Batch-Deliveries`` bounds it too);
    #: 0: one per message.  Such a delivery is done once libzmq took it, and the pipe's
    #: send high-water mark (``pipe_hwm``) counts messages, so a batch of them is also
    #: bounded in octets (``unacked_batch_octets``): a consumer that stops reading holds
    #: at most ``pipe_hwm`` messages of at most max(one delivery, ``unacked_batch_octets``)
    #: octets in its pipe, as if its messages were that big (docs/broker.md, "Flow control").
    unacked_batch: int = 64
    #: Octets of deliveries without acknowledge one delivery batch carries at most (a
    #: bigger delivery travels alone); the send high-water mark falls with it
    #: (``pipe_hwm``).  8 KiB since session 18 (2 KiB before: the consumer's CPU per
    #: delivery is mostly per batch).
    unacked_batch_octets: int = 8192
    linger: float = 0.5
    #: Pushes without headers that wait for no response (for an acknowledge, or for
    #: nothing) read in one socket drain are handed to the engine as one run per
    #: producer (``Engine.receive_pushes``: a run's checks once, not per push; each push
    #: still answered alone); False: one by one (the reference the runs are tested
    #: against).  Other frames are never gathered and never overtake a push.
    push_runs: bool = True
    #: A run's plain pushes into a queue with one consumer (a peer of this server) that
    #: has room and nothing waiting are delivered as the octets they came in, no message
    #: made (``Engine.receive_push_octets``, ``broker.engine.octets_run``); False: every
    #: run takes the record path (the reference the octets path is tested against).
    push_octets: bool = True
    #: Where to bind the broadcast fan-out XPUB (``broker.engine.fanout``); None: none.
    fanout: str | None = None
    #: Published messages (runs of deliveries, ``broker.fanout``: at most ``RUN_MAX``
    #: deliveries and ``RUN_OCTETS`` octets plus one delivery each) one fan-out subscriber
    #: may have queued at the broker before it misses some (a reported gap).
    fanout_hwm: int = 1_000

    def __post_init__(self) -> None:
        if self.max_frame_size < 64:
            raise ValueError("max_frame_size must be at least 64 octets")
        if not 0 < self.ping_interval < self.peer_timeout:
            raise ValueError("need 0 < ping_interval < peer_timeout")
        if self.batch < 1 or self.send_batch < 1 or self.max_batch_frames < 1:
            raise ValueError("batch, send_batch and max_batch_frames must be at least 1")
        if not 0 <= self.unacked_batch <= 1024:
            raise ValueError("unacked_batch must be from 0 to 1024")
        if not 256 <= self.unacked_batch_octets <= batch.DELIVERY_OCTETS:
            raise ValueError(f"unacked_batch_octets must be from 256 to {batch.DELIVERY_OCTETS}")
        if self.fanout_hwm < 1:
            raise ValueError("fanout_hwm must be at least 1")
        if self.send_hwm is not None and self.send_hwm < 0:
            raise ValueError("send_hwm must be at least 0 (0: no limit)")
        if self.max_handshakes < 1 or self.max_connections < 1:
            raise ValueError("max_handshakes and max_connections must be at least 1")

    @property
    def pipe_hwm(self) -> int:
        """The send high-water mark the server sets: ``send_hwm``, or ``hwm`` divided
        by ``unacked_batch_octets`` // 1025 (the default: 10,000 // 7 = 1,428), so that
        a consumer that stops reading holds no more deliveries of any size in the
        broker's pipe than ``hwm`` messages of batches of at most 2 KiB did (session 9's
        bound, ``hwm`` x 2 KiB octets), however big the batches are (docs/broker.md, "Flow
        control")."""
        if self.send_hwm is not None:
            return self.send_hwm
        if self.hwm <= 0:  # (no limit)
            return self.hwm
        return max(1, self.hwm // max(1, self.unacked_batch_octets // _HALF_BATCH))
