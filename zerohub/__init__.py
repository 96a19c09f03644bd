"""What the three zerohub packages (``zproto``, ``filemq``, ``broker``) share.

``zerohub.cli``: the conventions every command line follows (exit codes, one-line
errors, endpoint checks, ``-v``/``-q``).
"""
