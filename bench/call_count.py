"""Counting the calls a ``cProfile.Profile`` saw: one home for every bench's call count.

Not ``pstats.Stats(prof).total_calls``: pstats keys its table by (file, line, name), and
every named tuple's ``__new__`` is a ``<string>:1:<lambda>``, so all of them but one fold
into one row and vanish from its total (persist15: one call per ``StoredMessage`` made;
the rows moved by 1.0 call per message with the order tuple classes were first made in).
``Profile.getstats()`` gives one entry per code object (and per built-in), each with its
own count.  A bench measuring another checkout through ``PYTHONPATH`` imports this from
its own ``bench/`` (the measured tree may not have it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def where(entry: Any) -> tuple[str, str]:
    """(file, name) of one ``Profile.getstats()`` entry: a built-in's entry has its
    description in place of a code object (file ``~``, as pstats names it)."""
    code = entry.code
    if isinstance(code, str):
        return "~", code
    return code.co_filename, code.co_name


def python_calls(prof: Any, skip: Callable[[str, str], bool] | None = None) -> int:
    """Function calls (Python and built-in) a ``cProfile.Profile`` counted, summed per
    code object; ``skip(file, name)`` true leaves an entry out (a bench's own wrappers)."""
    if skip is None:
        return sum(entry.callcount for entry in prof.getstats())
    return sum(entry.callcount for entry in prof.getstats() if not skip(*where(entry)))
