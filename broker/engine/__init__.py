"""The sans-IO broker engine: channels, queues, routers, delivery decisions, clients.

Nothing here imports zmq; front doors feed it messages (typed operations) or TMQP frames
(``Engine.receive``, the TMQP door ``broker.server``) and a clock.
"""

from broker.engine.engine import Engine
from broker.message import Message

__all__ = ["Engine", "Message"]
