"""``python -m filemq``: the same as the ``filemq`` console script."""

from __future__ import annotations

import sys

from filemq.cli import main

if __name__ == "__main__":
    sys.exit(main())
