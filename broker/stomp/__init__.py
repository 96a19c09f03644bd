"""STOMP 1.0/1.1/1.2 front door (Apollo dialect).

Modules, imported one way (top depends on those below it):

* ``server``       -- the asyncio TCP listener (the only module that touches sockets);
* ``memory``       -- an in-memory reference :class:`~broker.stomp.backend.Backend`;
* ``session``      -- sans-IO connection state machine (bytes + ``now`` in, bytes out);
* ``backend``      -- the typed protocol a session talks to (implemented on the engine later);
* ``subscription`` -- SUBSCRIBE / SEND header options parsed into typed values;
* ``destinations`` -- ``/queue/``, ``/topic/``, ``/dsub/``, temporary, composite, wildcards;
* ``frames``       -- sans-IO frame codec (incremental parser, serializer, limits);
* ``errors``       -- the package's one error hierarchy.
"""
