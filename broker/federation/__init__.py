"""Broker federation: links between zerohub brokers (``broker serve --link``).

* :mod:`broker.federation.settings`: link specs, limits and their defaults;
* :mod:`broker.federation.wire`: the federation messages (interest, forwarded messages)
  carried as TMQP direct messages, with their validation;
* :mod:`broker.federation.core`: the sans-IO link core (interest table, hops/depth
  decisions, seen-window, in-flight window, acked forwarding);
* :mod:`broker.federation.runner`: the thread that drives the core with broker clients.
"""
