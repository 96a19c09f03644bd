"""The loader reads the C tools' model format unchanged and rejects bad models clearly."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.zproto.support import MODELS_DIR, codec
from zproto.errors import DecodeError, ModelError
from zproto.model import Field, Optional, load, to_class_name, to_ident


def test_c_tools_model_loads_unchanged() -> None:
    proto = load(MODELS_DIR / "c_tools_example.xml")
    assert proto.signature == 0 and proto.signature_bytes == b"\xaa\xa0"
    assert [m.name for m in proto.messages] == ["LOG", "STRUCTURES", "BINARY", "TYPES", "DEFAULTS"]
    assert [m.id for m in proto.messages] == [1, 2, 3, 4, 5]  # DEFAULTS: id by position
    log = proto.message("LOG")
    assert [f.ident for f in log.fields][:2] == ["sequence", "version"]  # header first
    types = proto.message("TYPES")
    assert [f.ident for f in types.fields][1:5] == [
        "client_forename",
        "client_surname",
        "client_mobile",
        "client_email",
    ]
    assert types.fields[1].tests == ((None, "Lucius Junius"),)
    binary = proto.message("BINARY")
    assert "public_key" in [f.ident for f in binary.fields]
    defaults = proto.message("DEFAULTS")
    assert {f.ident: f.type for f in defaults.fields}["props"] == "hash"  # dictionary alias
    assert proto.defines[0].name == "VERSION"


def test_names() -> None:
    assert to_class_name("OHAI-OK") == "OhaiOk"
    assert to_class_name("cheezburger") == "Cheezburger"
    assert to_ident("public key") == "public_key"
    assert to_ident("Client-Id") == "client_id"
    assert to_ident("class") == "class_"


def _model(tmp_path: Path, body: str, attrs: str = 'signature = "1"') -> Path:
    path = tmp_path / "m.xml"
    path.write_text(f'<class name = "m" {attrs}>\n{body}\n</class>\n', encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("body", "attrs", "message"),
    [
        ('<message name = "a"><field name = "x" type = "float"/></message>', None, "unknown type"),
        (
            '<message name = "a"><field name = "x" type = "number" size = "3"/></message>',
            None,
            "size must be",
        ),
        ('<message name = "a" id = "1"/><message name = "b" id = "1"/>', None, "reuses id"),
        (
            '<message name = "a"><field name = "m" type = "msg"/><field name = "x"/></message>',
            None,
            "last field",
        ),
        (
            '<message name = "a"><field name = "x"/><field name = "x"/></message>',
            None,
            "used twice",
        ),
        ("", None, "no <message>"),
        ('<message name = "a"/>', 'signature = "16"', "not 0..15"),
        ('<message name = "a"/>', 'signature = "-1"', "not 0..15"),
        ('<message name = "a"/>', 'signature = "x"', "not an integer"),
        ('<message name = "a"><field name = "x" type = "octets"/></message>', None, "need size"),
        ('<message name = "a"><field name = "x" type = "bits"/></message>', None, "unknown type"),
        (
            '<message name = "a"><field name = "x" type = "string" limit = "3"/></message>',
            None,
            "limit= applies to strings and hash",
        ),
        (
            '<message name = "a"><field name = "x" type = "hash" limit = "-1"/></message>',
            None,
            "negative limit",
        ),
        (
            '<message name = "a"><field name = "s" type = "string" length = "n"/></message>',
            None,
            "dialect",
        ),
    ],
)
def test_bad_models_are_rejected(
    tmp_path: Path, body: str, attrs: str | None, message: str
) -> None:
    path = _model(tmp_path, body, attrs if attrs is not None else 'signature = "1"')
    with pytest.raises(ModelError, match=message):
        load(path)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            '<message name = "a"><field name = "s" type = "string" length = "n"/></message>',
            "not a number field",
        ),
        (
            '<message name = "a"><field name = "s" type = "string" length = "n"/>'
            '<field name = "n" type = "number"/></message>',
            "must come before",
        ),
        (
            '<message name = "a"><field name = "f" type = "bits"><bit name = "x" size = "3"/>'
            "</field></message>",
            "add up to 3",
        ),
        (
            '<message name = "a"><optional flag = "nope"><field name = "x"/></optional></message>',
            "not a 1-bit field",
        ),
        ('<message name = "a"/><message name = "b"/>', "at most one message without literal"),
        ('<message name = "a" literal = "zz"/>', "hex"),
        ('<message name = "a"><field name = "h" type = "headers"/></message>', "needs length"),
    ],
)
def test_bad_binary_models_are_rejected(tmp_path: Path, body: str, message: str) -> None:
    path = _model(tmp_path, body, 'dialect = "binary"')
    with pytest.raises(ModelError, match=message):
        load(path)


def test_binary_model_marks_derived_fields() -> None:
    proto = load(Path(__file__).resolve().parents[2] / "broker" / "tmqp.xml")
    frame = proto.message("frame")
    derived = {f.ident for f in frame.fields if f.derived}
    assert derived == {
        "id_length",
        "source_length",
        "target_length",
        "payload_length",
        "header_length",
    }
    optional = [i for i in frame.items if isinstance(i, Optional)]
    assert optional[0].flag == "has_header"
    flags = next(f for f in frame.fields if isinstance(f, Field) and f.ident == "options")
    assert [b.ident for b in flags.bits if b.derived] == ["has_header"]
    assert [m.literal for m in proto.messages if m.literal] == [
        b"TMQP/2.0",
        bytes.fromhex("89FF000000000000"),
        bytes.fromhex("8AFF000000000000"),
    ]


def test_value_may_name_a_define_and_include_cycles_are_caught(tmp_path: Path) -> None:
    path = _model(
        tmp_path,
        '<define name = "VERSION" value = "7"/>'
        '<message name = "a"><field name = "v" type = "number" value = "M_VERSION"/></message>',
    )
    assert load(path).messages[0].fields[0].value == "7"
    (tmp_path / "a.xml").write_text('<include filename = "b.xml"/>')
    (tmp_path / "b.xml").write_text('<include filename = "a.xml"/>')
    cyc = _model(tmp_path, '<include filename = "a.xml"/><message name = "x"/>')
    with pytest.raises(ModelError, match="cycle"):
        load(cyc)


def test_include_splices_messages(tmp_path: Path) -> None:
    (tmp_path / "more.xml").write_text(
        '<message name = "extra" id = "9"/>\n<define name = "K" value = "1"/>'
    )
    path = _model(tmp_path, '<message name = "a"/><include filename = "more.xml"/>')
    proto = load(path)
    assert [(m.name, m.id) for m in proto.messages] == [("a", 1), ("extra", 9)]
    assert proto.defines[0].name == "K"


def test_malformed_xml_is_a_model_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.xml"
    path.write_text("<class name='x' signature='1'><message name='a'></class>")
    with pytest.raises(ModelError, match="not well-formed"):
        load(path)


def test_a_class_without_signature_gets_signature_0_like_the_c_tools() -> None:
    """A model shaped like czmq's gossip model (no signature, no ids) loads and works."""
    proto = load(MODELS_DIR / "gossip_like.xml")
    assert proto.signature == 0 and proto.signature_bytes == b"\xaa\xa0"
    assert [(m.name, m.id) for m in proto.messages] == [
        ("greet", 1),
        ("spread", 2),
        ("poke", 3),
        ("poked", 4),
        ("refused", 5),
    ]
    spread = proto.message("spread")
    assert [(f.ident, f.type) for f in spread.fields] == [
        ("revision", "number"),
        ("topic", "string"),
        ("body", "longstr"),
        ("expiry", "number"),
    ]
    _, module = codec(MODELS_DIR / "gossip_like.xml", None)
    msg = module.Spread(topic="weather", body="rain by noon", expiry=60000)
    wire = b"\xaa\xa0\x02\x01\x07weather\x00\x00\x00\x0crain by noon\x00\x00\xea\x60"
    assert module.encode(msg) == [wire]
    assert module.decode([wire]) == msg
    assert module.encode(module.Poke()) == [b"\xaa\xa0\x03\x01"]
    with pytest.raises(DecodeError):  # revision is a constant
        module.decode([b"\xaa\xa0\x03\x02"])


@pytest.mark.parametrize(
    ("attrs", "message"),
    [
        ('signature = "1" classes = "slots"', 'classes= is "dataclass" or "plain"'),
        ('dialect = "binary" runs = "1" classes = "plain"', 'does not go with runs="1"'),
    ],
)
def test_classes_is_dataclass_or_plain(tmp_path: Path, attrs: str, message: str) -> None:
    body = (
        '<message name = "PING" id = "1"><field name = "n" type = "number" size = "1" /></message>'
    )
    with pytest.raises(ModelError, match=message):
        load(_model(tmp_path, body, attrs))
    plain = load(_model(tmp_path, body, 'signature = "1" classes = "plain"'))
    assert plain.classes == "plain" and load(_model(tmp_path, body)).classes == "dataclass"
