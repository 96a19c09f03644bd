"""``python -m zerohub``: the same as the ``zerohub`` console script."""

from __future__ import annotations

import sys

from zerohub.main import main

if __name__ == "__main__":
    sys.exit(main())
