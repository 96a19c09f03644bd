"""The sans-IO broker engine: channels, queues, routers, delivery decisions, clients.

Nothing here imports zmq; front doors (``broker.server``) feed it frames and a clock.
"""

from broker.engine.engine import Engine

__all__ = ["Engine"]
