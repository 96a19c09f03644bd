"""Bridges from the zerohub broker to other brokers (MQTT, AMQP 0-9-1).

One core (:mod:`broker.bridge.core`: sans-IO, the in-flight window, what to acknowledge
when, the reconnect schedule, counters), one driver (:mod:`broker.bridge.runner`: the
thread that feeds the core and carries out its actions), the local side
(:mod:`broker.bridge.local`: the public ``broker.Client``) and one small connector per
remote protocol (:mod:`broker.bridge.connectors`).  Guarantees: at-least-once both ways;
a message is acknowledged to the side it came from only after the other side accepted it.
"""
