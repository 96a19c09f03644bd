"""Test kit for the sans-IO STOMP session: a fake clock, a peer that speaks raw frames,
and the in-memory backend behind every session."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from broker.stomp.frames import (
    SERVER_COMMANDS,
    Command,
    Frame,
    FrameParser,
    Version,
    make_frame,
    serialize,
)
from broker.stomp.memory import MemoryBackend
from broker.stomp.session import Authenticator, Session, SessionConfig, allow_anyone

WALL_MS = 1_700_000_000_000


@dataclass
class Clock:
    now: float = 100.0
    wall_ms: int = WALL_MS

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.wall_ms += int(seconds * 1000)


@dataclass
class Peer:
    """One client connection: frames in, parsed server frames out."""

    session: Session
    clock: Clock
    version: Version = Version.V1_2
    parser: FrameParser = field(
        default_factory=lambda: FrameParser(commands=SERVER_COMMANDS, version=None)
    )
    received: list[Frame] = field(default_factory=list)
    heartbeats: int = 0

    def send(
        self, command: Command, headers: dict[str, str] | None = None, body: bytes = b""
    ) -> None:
        frame = make_frame(command, list((headers or {}).items()), body)
        self.send_bytes(serialize(frame, self.version))

    def send_bytes(self, data: bytes) -> None:
        self.session.receive(data, self.clock.now)

    def read(self) -> list[Frame]:
        """Frames the session wrote since the last read."""
        frames = self.parser.feed(self.session.take_output(self.clock.now))
        self.heartbeats = self.parser.heartbeats
        self.received.extend(frames)
        return frames

    def read_one(self, command: Command) -> Frame:
        frames = self.read()
        assert [f.command for f in frames] == [command], frames
        return frames[0]

    def connect(self, **headers: str) -> Frame:
        defaults = {"accept-version": self.version.value, "host": "localhost"}
        if self.version is Version.V1_0:
            defaults = {}
        defaults.update({k.replace("_", "-"): v for k, v in headers.items()})
        self.send(Command.CONNECT, defaults)
        frame = self.read_one(Command.CONNECTED)
        self.parser.version = self.version
        return frame

    def tick(self) -> None:
        self.session.tick(self.clock.now)


@dataclass
class World:
    clock: Clock = field(default_factory=Clock)
    backend: MemoryBackend = field(init=False)
    config: SessionConfig = field(default_factory=SessionConfig)
    authenticator: Authenticator = allow_anyone
    next_id: int = 1

    def __post_init__(self) -> None:
        self.backend = MemoryBackend(wall_clock_ms=lambda: self.clock.wall_ms)

    def peer(
        self, version: Version = Version.V1_2, writable: Callable[[], bool] = lambda: True
    ) -> Peer:
        session = Session(
            self.backend,
            self.next_id,
            self.clock.now,
            config=self.config,
            authenticator=self.authenticator,
            wall_clock_ms=lambda: self.clock.wall_ms,
            writable=writable,
        )
        self.next_id += 1
        return Peer(session, self.clock, version)

    def connected(self, version: Version = Version.V1_2, **headers: str) -> Peer:
        peer = self.peer(version)
        peer.connect(**headers)
        return peer
