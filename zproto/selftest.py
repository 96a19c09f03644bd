"""Build every message of a model from its ``<test>`` values and check it.

The convention is the C zproto tools': a field's ``<test>`` children give its
test value (several for a ``strings`` field, ``<test key=K>`` for hash entries
and composite parts); a field without one gets the C codec's default test value
(123, "Life is short but Now lasts for ever", ...); fields with ``value=`` keep
their constant.  A message's digest is the uppercase hex SHA-1 of its first
encoded frame, compared with the model's ``digest=`` when present.
"""

from __future__ import annotations

import hashlib
import sys
import types
import uuid
from dataclasses import dataclass
from typing import Any

from zproto.attrs import attributes
from zproto.model import Bit, Field, Message, Protocol

DEFAULT_STRING = "Life is short but Now lasts for ever"
DEFAULT_BYTES = b"Captcha Diem"


def load_module(source: str, name: str) -> types.ModuleType:
    """Execute generated source as a module (registered while it runs)."""
    module = types.ModuleType(name)
    module.__file__ = f"<zproto:{name}>"
    sys.modules[name] = module
    try:
        exec(compile(source, module.__file__, "exec"), module.__dict__)
    finally:
        del sys.modules[name]
    return module


def _field_test(fld: Field) -> Any:
    tests = fld.tests
    texts = [text for _, text in tests]
    if fld.type == "number":
        return int(texts[0], 0) if texts else 123
    if fld.type == "octets":
        if fld.length_ref is not None:
            return texts[0].encode() if texts else DEFAULT_BYTES
        size = int(fld.size or 0)
        return texts[0].encode() if texts else bytes([123] * size)
    if fld.type in ("string", "longstr"):
        return texts[0] if texts else DEFAULT_STRING
    if fld.type == "strings":
        return texts if texts else ["Name: Brutus", "Age: 43"]
    if fld.type == "hash":
        if tests:
            return {key or "": text for key, text in tests}
        return {"Name": "Brutus"}
    if fld.type in ("chunk", "frame"):
        return texts[0].encode() if texts else DEFAULT_BYTES
    if fld.type == "msg":
        return [t.encode() for t in texts] if texts else [DEFAULT_BYTES]
    if fld.type == "uuid":
        return uuid.UUID(hex=texts[0]) if texts else uuid.UUID(int=0)
    if fld.type == "headers":
        if tests:
            return tuple((key or "", text) for key, text in tests)
        return (("Name", "Brutus"),)
    raise AssertionError(fld.type)


def _bit_test(bit: Bit) -> Any:
    if bit.tests:
        value = int(bit.tests[0][1], 0)
    else:
        value = 1
    return bool(value) if bit.width == 1 else value


def test_values(msg: Message) -> dict[str, Any]:
    """Constructor arguments of a message built from its test values."""
    values: dict[str, Any] = {}
    for fld in msg.fields:
        if fld.derived:
            continue
        if fld.type == "bits":
            for bit in fld.bits:
                if not bit.derived and bit.value is None:
                    values[bit.ident] = _bit_test(bit)
            continue
        if fld.value is not None:
            continue
        values[fld.ident] = _field_test(fld)
    public = {a.ident for a in attributes(msg)}
    return {k: v for k, v in values.items() if k in public}


@dataclass(frozen=True)
class Result:
    name: str
    digest: str
    expected: str | None
    roundtrip_ok: bool

    @property
    def ok(self) -> bool:
        digest_ok = self.expected is None or self.expected.upper() == self.digest
        return digest_ok and self.roundtrip_ok


def run(proto: Protocol, module: types.ModuleType) -> list[Result]:
    results = []
    for msg in proto.messages:
        cls = getattr(module, msg.class_name)
        instance = cls(**test_values(msg))
        frames = module.encode(instance)
        digest = hashlib.sha1(frames[0]).hexdigest().upper()
        try:
            again = module.decode(frames)
            roundtrip_ok = again == instance
        except module.DecodeError:
            roundtrip_ok = False
        results.append(Result(msg.name, digest, msg.digest, roundtrip_ok))
    return results
