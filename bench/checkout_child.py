"""One home for the measuring step a side-by-side bench runs in another checkout.

A bench that compares this tree with ``--baseline CHECKOUT`` runs itself again as
``--child ARGS`` in a fresh interpreter whose ``PYTHONPATH`` is that checkout (the
measured code is the checkout's, the bench is this one), and reads back the one JSON
object the child prints.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys


def child_result(script: str, checkout: str, *args: str) -> dict[str, float]:
    """Run ``script --child ARGS`` against ``checkout``'s code; its printed JSON object.
    A failed child ends the bench with the last line it wrote on stderr."""
    env = dict(os.environ, PYTHONPATH=checkout)
    done = subprocess.run(
        [sys.executable, script, "--child", *args],
        env=env,
        cwd=checkout,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{checkout}: {done.stderr.strip().splitlines()[-1:]}")
    result: dict[str, float] = json.loads(done.stdout)
    return result
