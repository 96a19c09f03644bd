"""``python -m broker.stomp``: see :mod:`broker.stomp.cli`."""

from __future__ import annotations

import sys

from broker.stomp.cli import main

sys.exit(main())
