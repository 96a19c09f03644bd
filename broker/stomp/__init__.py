"""STOMP 1.0/1.1/1.2 front door (Apollo dialect).

Modules, imported one way (each depends only on those listed below it):

* ``cli``          -- ``python -m broker.stomp``: a standalone listener (memory backend);
* ``server``       -- the asyncio listener, TCP/TLS and WebSocket (the only socket code);
* ``websocket``    -- STOMP over WebSocket as a sans-IO wire (``stomp-ws`` extra);
* ``wire``         -- what carries a session's bytes (plain TCP here);
* ``memory``       -- an in-memory reference :class:`~broker.stomp.backend.Backend`;
* ``session``      -- sans-IO connection state machine (bytes + ``now`` in, bytes out);
* ``backend``      -- the typed protocol a session talks to (to be implemented on the engine);
* ``subscription`` -- SUBSCRIBE / SEND header options parsed into typed values;
* ``selector``     -- SQL-92 message selectors over headers;
* ``destinations`` -- ``/queue/``, ``/topic/``, ``/dsub/``, temporary, composite, wildcards;
* ``frames``       -- sans-IO frame codec (incremental parser, serializer, limits);
* ``errors``       -- the package's one error hierarchy.
"""
