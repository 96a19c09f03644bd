"""Federation ids this broker took, kept in its store with the messages (exactly once).

A message that crossed a federation link is pushed into a local queue by this broker's
federation client (client id :data:`FEDERATION_CLIENT`) with a ``Fed-Id`` header.  The
link's sender resends it when it got no confirm (the connection dropped, or this broker
was killed); a resend must not be delivered a second time.  The federation keeps its own
seen window (``broker.federation.seen``), but it learns that the push was taken only
after the push was answered: a crash between the two left the message delivered and its
id unknown.

So the engine remembers the ids itself, in the same step as the push: taking a federated
push writes the value ``fedseen/<slot>`` = ``"<number> <id>"`` to the store (slots are
reused round-robin, so the store keeps at most :data:`DEFAULT_WINDOW` of them, no
deletes), a write replies wait for, right AFTER the message's own saves.  The server
holds the engine's whole output -- the push's acknowledge and the message's deliveries
-- until that write is durable (``broker.server.gate``), and the log is written in
order: a message someone received has its id on disk, and an id on disk has its message
on disk.  A push whose id is remembered is answered as done and not queued again.  (The
id was written first once; with the server's drain holding the message's save back, a
kill -9 between the two left an id without its message and the resend was dropped: an
acknowledged message lost.  The other order's window -- the message written, its id not
yet, nothing answered -- can at worst deliver a resend twice; the two records usually
leave in one write.)  On start the store's values give the window back, oldest first.

Only the federation client's pushes count: another client's ``Fed-Id`` header means
nothing (an impostor cannot make the broker drop a real federated message).  And the
federation client's id is reserved (``Engine.connect(federation=...)``): a connection
gets it only when the front door checked its proof -- the secret ``broker serve`` made
for its own federation client (connection-info property ``Federation-Secret``, never
shown to the engine) and, on a CURVE broker, the federation's key too
(``ServerOptions.federation_secret``/``federation_key``).  A broker that does not
federate refuses the id to everyone (401), so nobody can take it while the link is down
and pre-mark guessable ids as seen.  Sans-IO: the window writes through the ``Store`` it
is given.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

from broker.engine.definitions import FEDSEEN_PREFIX as PREFIX
from broker.store import Store

log = logging.getLogger(__name__)

#: The client id of the local federation client (``broker.federation.wire`` uses it).
FEDERATION_CLIENT = "zerohub-federation"
#: The header carrying a federated message's id.
FED_ID_HEADER = "Fed-Id"
#: Federation ids remembered (the federation's own seen window has the same default).
DEFAULT_WINDOW = 10_000
#: Longest federation id (a link peer's longer one is refused; here: not remembered).
MAX_ID = 256


class FederatedIds:
    """The newest federation ids the engine took (see the module docstring)."""

    def __init__(self, store: Store, window: int = DEFAULT_WINDOW) -> None:
        self.store = store
        self.window = window
        self.ids: OrderedDict[str, int] = OrderedDict()  # id -> its number, oldest first
        self.next = 0  # the number of the next id taken
        self.duplicates = 0

    def load(self) -> int:
        """Read the window back from the store; returns how many ids it holds."""
        found: list[tuple[int, str]] = []
        for name, value in self.store.definitions().items():
            if not name.startswith(PREFIX):
                continue
            digits, _, fed_id = value.decode("utf-8", "replace").partition(" ")
            if digits.isdigit() and fed_id:
                found.append((int(digits), fed_id))
            else:
                log.warning("federation id value %r is damaged: ignored", name)
        found.sort()
        for number, fed_id in found[-self.window :]:
            self.ids[fed_id] = number
        self.next = found[-1][0] + 1 if found else 0
        return len(self.ids)

    @staticmethod
    def id_of(client_id: str, headers: tuple[tuple[str, str], ...] | None) -> str | None:
        """The federation id of a push (None: not a federated push)."""
        if client_id != FEDERATION_CLIENT or not headers:
            return None
        for name, value in headers:
            if name == FED_ID_HEADER:
                return value if 0 < len(value) <= MAX_ID else None
        return None

    def seen(self, fed_id: str) -> bool:
        """Was this id taken before?  (Counted as a duplicate when it was.)"""
        if fed_id in self.ids:
            self.duplicates += 1
            return True
        return False

    def add(self, fed_id: str) -> None:
        """Remember an id taken now (written to the store, a write replies wait for).

        The caller's rule of order: call it after the push's saves, never before.  The
        log is written in order, so an id on disk means its message (and its copies) are
        too; written first, a kill -9 between the two (the server's drain holds the
        message's save back until the drain ends) left the id without the message, and
        the link's resend was answered "taken before" and never queued: an acknowledged
        message lost.  In the same engine output as the push, so that its acknowledge
        and deliveries wait for the id's write as well.  Not after a save the store
        refused: the producer hears "failed" and sends it again."""
        number = self.next
        self.next += 1
        self.ids[fed_id] = number
        while len(self.ids) > self.window:
            self.ids.popitem(last=False)
        slot = number % self.window
        self.store.put_definition(f"{PREFIX}{slot}", f"{number} {fed_id}".encode())
