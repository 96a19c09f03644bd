"""Load zproto XML protocol models into a typed, validated model.

Two dialects share one loader:

* ``classic`` (the default): the model format of the C zproto tools.  Every
  message starts with the signature ``0xAAA0 | signature`` (2 octets) and a
  1-octet message id; numbers are unsigned big-endian.
* ``binary``: ``<class dialect = "binary">`` describes a binary frame with no
  signature or id: bit fields, little-endian numbers, lengths declared earlier
  in the frame, optional sections guarded by a flag bit, variable-length
  numbers and ``key:value\\r\\n`` header blocks.  See ``zproto/DIALECT.md``.

The loader resolves ``<include>``, flattens composite ``<type>`` fields, assigns
default ids in declaration order and checks everything it can, so the generator
can trust the model.
"""

from __future__ import annotations

import keyword
import re
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, replace
from pathlib import Path

from zproto.errors import ModelError

#: Field types of the classic zproto format.
CLASSIC_TYPES = frozenset(
    {
        "number",
        "octets",
        "string",
        "longstr",
        "strings",
        "hash",
        "dictionary",
        "chunk",
        "uuid",
        "frame",
        "msg",
    }
)
#: Types added by the binary dialect.
BINARY_TYPES = frozenset({"bits", "headers"})
NUMBER_SIZES = (1, 2, 4, 8)
#: ``size`` of a number field encoded with the TMQP variable-length scheme.
VARLEN = "varlen"


@dataclass(frozen=True)
class Bit:
    """One named bit group inside a ``bits`` field (most significant first)."""

    name: str
    ident: str
    width: int
    value: int | None = None
    derived: bool = False
    default: int | None = None
    description: str = ""
    tests: tuple[tuple[str | None, str], ...] = ()


@dataclass(frozen=True)
class Field:
    """One field of a message, after type flattening.

    ``type`` is normalised (``dictionary`` becomes ``hash``).  ``size`` is the
    byte size of numbers and octets, or ``"varlen"``.  ``length_ref`` names the
    earlier number field holding this field's length (binary dialect).
    ``derived`` fields are computed by the codec and do not appear in the
    generated dataclass (lengths, flag bits).
    """

    name: str
    ident: str
    type: str
    size: int | str | None = None
    value: str | None = None
    byteorder: str = "big"
    length_ref: str | None = None
    bits: tuple[Bit, ...] = ()
    derived: bool = False
    description: str = ""
    tests: tuple[tuple[str | None, str], ...] = ()
    default: str | None = None
    limit: int | None = None  # most entries a strings/hash field decodes (None: any)
    lazy: bool = False  # a hash field kept encoded, its entries read when first used


@dataclass(frozen=True)
class Optional:
    """A section of fields present only when the flag bit ``flag`` is set."""

    flag: str
    fields: tuple[Field, ...]


Item = Field | Optional


@dataclass(frozen=True)
class Message:
    name: str
    ident: str
    class_name: str
    id: int | None
    items: tuple[Item, ...]
    description: str = ""
    digest: str | None = None
    literal: bytes | None = None

    @property
    def fields(self) -> tuple[Field, ...]:
        """Every field in wire order, optional sections flattened."""
        out: list[Field] = []
        for item in self.items:
            if isinstance(item, Optional):
                out.extend(item.fields)
            else:
                out.append(item)
        return tuple(out)


@dataclass(frozen=True)
class Record:
    """``<record>`` on a binary model: frames decoded straight into a caller's tuple type
    (``zproto.records``): the named fields of the model's general message, in the
    order given, then (``wire``) the frame's octets paired with a key the caller gives."""

    name: str
    ident: str
    fields: tuple[str, ...]  # attribute idents of the general message, in record order
    wire: bool = False
    description: str = ""


@dataclass(frozen=True)
class Sender:
    """``<sender>`` on a binary model: an encoder of the general message made for a
    sender whose other fields stay the same message after message
    (``encode_<message>_sender(fixed...)`` gives ``encode(varying...)``)."""

    name: str
    ident: str
    fields: tuple[str, ...]  # attribute idents given to each call, in this order
    description: str = ""


@dataclass(frozen=True)
class Define:
    name: str
    value: str


@dataclass(frozen=True)
class Protocol:
    name: str
    path: Path
    dialect: str
    signature: int | None
    title: str
    description: str
    byteorder: str
    defines: tuple[Define, ...]
    messages: tuple[Message, ...]
    grammar: str = ""
    #: Octets of the length before each frame of a run of entries (``entries = "N"`` on
    #: a binary ``<class>``: the module gets ``decode_entries``); 0: none.
    entries: int = 0
    #: Frames also travel back to back in runs whose ends a table gives (``runs = "1"``
    #: on a binary ``<class>``: the module gets ``decode_run``, whose frames in the
    #: simplest shape keep their string fields encoded until one is read).
    runs: bool = False
    #: ``<record>`` elements: the module gets ``decode_<record>_records`` for each.
    records: tuple[Record, ...] = ()
    #: ``<sender>`` elements: the module gets ``encode_<sender>_sender`` for each.
    senders: tuple[Sender, ...] = ()
    #: How the message classes are made (``classes = "..."`` on ``<class>``):
    #: ``"dataclass"`` (frozen dataclasses, the default) or ``"plain"`` (the same
    #: frozen, typed classes with their methods written out: nothing made at import).
    classes: str = "dataclass"

    @property
    def signature_bytes(self) -> bytes:
        if self.signature is None:
            return b""
        return bytes((0xAA, 0xA0 | self.signature))

    def message(self, name: str) -> Message:
        for msg in self.messages:
            if name in (msg.name, msg.class_name, msg.ident):
                return msg
        raise KeyError(name)


# ---------------------------------------------------------------------------
# names


def to_ident(name: str) -> str:
    """snake_case Python identifier from a zproto name ("public key" -> public_key)."""
    words = re.split(r"[^0-9A-Za-z]+", name.strip())
    ident = "_".join(w.lower() for w in words if w)
    if not ident:
        raise ValueError(f"name {name!r} has no letters or digits")
    if ident[0].isdigit():
        ident = "_" + ident
    if keyword.iskeyword(ident) or ident in {"id", "type"}:
        ident += "_"
    return ident


def to_class_name(name: str) -> str:
    """CamelCase class name ("OHAI-OK" -> OhaiOk, "cheezburger" -> Cheezburger)."""
    words = [w for w in re.split(r"[^0-9A-Za-z]+", name.strip()) if w]
    if not words:
        raise ValueError(f"name {name!r} has no letters or digits")
    cls = "".join(w[:1].upper() + w[1:].lower() for w in words)
    if cls[0].isdigit():
        cls = "M" + cls
    return cls


def to_const_name(name: str) -> str:
    """UPPER_CASE constant name ("ohai-ok" -> OHAI_OK)."""
    return to_ident(name).rstrip("_").upper()


# ---------------------------------------------------------------------------
# loading


def load(path: str | Path) -> Protocol:
    """Load and validate the model at ``path``."""
    path = Path(path)
    return _Loader(path).load()


def _text(elem: ET.Element) -> str:
    """Own text of an element plus the tails of its children (its prose)."""
    parts = [elem.text or ""]
    for child in elem:
        parts.append(child.tail or "")
    lines = [line.strip() for line in "".join(parts).splitlines()]
    return "\n".join(line for line in lines if line).strip()


def _parse_int(text: str, what: str, where: str) -> int:
    try:
        return int(text.strip(), 0)
    except ValueError:
        raise ModelError(f"{where}: {what} {text!r} is not an integer") from None


class _Loader:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.where = str(path)

    # -- XML with includes -------------------------------------------------

    def _parse_file(self, path: Path) -> list[ET.Element]:
        """Parse a file into its top element(s); fragments may hold several."""
        try:
            raw = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ModelError(f"{path}: cannot read: {exc.strerror}") from None
        raw = re.sub(r"^\s*<\?xml[^>]*\?>", "", raw)
        try:
            return [ET.fromstring(raw)]
        except ET.ParseError:
            pass
        try:
            wrapper = ET.fromstring(f"<zproto-fragment>{raw}</zproto-fragment>")
        except ET.ParseError as exc:
            raise ModelError(f"{path}: not well-formed XML: {exc}") from None
        return list(wrapper)

    def _expand(self, elem: ET.Element, base: Path, seen: tuple[Path, ...]) -> None:
        """Replace every <include filename> below ``elem`` by the file's content."""
        index = 0
        while index < len(elem):
            child = elem[index]
            if child.tag != "include":
                self._expand(child, base, seen)
                index += 1
                continue
            filename = child.get("filename")
            if not filename:
                raise ModelError(f"{self.where}: <include> without filename")
            target = (base / filename).resolve()
            elem.remove(child)
            if target in seen:
                raise ModelError(f"{self.where}: include cycle through {target}")
            if not target.exists():
                # The C tools' models routinely include boilerplate such as
                # license.xml; a missing one is reported but not fatal.
                print(
                    f"zproto: {self.where}: include {filename!r} not found, skipped",
                    file=sys.stderr,
                )
                continue
            holder = ET.Element("zproto-include")
            holder.extend(self._parse_file(target))
            self._expand(holder, target.parent, (*seen, target))
            for offset, new in enumerate(holder):
                elem.insert(index + offset, new)
            index += len(holder)  # already expanded

    # -- model -------------------------------------------------------------

    def load(self) -> Protocol:
        roots = self._parse_file(self.path)
        if len(roots) != 1 or roots[0].tag != "class":
            raise ModelError(f"{self.where}: the root element must be <class>")
        root = roots[0]
        self._expand(root, self.path.parent, (self.path.resolve(),))

        name = root.get("name")
        if not name:
            raise ModelError(f"{self.where}: <class> needs a name")
        dialect = root.get("dialect", "classic")
        if dialect not in ("classic", "binary"):
            raise ModelError(f"{self.where}: unknown dialect {dialect!r}")
        self.dialect = dialect
        byteorder = root.get("byteorder", "big")
        if byteorder not in ("big", "little"):
            raise ModelError(f"{self.where}: byteorder must be big or little")
        self.byteorder = byteorder

        signature: int | None = None
        if dialect == "classic":
            # The C tools default a missing signature to 0 (czmq's own models rely on it).
            signature = _parse_int(root.get("signature", "0"), "signature", self.where)
            if not 0 <= signature <= 15:
                raise ModelError(f"{self.where}: signature {signature} is not 0..15")

        self.types: dict[str, ET.Element] = {}
        for elem in root.iter("type"):
            tname = elem.get("name")
            if not tname:
                raise ModelError(f"{self.where}: <type> needs a name")
            self.types[tname] = elem

        defines = tuple(
            Define(elem.get("name", ""), elem.get("value", "")) for elem in root.findall("define")
        )
        # value= may name a define, as the C tools allow (VERSION or FMQ_MSG_VERSION)
        self.define_values: dict[str, str] = {}
        for define in defines:
            if not define.name:
                raise ModelError(f"{self.where}: <define> needs a name")
            const = to_const_name(define.name)
            self.define_values[define.name] = define.value
            self.define_values[const] = define.value
            self.define_values[f"{to_const_name(name)}_{const}"] = define.value

        header_items: list[Item] = []
        for header in root.findall("header"):
            header_items.extend(self._items(header, "header"))

        messages: list[Message] = []
        used_ids: dict[int, str] = {}
        # As in the C tools, a message without id= gets its 1-based position.
        for position, elem in enumerate(root.findall("message"), start=1):
            msg = self._message(elem, header_items, position)
            if msg.id is not None:
                if msg.id in used_ids:
                    raise ModelError(
                        f"{self.where}: message {msg.name} reuses id {msg.id} "
                        f"of {used_ids[msg.id]}"
                    )
                used_ids[msg.id] = msg.name
            messages.append(msg)
        if not messages:
            raise ModelError(f"{self.where}: the model defines no <message>")
        names = [m.class_name for m in messages]
        for cname in names:
            if names.count(cname) > 1:
                raise ModelError(f"{self.where}: two messages are named {cname}")
        if dialect == "binary":
            general = [m for m in messages if m.literal is None]
            if len(general) > 1:
                raise ModelError(
                    f"{self.where}: a binary model has at most one message without "
                    f"literal= (found {', '.join(m.name for m in general)})"
                )
        grammar = "\n".join((g.text or "").strip("\n") for g in root.findall("grammar"))
        entries = _parse_int(root.get("entries", "0"), "entries", self.where)
        if entries and (dialect != "binary" or entries not in (2, 4)):
            raise ModelError(f'{self.where}: entries= is 2 or 4, with dialect="binary"')
        runs = root.get("runs", "0")
        if runs not in ("0", "1") or (runs == "1" and dialect != "binary"):
            raise ModelError(f'{self.where}: runs= is 0 or 1, 1 with dialect="binary"')
        if runs == "1" and not any(m.literal is None for m in messages):
            raise ModelError(f"{self.where}: runs= needs a message without literal=")
        records = self._records(root, dialect, messages)
        senders = self._senders(root, dialect, messages)
        classes = root.get("classes", "dataclass")
        if classes not in ("dataclass", "plain"):
            raise ModelError(f'{self.where}: classes= is "dataclass" or "plain"')
        if classes == "plain" and runs == "1":
            raise ModelError(f'{self.where}: classes="plain" does not go with runs="1"')
        return Protocol(
            name=name,
            path=self.path,
            dialect=dialect,
            signature=signature,
            title=root.get("title", name),
            description=_text(root),
            byteorder=byteorder,
            defines=defines,
            messages=tuple(messages),
            grammar=grammar,
            entries=entries,
            runs=runs == "1",
            records=records,
            senders=senders,
            classes=classes,
        )

    def _records(
        self, root: ET.Element, dialect: str, messages: list[Message]
    ) -> tuple[Record, ...]:
        """The ``<record>`` elements: each names fields of the binary model's general
        message (its attributes: no length or flag the codec computes), once each."""
        out: list[Record] = []
        for elem in root.findall("record"):
            name, ident, where = self._named(elem, dialect, messages, [r.ident for r in out])
            idents = _attribute_idents(elem, _general(messages), where)
            wire = elem.get("wire", "0")
            if wire not in ("0", "1"):
                raise ModelError(f"{where}: wire= is 0 or 1")
            out.append(Record(name, ident, tuple(idents), wire == "1", _text(elem)))
        return tuple(out)

    def _senders(
        self, root: ET.Element, dialect: str, messages: list[Message]
    ) -> tuple[Sender, ...]:
        """The ``<sender>`` elements: each names the fields of the binary model's general
        message that change from one call to the next (attributes, once each)."""
        out: list[Sender] = []
        for elem in root.findall("sender"):
            name, ident, where = self._named(elem, dialect, messages, [s.ident for s in out])
            idents = _attribute_idents(elem, _general(messages), where)
            out.append(Sender(name, ident, tuple(idents), _text(elem)))
        return tuple(out)

    def _named(
        self, elem: ET.Element, dialect: str, messages: list[Message], taken: list[str]
    ) -> tuple[str, str, str]:
        """A ``<record>`` or ``<sender>``'s name, ident and place in errors: it needs a
        binary model with a general message and a name no other of its kind has."""
        kind = elem.tag
        name = elem.get("name") or ""
        where = f"{self.where}: {kind} {name}"
        if dialect != "binary" or not [m for m in messages if m.literal is None]:
            raise ModelError(f'{where}: <{kind}> needs dialect="binary" and a message '
                             "without literal=")  # fmt: skip
        try:
            ident = to_ident(name)
        except ValueError:
            raise ModelError(f"{self.where}: <{kind}> needs a name") from None
        if ident in taken:
            raise ModelError(f"{where}: two {kind}s have this name")
        return name, ident, where

    def _message(self, elem: ET.Element, header: list[Item], next_id: int) -> Message:
        name = elem.get("name")
        if not name:
            raise ModelError(f"{self.where}: <message> needs a name")
        where = f"{self.where}: message {name}"
        literal: bytes | None = None
        literal_text = elem.get("literal")
        msg_id: int | None
        if self.dialect == "classic":
            id_text = elem.get("id")
            msg_id = next_id if id_text is None else _parse_int(id_text, "id", where)
            if not 0 <= msg_id <= 255:
                raise ModelError(f"{where}: id {msg_id} is not 0..255")
            if literal_text is not None:
                raise ModelError(f'{where}: literal= needs dialect="binary"')
        else:
            msg_id = None
            if literal_text is not None:
                try:
                    literal = bytes.fromhex(literal_text)
                except ValueError:
                    raise ModelError(f"{where}: literal= must be hex octets") from None
                if not literal:
                    raise ModelError(f"{where}: literal= is empty")
        items = list(header) + self._items(elem, where)
        if literal is not None and items:
            raise ModelError(f"{where}: a literal message has no fields")
        items = self._resolve(items, where)
        for pos, item in enumerate(items):  # (its octets run to the end of the frame)
            lazy = item.fields if isinstance(item, Optional) else (item,)
            if any(f.lazy for f in lazy) and (isinstance(item, Optional) or pos < len(items) - 1):
                raise ModelError(f"{where}: a lazy hash must be the last field")
        digest = elem.get("digest")
        if digest is not None:
            digest = digest.strip().upper()
            if not re.fullmatch(r"[0-9A-F]{40}", digest):
                raise ModelError(f"{where}: digest= must be 40 hex digits (SHA-1)")
        try:
            ident = to_ident(name)
            class_name = to_class_name(name)
        except ValueError as exc:
            raise ModelError(f"{where}: {exc}") from None
        return Message(
            name=name,
            ident=ident,
            class_name=class_name,
            id=msg_id,
            items=tuple(items),
            description=_text(elem),
            digest=digest,
            literal=literal,
        )

    # -- fields ------------------------------------------------------------

    def _items(
        self, parent: ET.Element, where: str, prefix: str = "", depth: int = 0
    ) -> list[Item]:
        if depth > 16:
            raise ModelError(f"{where}: <type> nesting too deep (recursive type?)")
        items: list[Item] = []
        for child in parent:
            if child.tag == "field":
                items.extend(self._field(child, where, prefix, depth))
            elif child.tag == "optional":
                if self.dialect != "binary":
                    raise ModelError(f'{where}: <optional> needs dialect="binary"')
                flag = child.get("flag")
                if not flag:
                    raise ModelError(f"{where}: <optional> needs flag=")
                inner = self._items(child, where, prefix, depth)
                if any(isinstance(i, Optional) for i in inner):
                    raise ModelError(f"{where}: <optional> sections do not nest")
                fields = tuple(i for i in inner if isinstance(i, Field))
                if not fields:
                    raise ModelError(f"{where}: empty <optional> section")
                items.append(Optional(flag=to_ident(flag), fields=fields))
        return items

    @staticmethod
    def _tests(elem: ET.Element) -> tuple[tuple[str | None, str], ...]:
        """The <test> values of a field: (key, text) pairs in order.

        As in the C tools: several <test> for a strings field, <test key|name=K>
        for hash entries and for the parts of a composite type.
        """
        out: list[tuple[str | None, str]] = []
        for node in elem.findall("test"):
            key = node.get("key", node.get("name"))
            out.append((key, node.get("value", (node.text or "").strip())))
        return tuple(out)

    def _field(self, elem: ET.Element, where: str, prefix: str, depth: int) -> list[Item]:
        name = elem.get("name")
        if not name:
            raise ModelError(f"{where}: <field> needs a name")
        full = f"{prefix}{name}" if not prefix else f"{prefix} {name}"
        ftype = elem.get("type", "string")
        where_f = f"{where}, field {full}"
        if ftype in self.types:
            parent_tests = self._tests(elem)
            out: list[Item] = []
            for item in self._items(self.types[ftype], where, full, depth + 1):
                if isinstance(item, Field):
                    leaf = item.name[len(full) + 1 :]
                    mine = tuple(
                        (None, text)
                        for key, text in parent_tests
                        if key is not None and to_ident(key) == to_ident(leaf)
                    )
                    if mine:
                        item = replace(item, tests=mine)
                out.append(item)
            return out
        if ftype == "dictionary":
            ftype = "hash"
        allowed = CLASSIC_TYPES | (BINARY_TYPES if self.dialect == "binary" else frozenset())
        if ftype not in allowed:
            raise ModelError(f"{where_f}: unknown type {ftype!r}")
        byteorder = elem.get("byteorder", self.byteorder)
        if byteorder not in ("big", "little"):
            raise ModelError(f"{where_f}: byteorder must be big or little")
        length_ref = elem.get("length")
        if length_ref is not None:
            if self.dialect != "binary":
                raise ModelError(f'{where_f}: length= needs dialect="binary"')
            if ftype not in ("string", "octets", "headers"):
                raise ModelError(f"{where_f}: length= applies to string, octets, headers")
            length_ref = to_ident(length_ref)
        size: int | str | None = None
        size_text = elem.get("size")
        if ftype == "number":
            if size_text == VARLEN:
                if self.dialect != "binary":
                    raise ModelError(f'{where_f}: size="varlen" needs dialect="binary"')
                size = VARLEN
            else:
                size = _parse_int(size_text or "1", "size", where_f)
                if size not in NUMBER_SIZES:
                    raise ModelError(f"{where_f}: number size must be 1, 2, 4 or 8")
        elif ftype == "octets":
            if length_ref is None:
                if size_text is None:
                    raise ModelError(f"{where_f}: octets need size= (or length=)")
                size = _parse_int(size_text, "size", where_f)
                if size < 0:
                    raise ModelError(f"{where_f}: negative size")
        elif ftype == "bits":
            size = _parse_int(size_text or "1", "size", where_f)
            if size not in NUMBER_SIZES:
                raise ModelError(f"{where_f}: bits size must be 1, 2, 4 or 8 octets")
        elif ftype == "headers" and length_ref is None:
            raise ModelError(f"{where_f}: a headers block needs length=")
        value = elem.get("value")
        if value is not None:
            value = self.define_values.get(value, value)
        if value is not None and ftype not in ("number", "string", "longstr"):
            raise ModelError(f"{where_f}: value= applies to number and string fields")
        if value is not None and ftype == "number":
            _parse_int(value, "value", where_f)
        default = elem.get("default")
        if default is not None:
            if ftype == "number":
                _parse_int(default, "default", where_f)
            elif ftype not in ("string", "longstr"):
                raise ModelError(f"{where_f}: default= applies to number and string fields")
        limit: int | None = None
        limit_text = elem.get("limit")
        if limit_text is not None:
            if ftype not in ("strings", "hash"):
                raise ModelError(f"{where_f}: limit= applies to strings and hash fields")
            limit = _parse_int(limit_text, "limit", where_f)
            if limit < 0:
                raise ModelError(f"{where_f}: negative limit")
        lazy = elem.get("lazy")
        if lazy not in (None, "0", "1"):
            raise ModelError(f"{where_f}: lazy= is 0 or 1")
        if lazy == "1" and ftype != "hash":
            raise ModelError(f"{where_f}: lazy= applies to hash fields")
        bits: tuple[Bit, ...] = ()
        if ftype == "bits":
            bits = self._bits(elem, where_f, int(size or 1) * 8)
        try:
            ident = to_ident(full)
        except ValueError as exc:
            raise ModelError(f"{where_f}: {exc}") from None
        return [
            Field(
                name=full,
                ident=ident,
                type=ftype,
                size=size,
                value=value,
                byteorder=byteorder,
                length_ref=length_ref,
                bits=bits,
                description=_text(elem),
                tests=self._tests(elem),
                default=default,
                limit=limit,
                lazy=lazy == "1",
            )
        ]

    def _bits(self, elem: ET.Element, where: str, total: int) -> tuple[Bit, ...]:
        bits: list[Bit] = []
        used = 0
        for child in elem.findall("bit"):
            bname = child.get("name")
            if not bname:
                raise ModelError(f"{where}: <bit> needs a name")
            width = _parse_int(child.get("size", "1"), "size", where)
            if width < 1:
                raise ModelError(f"{where}: bit {bname} has width < 1")
            value = child.get("value")
            default = child.get("default")
            bits.append(
                Bit(
                    name=bname,
                    ident=to_ident(bname),
                    width=width,
                    value=None if value is None else _parse_int(value, "value", where),
                    description=_text(child),
                    tests=self._tests(child),
                    default=None if default is None else _parse_int(default, "default", where),
                )
            )
            used += width
        if used != total:
            raise ModelError(f"{where}: bits add up to {used}, the field holds {total}")
        return tuple(bits)

    def _resolve(self, items: list[Item], where: str) -> list[Item]:
        """Check names and references; mark derived fields."""
        flat: list[Field] = []
        for item in items:
            flat.extend(item.fields if isinstance(item, Optional) else [item])
        seen: dict[str, Field] = {}
        bit_names: dict[str, Bit] = {}
        for position, fld in enumerate(flat):
            names = [b.ident for b in fld.bits] if fld.type == "bits" else [fld.ident]
            for ident in names:
                if ident in seen or ident in bit_names:
                    raise ModelError(f"{where}: field name {ident!r} is used twice")
            if fld.type == "bits":
                for b in fld.bits:
                    bit_names[b.ident] = b
            seen[fld.ident] = fld
            if fld.type == "msg" and position != len(flat) - 1:
                raise ModelError(f"{where}: a msg field must be the last field")
        length_refs: dict[str, str] = {}
        order = {f.ident: i for i, f in enumerate(flat)}
        for fld in flat:
            if fld.length_ref is None:
                continue
            ref = seen.get(fld.length_ref)
            if ref is None or ref.type != "number":
                raise ModelError(
                    f"{where}: field {fld.ident} takes its length from "
                    f"{fld.length_ref!r}, which is not a number field"
                )
            if order[ref.ident] > order[fld.ident]:
                raise ModelError(f"{where}: length {ref.ident} must come before {fld.ident}")
            if ref.ident in length_refs:
                raise ModelError(f"{where}: {ref.ident} is the length of two fields")
            if ref.value is not None:
                raise ModelError(f"{where}: length field {ref.ident} cannot have value=")
            length_refs[ref.ident] = fld.ident
        flags: set[str] = set()
        for item in items:
            if isinstance(item, Optional):
                if item.flag not in bit_names or bit_names[item.flag].width != 1:
                    raise ModelError(
                        f"{where}: <optional flag> {item.flag!r} is not a 1-bit field"
                    )
                if item.flag in flags:
                    raise ModelError(f"{where}: flag {item.flag} guards two sections")
                flags.add(item.flag)
                for fld in item.fields:
                    if fld.type in ("frame", "msg"):
                        raise ModelError(f"{where}: frame/msg fields cannot be optional")
                    if fld.length_ref is not None and fld.length_ref not in {
                        f.ident for f in item.fields
                    }:
                        raise ModelError(
                            f"{where}: optional {fld.ident} takes its length from "
                            "outside its section"
                        )

        def mark(fld: Field) -> Field:
            new_bits = tuple(replace(b, derived=b.ident in flags) for b in fld.bits)
            return replace(fld, bits=new_bits, derived=fld.ident in length_refs)

        out: list[Item] = []
        for item in items:
            if isinstance(item, Optional):
                out.append(Optional(item.flag, tuple(mark(f) for f in item.fields)))
            else:
                out.append(mark(item))
        return out


def _general(messages: list[Message]) -> Message:
    """The model's message without ``literal=`` (a binary model has at most one)."""
    return next(m for m in messages if m.literal is None)


def _attribute_idents(elem: ET.Element, general: Message, where: str) -> list[str]:
    """The attribute idents ``elem``'s ``fields=`` names (field names or idents) of the
    general message: each once, none a length or flag the codec computes."""
    known: dict[str, str] = {}  # field name or ident -> attribute ident
    for fld in general.fields:
        if fld.derived:
            continue
        parts = [b for b in fld.bits if not b.derived] if fld.type == "bits" else [fld]
        for part in parts:
            known[part.name] = known[part.ident] = part.ident
    names = [n.strip() for n in (elem.get("fields") or "").split(",") if n.strip()]
    if not names:
        raise ModelError(f"{where}: fields= lists no field")
    idents: list[str] = []
    for field_name in names:
        if field_name not in known:
            raise ModelError(f"{where}: {field_name!r} is not a field of {general.name} "
                             "(lengths and flags are computed)")  # fmt: skip
        if known[field_name] in idents:
            raise ModelError(f"{where}: {field_name!r} is named twice")
        idents.append(known[field_name])
    return idents
