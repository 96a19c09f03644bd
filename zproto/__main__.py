"""``python -m zproto``."""

from __future__ import annotations

import sys

from zproto.cli import main

sys.exit(main())
