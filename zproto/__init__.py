"""zproto: generate typed Python codecs from zproto XML protocol models.

``zproto generate MODEL.xml`` writes ``MODEL.py`` (the codec) and ``MODEL.md``
(the protocol grammar) beside the model.  See ``zproto/DIALECT.md`` for the
model format and its binary-frame extension.
"""

from __future__ import annotations

__version__ = "0.1.0"
