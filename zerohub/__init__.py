"""What the three zerohub packages (``zproto``, ``filemq``, ``broker``) share, and what
composes them.

``zerohub.cli``: the conventions every command line follows (exit codes, one-line
errors, endpoint checks, ``-v``/``-q``).
``zerohub.zmqkit``: the ZeroMQ plumbing ``filemq`` and ``broker`` share (CURVE keys, the
ZAP authenticator, the bind policy, socket helpers, the handshake-failure monitor).
``zerohub.hub`` and ``zerohub.main``: a FILEMQ server and the broker in one process, the
``zerohub serve`` command; ``zerohub.config`` its one TOML schema, ``zerohub.status``
the figures read live from both services, served as Prometheus metrics
(``zerohub.metrics``) and a web console (``zerohub.console``) by ``zerohub.httpd``, and
``zerohub.logs`` the logging both share; ``zerohub.mallopt`` the C heap's one setter their
``serve`` commands use.  ``filemq`` and ``broker`` never import each other (nor anything
here but ``zerohub.cli``, ``zerohub.zmqkit`` and ``zerohub.mallopt``).
"""
