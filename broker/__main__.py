"""``python -m broker``: the broker command line (see ``broker.cli``)."""

from __future__ import annotations

import sys

from broker.cli import main

sys.exit(main())
