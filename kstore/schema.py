"""Typed topics: a declared value (and key) schema, stored column by column.

A schema is written in the topic log as Spark's JSON form of a data type (``StructType.json()``),
so any Spark can read it back with ``StructType.fromJson``; in memory it is an Arrow type. It
may be given as an Arrow schema or type, a Spark ``StructType``, its JSON, or a Spark DDL
string (``"user STRING NOT NULL, amount DECIMAL(12,2), tags ARRAY<STRING>"``).

This module holds everything typed topics need that does not depend on Spark:

- parsing and printing schemas (JSON, DDL, Arrow);
- the evolution rules (PROTOCOL.md section 25): which schema may follow which;
- projecting values written under an older schema onto the current one (new fields null,
  widened numbers cast);
- validating Python values (dicts, dataclasses, pydantic models) against the schema, naming
  the field that is wrong.

Segments store every field nullable at the Arrow level (Spark accepts nothing else); ``NOT
NULL`` is a constraint kstore checks when records are written.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import json
import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from kstore.errors import InvalidRecordError, KStoreError, UnsupportedFormatVersionError
from kstore.settings import is_int


class SchemaError(KStoreError, ValueError):
    """A schema that cannot be declared: unknown type, bad name, malformed DDL or JSON."""


class IncompatibleSchemaError(KStoreError, ValueError):
    """A schema change the evolution rules refuse (PROTOCOL.md section 25)."""


MAX_FIELDS = 10_000  # per struct
MAX_DEPTH = 32  # nesting of structs, arrays and maps
MAX_NAME_LENGTH = 255
MAX_SCHEMA_VERSIONS = 1_000  # evolutions kept in one topic's history
MAX_DECIMAL_PRECISION = 38

TIMESTAMP_TZ = pa.timestamp("us", tz="UTC")
TIMESTAMP_NTZ = pa.timestamp("us")

# Spark's JSON names of the primitive types, and their Arrow storage types.
PRIMITIVES: dict[str, pa.DataType] = {
    "boolean": pa.bool_(),
    "byte": pa.int8(),
    "short": pa.int16(),
    "integer": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "string": pa.string(),
    "binary": pa.binary(),
    "date": pa.date32(),
    "timestamp": TIMESTAMP_TZ,
    "timestamp_ntz": TIMESTAMP_NTZ,
}
_NAME_OF = {str(t): name for name, t in PRIMITIVES.items()}

# Primitive types a typed key may have, and how a key is turned into the bytes the partitioner
# hashes: exactly as Kafka's own serializers would (StringSerializer, LongSerializer, ...), so
# a typed key lands in the partition the same key lands in from a Kafka client.
KEY_TYPES = ("string", "binary", "long", "integer", "short", "double", "float")

_DECIMAL = re.compile(r"decimal\(\s*(\d+)\s*,\s*(-?\d+)\s*\)")
_INT_WIDTH = {"byte": 1, "short": 2, "integer": 3, "long": 4}
# Numeric widenings a schema change may make (besides decimal widening): every value of the
# old type is exactly representable in the new one.
_WIDENINGS = {
    ("byte", "short"),
    ("byte", "integer"),
    ("byte", "long"),
    ("short", "integer"),
    ("short", "long"),
    ("integer", "long"),
    ("byte", "double"),
    ("short", "double"),
    ("integer", "double"),
    ("float", "double"),
}


# -- names and types ---------------------------------------------------------------------------


def type_name(t: pa.DataType) -> str:
    """Spark's simple name of an Arrow storage type (for messages and DDL)."""
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    if pa.types.is_struct(t):
        inner = ", ".join(f"{_quote(f.name)}: {type_name(f.type)}" for f in t)
        return f"struct<{inner}>"
    if pa.types.is_map(t):
        return f"map<{type_name(t.key_type)}, {type_name(t.item_type)}>"
    if pa.types.is_list(t):
        return f"array<{type_name(t.value_type)}>"
    name = _NAME_OF.get(str(t))
    if name is None:
        raise SchemaError(f"Arrow type {t} has no kstore equivalent")
    return name


def _quote(name: str) -> str:
    return (
        name
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name)
        else "`" + name.replace("`", "``") + "`"
    )


def _check_name(name: Any, path: str) -> str:
    if not isinstance(name, str) or not name:
        raise SchemaError(f"{path}: a field name must be a non-empty string, got {name!r}")
    if len(name) > MAX_NAME_LENGTH:
        raise SchemaError(f"{path}: field name is {len(name)} characters; the limit is 255")
    if any(unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co", "Cn") for c in name):
        raise SchemaError(f"{path}: field name {name!r} holds control or invisible characters")
    if unicodedata.normalize("NFC", name) != name:
        raise SchemaError(f"{path}: field name {name!r} is not in Unicode NFC form")
    return name


def _field_path(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


@dataclass(frozen=True)
class Field:
    """A declared field: its Arrow storage type (all nullable) and its declared nullability."""

    name: str
    type: pa.DataType
    nullable: bool


def storage_type(t: pa.DataType) -> pa.DataType:
    """The type as segments store it: every nested field nullable, list items named
    ``element`` and map entries ``key``/``value``, as Spark's Arrow batches are."""
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, storage_type(f.type), nullable=True) for f in t])
    if pa.types.is_map(t):
        return pa.map_(storage_type(t.key_type), storage_type(t.item_type))
    if pa.types.is_list(t):
        return pa.list_(pa.field("element", storage_type(t.value_type), nullable=True))
    return t


# -- the declared form (Spark JSON) -------------------------------------------------------------


def from_json(obj: Any, path: str = "") -> tuple[pa.DataType, dict[str, Any]]:
    """A type from Spark's JSON form; returns the Arrow storage type and the declared
    nullabilities (a tree of dicts: field name -> (nullable, children))."""
    return _from_json(obj, path or "schema", 0)


def _from_json(obj: Any, path: str, depth: int) -> tuple[pa.DataType, dict[str, Any]]:
    if depth > MAX_DEPTH:
        raise SchemaError(f"{path}: nested more than {MAX_DEPTH} levels deep")
    if isinstance(obj, str):
        if obj in PRIMITIVES:
            return PRIMITIVES[obj], {}
        m = _DECIMAL.fullmatch(obj)
        if m:
            return _decimal(int(m.group(1)), int(m.group(2)), path), {}
        if not re.fullmatch(r"[a-z_]+(\(.*\))?", obj):
            raise SchemaError(f"{path}: {obj!r} is not a type")
        raise UnsupportedFormatVersionError(
            f"{path}: type {obj!r} is not one this kstore knows (a newer kstore wrote it?)"
        )
    if not isinstance(obj, Mapping):
        raise SchemaError(f"{path}: expected a type name or object, got {type(obj).__name__}")
    kind = obj.get("type")
    if kind == "struct":
        fields = obj.get("fields")
        if not isinstance(fields, list):
            raise SchemaError(f"{path}: a struct needs a 'fields' list")
        if len(fields) > MAX_FIELDS:
            raise SchemaError(f"{path}: {len(fields)} fields; the limit is {MAX_FIELDS}")
        arrow_fields = []
        nulls: dict[str, Any] = {}
        seen: dict[str, str] = {}
        for i, f in enumerate(fields):
            if not isinstance(f, Mapping):
                raise SchemaError(f"{path}: field {i} is not an object")
            name = _check_name(f.get("name"), f"{path} field {i}")
            folded = name.casefold()
            if folded in seen:
                raise SchemaError(
                    f"{path}: fields {seen[folded]!r} and {name!r} differ only in case "
                    "(Spark resolves names case-insensitively)"
                )
            seen[folded] = name
            nullable = f.get("nullable", True)
            if not isinstance(nullable, bool):
                raise SchemaError(f"{_field_path(path, name)}: 'nullable' must be true or false")
            child, child_nulls = _from_json(f.get("type"), _field_path(path, name), depth + 1)
            arrow_fields.append(pa.field(name, child, nullable=True))
            nulls[name] = (nullable, child_nulls)
        return pa.struct(arrow_fields), nulls
    if kind == "array":
        element, element_nulls = _from_json(obj.get("elementType"), f"{path}[]", depth + 1)
        contains_null = obj.get("containsNull", True)
        if not isinstance(contains_null, bool):
            raise SchemaError(f"{path}: 'containsNull' must be true or false")
        return (
            pa.list_(pa.field("element", element, nullable=True)),
            {"[]": (contains_null, element_nulls)},
        )
    if kind == "map":
        key, _ = _from_json(obj.get("keyType"), f"{path}{{key}}", depth + 1)
        if pa.types.is_nested(key):
            raise SchemaError(f"{path}: map keys must be a primitive type, got {type_name(key)}")
        value, value_nulls = _from_json(obj.get("valueType"), f"{path}{{value}}", depth + 1)
        contains_null = obj.get("valueContainsNull", True)
        if not isinstance(contains_null, bool):
            raise SchemaError(f"{path}: 'valueContainsNull' must be true or false")
        return pa.map_(key, value), {"{}": (contains_null, value_nulls)}
    if isinstance(kind, str) and kind not in ("struct", "array", "map"):
        raise UnsupportedFormatVersionError(
            f"{path}: type {kind!r} is not one this kstore knows (a newer kstore wrote it?)"
        )
    raise SchemaError(f"{path}: not a Spark JSON type: {json.dumps(obj)[:200]}")


def _decimal(precision: int, scale: int, path: str) -> pa.DataType:
    if not 1 <= precision <= MAX_DECIMAL_PRECISION or not 0 <= scale <= precision:
        raise SchemaError(
            f"{path}: decimal({precision},{scale}) is out of range "
            f"(precision 1..{MAX_DECIMAL_PRECISION}, scale 0..precision)"
        )
    return pa.decimal128(precision, scale)


def to_json(t: pa.DataType, nulls: Mapping[str, Any] | None = None) -> Any:
    """Spark's JSON form of a storage type with the declared nullabilities."""
    nulls = nulls or {}
    if pa.types.is_struct(t):
        fields = []
        for f in t:
            nullable, children = nulls.get(f.name, (True, {}))
            fields.append(
                {
                    "name": f.name,
                    "type": to_json(f.type, children),
                    "nullable": nullable,
                    "metadata": {},
                }
            )
        return {"type": "struct", "fields": fields}
    if pa.types.is_map(t):
        contains_null, children = nulls.get("{}", (True, {}))
        return {
            "type": "map",
            "keyType": to_json(t.key_type),
            "valueType": to_json(t.item_type, children),
            "valueContainsNull": contains_null,
        }
    if pa.types.is_list(t):
        contains_null, children = nulls.get("[]", (True, {}))
        return {
            "type": "array",
            "elementType": to_json(t.value_type, children),
            "containsNull": contains_null,
        }
    return type_name(t)


# -- other ways to declare a schema -------------------------------------------------------------


def _from_arrow(t: pa.DataType, path: str, depth: int) -> Any:
    """Spark JSON for an Arrow type (a user's declaration: any Arrow nullability is kept)."""
    if depth > MAX_DEPTH:
        raise SchemaError(f"{path}: nested more than {MAX_DEPTH} levels deep")
    if pa.types.is_dictionary(t):
        return _from_arrow(t.value_type, path, depth)
    if pa.types.is_struct(t):
        return {
            "type": "struct",
            "fields": [
                {
                    "name": f.name,
                    "type": _from_arrow(f.type, _field_path(path, f.name), depth + 1),
                    "nullable": f.nullable,
                    "metadata": {},
                }
                for f in t
            ],
        }
    if pa.types.is_map(t):
        return {
            "type": "map",
            "keyType": _from_arrow(t.key_type, f"{path}{{key}}", depth + 1),
            "valueType": _from_arrow(t.item_type, f"{path}{{value}}", depth + 1),
            "valueContainsNull": t.item_field.nullable,
        }
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return {
            "type": "array",
            "elementType": _from_arrow(t.value_type, f"{path}[]", depth + 1),
            "containsNull": t.value_field.nullable,
        }
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return "binary"
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_timestamp(t):
        return "timestamp" if t.tz is not None else "timestamp_ntz"
    if pa.types.is_decimal(t) and t.precision <= MAX_DECIMAL_PRECISION:
        return f"decimal({t.precision},{t.scale})"
    name = _NAME_OF.get(str(t))
    if name is None:
        raise SchemaError(
            f"{path}: Arrow type {t} has no Spark equivalent; use one of "
            f"{', '.join(PRIMITIVES)}, decimal, array, map or struct"
        )
    return name


def declare(spec: Any, *, what: str = "value schema") -> Any:
    """Spark JSON of a schema given any way a user may give one."""
    if isinstance(spec, pa.Schema):
        return _from_arrow(pa.struct(list(spec)), what, 0)
    if isinstance(spec, pa.DataType):
        return _from_arrow(spec, what, 0)
    if hasattr(spec, "jsonValue") and callable(spec.jsonValue):  # a pyspark DataType
        return spec.jsonValue()
    if isinstance(spec, Mapping):
        return dict(spec)
    if isinstance(spec, str):
        text = spec.strip()
        if text.startswith("{"):
            try:
                return json.loads(text)
            except json.JSONDecodeError as exc:
                raise SchemaError(f"{what}: malformed JSON ({exc})") from None
        if text in PRIMITIVES or _DECIMAL.fullmatch(text.lower()):
            return text.lower()
        return parse_ddl(text, what=what)
    raise SchemaError(
        f"{what}: give an Arrow schema or type, a Spark StructType, its JSON, or a DDL string; "
        f"got {type(spec).__name__}"
    )


_DDL_TYPES = {
    "boolean": "boolean",
    "bool": "boolean",
    "tinyint": "byte",
    "byte": "byte",
    "smallint": "short",
    "short": "short",
    "int": "integer",
    "integer": "integer",
    "bigint": "long",
    "long": "long",
    "float": "float",
    "real": "float",
    "double": "double",
    "string": "string",
    "binary": "binary",
    "date": "date",
    "timestamp": "timestamp",
    "timestamp_ltz": "timestamp",
    "timestamp_ntz": "timestamp_ntz",
}
_TOKEN = re.compile(
    r"\s*(?:(`(?:[^`]|``)*`)|([A-Za-z_][A-Za-z0-9_]*)|(\d+)|('(?:[^'\\]|\\.)*')|(.))"
)


class _Ddl:
    """A recursive-descent parser of Spark's DDL column lists and types."""

    def __init__(self, text: str, what: str) -> None:
        self.text = text
        self.what = what
        self.tokens: list[tuple[str, str, int]] = []  # (kind, text, position)
        pos = 0
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None or m.end() == pos:
                break
            kind = next(
                k
                for k, g in zip(("quoted", "word", "int", "str", "sym"), m.groups(), strict=True)
                if g
            )
            value = m.group(m.lastindex or 0)
            if kind == "quoted":
                value = value[1:-1].replace("``", "`")
            self.tokens.append((kind, value, m.start(m.lastindex or 0)))
            pos = m.end()
        self.i = 0

    def error(self, message: str) -> SchemaError:
        at = self.tokens[self.i][2] if self.i < len(self.tokens) else len(self.text)
        return SchemaError(f"{self.what}: {message} at position {at} of {self.text!r}")

    def peek(self) -> tuple[str, str]:
        if self.i < len(self.tokens):
            kind, value, _ = self.tokens[self.i]
            return kind, value
        return "end", ""

    def take(self) -> tuple[str, str]:
        token = self.peek()
        self.i += 1
        return token

    def expect(self, symbol: str) -> None:
        _, value = self.take()
        if value != symbol:
            self.i -= 1
            raise self.error(f"expected {symbol!r}, found {value or 'the end'!r}")

    def word(self, *words: str) -> bool:
        kind, value = self.peek()
        if kind == "word" and value.lower() in words:
            self.i += 1
            return True
        return False

    def columns(self, closing: str | None, depth: int) -> Any:
        fields = []
        while True:
            kind, name = self.take()
            if kind not in ("word", "quoted"):
                self.i -= 1
                raise self.error("expected a field name")
            if closing is not None and self.peek()[1] == ":":
                self.take()
            dtype = self.type(depth + 1)
            nullable = True
            while True:
                if self.word("not"):
                    if not self.word("null"):
                        raise self.error("expected NULL after NOT")
                    nullable = False
                elif self.word("comment"):
                    if self.take()[0] != "str":
                        self.i -= 1
                        raise self.error("expected a quoted comment")
                else:
                    break
            fields.append({"name": name, "type": dtype, "nullable": nullable, "metadata": {}})
            kind, value = self.peek()
            if value == ",":
                self.take()
                continue
            if closing is not None and value == closing:
                self.take()
                break
            if closing is None and kind == "end":
                break
            raise self.error(f"unexpected {value!r}")
        return {"type": "struct", "fields": fields}

    def type(self, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise self.error(f"types nest more than {MAX_DEPTH} levels deep")
        kind, value = self.take()
        word = value.lower()
        if kind != "word":
            self.i -= 1
            raise self.error("expected a type")
        if word in ("decimal", "dec", "numeric"):
            precision, scale = 10, 0
            if self.peek()[1] == "(":
                self.take()
                precision = self.number()
                if self.peek()[1] == ",":
                    self.take()
                    scale = self.number()
                self.expect(")")
            return f"decimal({precision},{scale})"
        if word in ("varchar", "char"):
            raise self.error(f"{value.upper()}(n) is not supported; use STRING")
        if word in _DDL_TYPES:
            return _DDL_TYPES[word]
        if word == "array":
            self.expect("<")
            element = self.type(depth + 1)
            self.expect(">")
            return {"type": "array", "elementType": element, "containsNull": True}
        if word == "map":
            self.expect("<")
            key = self.type(depth + 1)
            self.expect(",")
            value_type = self.type(depth + 1)
            self.expect(">")
            return {
                "type": "map",
                "keyType": key,
                "valueType": value_type,
                "valueContainsNull": True,
            }
        if word == "struct":
            self.expect("<")
            if self.peek()[1] == ">":
                self.take()
                return {"type": "struct", "fields": []}
            return self.columns(">", depth)
        self.i -= 1
        raise self.error(f"unknown type {value!r}")

    def number(self) -> int:
        kind, value = self.take()
        if kind != "int":
            self.i -= 1
            raise self.error("expected a number")
        return int(value)


def parse_ddl(text: str, *, what: str = "value schema") -> Any:
    """Spark JSON of a DDL column list (``"a INT NOT NULL, b ARRAY<STRING>"``)."""
    if not text.strip():
        raise SchemaError(f"{what}: the DDL string is empty")
    parser = _Ddl(text, what)
    if len(parser.tokens) > 100_000:
        raise SchemaError(f"{what}: the DDL string is too long")
    return parser.columns(None, 0)


def to_ddl(declared: Any) -> str:
    """The DDL form of a declared struct (the form the CLI prints)."""
    parts = []
    for f in declared["fields"]:
        text = f"{_quote(f['name'])} {_ddl_type(f['type'])}"
        if not f.get("nullable", True):
            text += " NOT NULL"
        parts.append(text)
    return ", ".join(parts)


# The DDL name printed for each JSON primitive name.
_DDL_NAMES = {
    "boolean": "BOOLEAN",
    "byte": "TINYINT",
    "short": "SMALLINT",
    "integer": "INT",
    "long": "BIGINT",
    "float": "FLOAT",
    "double": "DOUBLE",
    "string": "STRING",
    "binary": "BINARY",
    "date": "DATE",
    "timestamp": "TIMESTAMP",
    "timestamp_ntz": "TIMESTAMP_NTZ",
}


def _ddl_type(t: Any) -> str:
    if isinstance(t, str):
        return _DDL_NAMES.get(t, t.upper())
    if t["type"] == "array":
        return f"ARRAY<{_ddl_type(t['elementType'])}>"
    if t["type"] == "map":
        return f"MAP<{_ddl_type(t['keyType'])}, {_ddl_type(t['valueType'])}>"
    inner = ", ".join(
        f"{_quote(f['name'])}: {_ddl_type(f['type'])}"
        + ("" if f.get("nullable", True) else " NOT NULL")
        for f in t["fields"]
    )
    return f"STRUCT<{inner}>"


# -- a topic's schema ----------------------------------------------------------------------------


@dataclass(frozen=True)
class TopicSchema:
    """One version of a typed topic's schema (an entry of ``metaData.schemas``)."""

    id: int
    value: pa.StructType  # storage type: every field nullable
    value_declared: dict[str, Any]  # Spark JSON, with the declared nullabilities
    value_nulls: dict[str, Any]
    key: pa.DataType | None  # None: binary keys (an untyped key)
    key_declared: str | None
    created_ms: int

    @classmethod
    def from_entry(cls, entry: Mapping[str, Any], where: str) -> TopicSchema:
        if not isinstance(entry, Mapping):
            raise SchemaError(f"{where}: a schema entry must be an object")
        sid = entry.get("id")
        created = entry.get("createdTime", 0)
        if not is_int(sid) or sid < 1:
            raise SchemaError(f"{where}: schema id {sid!r} is not a positive integer")
        if not is_int(created):
            raise SchemaError(f"{where}: createdTime {created!r} is not an integer")
        value, nulls = from_json(entry.get("value"), f"{where} value")
        if not pa.types.is_struct(value):
            raise SchemaError(f"{where}: the value schema must be a struct, got {type_name(value)}")
        if value.num_fields == 0:
            raise SchemaError(f"{where}: the value schema has no field")
        key_declared = entry.get("key")
        key: pa.DataType | None = None
        if key_declared is not None:
            if key_declared not in KEY_TYPES:
                raise SchemaError(
                    f"{where}: key type {key_declared!r} is not one of {', '.join(KEY_TYPES)}"
                )
            key = PRIMITIVES[key_declared]
        return cls(sid, value, dict(entry["value"]), nulls, key, key_declared, created)

    def entry(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "createdTime": self.created_ms,
            "key": self.key_declared,
            "value": self.value_declared,
        }

    @property
    def key_type(self) -> pa.DataType:
        return self.key if self.key is not None else pa.binary()

    def ddl(self) -> str:
        return to_ddl(self.value_declared)

    def field_names(self) -> list[str]:
        return [f.name for f in self.value]


def new_schema_entry(value: Any, key: Any, schema_id: int, created_ms: int) -> dict[str, Any]:
    """A validated ``metaData.schemas`` entry from a user's declaration."""
    declared = declare(value, what="value schema")
    if not isinstance(declared, Mapping) or declared.get("type") != "struct":
        raise SchemaError("value schema: must be a struct (a list of fields), not a single type")
    key_declared: str | None = None
    if key is not None:
        k = declare(key, what="key schema")
        if isinstance(k, Mapping) and k.get("type") == "struct" and len(k.get("fields", ())) == 1:
            k = k["fields"][0]["type"]  # "id BIGINT" names the key's one column
        if k not in KEY_TYPES:
            raise SchemaError(
                f"key schema: a typed key must be one of {', '.join(KEY_TYPES)} (hashed as Kafka's "
                f"serializer of that type would), got {json.dumps(k)[:100]}"
            )
        key_declared = str(k)
    entry = {"id": schema_id, "createdTime": created_ms, "key": key_declared, "value": declared}
    parsed = TopicSchema.from_entry(entry, "schema")
    return parsed.entry()


def read_history(entries: Any, where: str) -> tuple[TopicSchema, ...]:
    if not isinstance(entries, list) or not entries:
        raise SchemaError(f"{where}: 'schemas' must be a non-empty list")
    history = tuple(TopicSchema.from_entry(e, f"{where} schema {i}") for i, e in enumerate(entries))
    ids = [s.id for s in history]
    if ids != sorted(set(ids)):
        raise SchemaError(f"{where}: schema ids {ids} are not strictly increasing")
    return history


# -- evolution ----------------------------------------------------------------------------------


def check_evolution(old: TopicSchema, new: TopicSchema) -> None:
    """Refuse (IncompatibleSchemaError naming the field) a change old readers' data or new
    readers' assumptions cannot survive. Allowed: adding a nullable field (anywhere, including
    inside nested structs), widening a number, relaxing NOT NULL. Refused: removing or renaming
    a field, narrowing or changing a type, making a field NOT NULL, changing the key type."""
    if old.key_declared != new.key_declared:
        raise IncompatibleSchemaError(
            f"the key type cannot change ({old.key_declared or 'binary'} -> "
            f"{new.key_declared or 'binary'}): records would hash to other partitions"
        )
    _evolve(old.value, old.value_nulls, new.value, new.value_nulls, "value")


def _evolve(
    old: pa.DataType,
    old_nulls: Mapping[str, Any],
    new: pa.DataType,
    new_nulls: Mapping[str, Any],
    path: str,
) -> None:
    if pa.types.is_struct(old) and pa.types.is_struct(new):
        new_names = {f.name: f for f in new}
        for f in old:
            if f.name not in new_names:
                casefold = [n for n in new_names if n.casefold() == f.name.casefold()]
                hint = f" (renamed to {casefold[0]!r}? renaming is refused too)" if casefold else ""
                raise IncompatibleSchemaError(
                    f"field {_field_path(path, f.name)!r} was removed{hint}: removing a field is "
                    "refused (old records still hold it; declare it nullable and stop writing it)"
                )
            was_nullable, old_children = old_nulls.get(f.name, (True, {}))
            is_nullable, new_children = new_nulls.get(f.name, (True, {}))
            if was_nullable and not is_nullable:
                raise IncompatibleSchemaError(
                    f"field {_field_path(path, f.name)!r} cannot become NOT NULL: older records "
                    "may hold nulls"
                )
            _evolve(
                f.type,
                old_children,
                new_names[f.name].type,
                new_children,
                _field_path(path, f.name),
            )
        old_names = {f.name for f in old}
        for f in new:
            if f.name not in old_names and not new_nulls.get(f.name, (True, {}))[0]:
                raise IncompatibleSchemaError(
                    f"new field {_field_path(path, f.name)!r} must be nullable: records written "
                    "before it existed have no value for it"
                )
        return
    if pa.types.is_list(old) and pa.types.is_list(new):
        was, old_children = old_nulls.get("[]", (True, {}))
        now, new_children = new_nulls.get("[]", (True, {}))
        if was and not now:
            raise IncompatibleSchemaError(f"elements of {path!r} cannot become NOT NULL")
        _evolve(old.value_type, old_children, new.value_type, new_children, f"{path}[]")
        return
    if pa.types.is_map(old) and pa.types.is_map(new):
        if old.key_type != new.key_type:
            raise IncompatibleSchemaError(
                f"map keys of {path!r} cannot change type ({type_name(old.key_type)} -> "
                f"{type_name(new.key_type)})"
            )
        was, old_children = old_nulls.get("{}", (True, {}))
        now, new_children = new_nulls.get("{}", (True, {}))
        if was and not now:
            raise IncompatibleSchemaError(f"values of map {path!r} cannot become NOT NULL")
        _evolve(old.item_type, old_children, new.item_type, new_children, f"{path}{{}}")
        return
    if old == new or _widens(old, new):
        return
    raise IncompatibleSchemaError(
        f"field {path!r} cannot change from {type_name(old)} to {type_name(new)}: only widening "
        "numbers (byte->short->integer->long, byte/short/integer/float->double, a wider "
        "decimal) is allowed"
    )


def _widens(old: pa.DataType, new: pa.DataType) -> bool:
    if pa.types.is_decimal(old) and pa.types.is_decimal(new):
        return bool(
            new.scale >= old.scale and new.precision - new.scale >= old.precision - old.scale
        )
    try:
        return (type_name(old), type_name(new)) in _WIDENINGS
    except SchemaError:
        return False


# -- reading data written under an older schema --------------------------------------------------


def project(array: Any, to: pa.DataType, path: str = "value") -> Any:
    """``array`` (written under another schema version of the topic) as the type ``to``:
    fields are matched by name; fields it lacks are null; fields ``to`` lacks (written by a
    newer schema than the reader knows) are left out; widened numbers are cast. Anything else
    raises IncompatibleSchemaError naming the field."""
    source = array.type
    if source == to:
        return array
    if isinstance(array, pa.ChunkedArray):
        return pa.chunked_array([project(c, to, path) for c in array.chunks], type=to)
    mask = pc.is_null(array) if array.null_count else None
    if pa.types.is_struct(to) and pa.types.is_struct(source):
        names = {f.name: i for i, f in enumerate(source)}
        children = [
            project(array.field(names[f.name]), f.type, _field_path(path, f.name))
            if f.name in names
            else pa.nulls(len(array), f.type)
            for f in to
        ]
        return pa.StructArray.from_arrays(children, fields=list(to), mask=mask)
    if pa.types.is_list(to) and pa.types.is_list(source):
        offsets, start, length = _rebased(array)
        values = project(array.values.slice(start, length), to.value_type, f"{path}[]")
        return pa.ListArray.from_arrays(offsets, values, type=to, mask=mask)
    if pa.types.is_map(to) and pa.types.is_map(source) and to.key_type == source.key_type:
        offsets, start, length = _rebased(array)
        items = project(array.items.slice(start, length), to.item_type, f"{path}{{}}")
        keys = array.keys.slice(start, length)
        return pa.MapArray.from_arrays(offsets, keys, items, type=to, mask=mask)
    if _widens(source, to):
        return array.cast(to)
    raise IncompatibleSchemaError(
        f"field {path!r} is stored as {_safe_name(source)} but read as {_safe_name(to)}: the "
        "data was written with a schema this reader does not know (reload the topic)"
    )


def _rebased(array: Any) -> tuple[pa.Array, int, int]:
    """A list or map array's offsets starting at 0, and the slice of its children they index
    (a sliced array's children are not sliced)."""
    offsets = array.offsets
    start = offsets[0].as_py()
    length = offsets[-1].as_py() - start
    return pc.subtract(offsets, pa.scalar(start, offsets.type)), start, length


def _safe_name(t: pa.DataType) -> str:
    try:
        return type_name(t)
    except SchemaError:
        return str(t)


# -- validating Python values -------------------------------------------------------------------

Validator = Callable[[Any, str], tuple[Any, int]]  # (value, path) -> (normalized, size)


def _fail(path: str, expected: str, value: Any) -> InvalidRecordError:
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return InvalidRecordError(
        f"field {path!r}: expected {expected}, got {type(value).__name__} {shown}"
    )


def _int_validator(bits: int, name: str) -> Validator:
    low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    size = bits // 8

    def check(v: Any, path: str) -> tuple[Any, int]:
        if v.__class__ is not int:
            if isinstance(v, bool) or not hasattr(v, "__index__"):
                raise _fail(path, name, v)
            v = v.__index__()
        if not low <= v <= high:
            raise InvalidRecordError(
                f"field {path!r}: {v} is out of range for {name} [{low}, {high}]"
            )
        return v, size

    return check


def _float_validator(name: str, size: int) -> Validator:
    def check(v: Any, path: str) -> tuple[Any, int]:
        if v.__class__ is float:
            return v, size
        if isinstance(v, bool) or (not isinstance(v, int | float) and not hasattr(v, "__float__")):
            raise _fail(path, name, v)
        return float(v), size

    return check


def _check_string(v: Any, path: str) -> tuple[Any, int]:
    if v.__class__ is not str and not isinstance(v, str):
        raise _fail(path, "string", v)
    return v, len(v) if v.isascii() else len(v.encode("utf-8", "surrogatepass"))


def _check_binary(v: Any, path: str) -> tuple[Any, int]:
    if v.__class__ is bytes:
        return v, len(v)
    if isinstance(v, bytearray | memoryview):
        return bytes(v), len(v)
    raise _fail(path, "binary (bytes)", v)


def _check_bool(v: Any, path: str) -> tuple[Any, int]:
    if v is True or v is False:
        return v, 1
    raise _fail(path, "boolean", v)


def _check_date(v: Any, path: str) -> tuple[Any, int]:
    if isinstance(v, dt.date) and not isinstance(v, dt.datetime):
        return v, 4
    raise _fail(path, "date (datetime.date)", v)


def _check_timestamp(v: Any, path: str) -> tuple[Any, int]:
    if isinstance(v, dt.datetime):
        if v.tzinfo is None or v.utcoffset() is None:
            raise InvalidRecordError(
                f"field {path!r}: a timestamp is an instant and needs a timezone-aware datetime "
                "(declare the field timestamp_ntz for wall-clock times)"
            )
        return v, 8
    raise _fail(path, "timestamp (an aware datetime.datetime)", v)


def _check_timestamp_ntz(v: Any, path: str) -> tuple[Any, int]:
    if isinstance(v, dt.datetime):
        if v.tzinfo is not None:
            raise InvalidRecordError(
                f"field {path!r}: timestamp_ntz holds wall-clock times; got an aware datetime "
                "(declare the field timestamp for instants)"
            )
        return v, 8
    raise _fail(path, "timestamp_ntz (a naive datetime.datetime)", v)


def _decimal_validator(precision: int, scale: int) -> Validator:
    name = f"decimal({precision},{scale})"

    def check(v: Any, path: str) -> tuple[Any, int]:
        if isinstance(v, bool) or not isinstance(v, decimal.Decimal | int):
            raise _fail(path, f"{name} (decimal.Decimal or int)", v)
        d = decimal.Decimal(v)
        if not d.is_finite():
            raise InvalidRecordError(f"field {path!r}: {d} is not a finite number")
        _, digits, exponent = d.as_tuple()
        assert isinstance(exponent, int)
        if -exponent > scale and d != d.quantize(decimal.Decimal(1).scaleb(-scale)):
            raise InvalidRecordError(
                f"field {path!r}: {d} has more than {scale} decimal places ({name})"
            )
        integer_digits = len(digits) + exponent if d != 0 else 0
        if integer_digits > precision - scale:
            raise InvalidRecordError(f"field {path!r}: {d} does not fit {name}")
        return d, 16

    return check


def validator(t: pa.DataType, nulls: Mapping[str, Any] | None = None) -> Validator:
    """A function checking and normalizing a Python value for storage type ``t``."""
    nulls = nulls or {}
    if pa.types.is_struct(t):
        return _struct_validator(t, nulls)
    if pa.types.is_list(t):
        contains_null, children = nulls.get("[]", (True, {}))
        element = validator(t.value_type, children)

        def check_list(v: Any, path: str) -> tuple[Any, int]:
            if not isinstance(v, list | tuple):
                raise _fail(path, f"array ({type_name(t)}) as a list", v)
            out: list[Any] = []
            total = 4
            for i, item in enumerate(v):
                if item is None:
                    if not contains_null:
                        raise InvalidRecordError(
                            f"field '{path}[{i}]': null in an array declared NOT NULL"
                        )
                    out.append(None)
                    continue
                normalized, size = element(item, f"{path}[{i}]")
                out.append(normalized)
                total += size
            return out, total

        return check_list
    if pa.types.is_map(t):
        contains_null, children = nulls.get("{}", (True, {}))
        key_check = validator(t.key_type)
        value_check = validator(t.item_type, children)

        def check_map(v: Any, path: str) -> tuple[Any, int]:
            if not isinstance(v, Mapping):
                raise _fail(path, f"map ({type_name(t)}) as a dict", v)
            out = []
            total = 4
            for k, item in v.items():
                if k is None:
                    raise InvalidRecordError(f"field {path!r}: map keys cannot be null")
                nk, ks = key_check(k, f"{path}{{key}}")
                if item is None:
                    if not contains_null:
                        raise InvalidRecordError(
                            f"field '{path}[{k!r}]': null in a map declared NOT NULL"
                        )
                    out.append((nk, None))
                    total += ks
                    continue
                nv, vs = value_check(item, f"{path}[{k!r}]")
                out.append((nk, nv))
                total += ks + vs
            return out, total

        return check_map
    if pa.types.is_decimal(t):
        return _decimal_validator(t.precision, t.scale)
    return _PRIMITIVE_VALIDATORS[type_name(t)]


_PRIMITIVE_VALIDATORS: dict[str, Validator] = {
    "boolean": _check_bool,
    "byte": _int_validator(8, "byte"),
    "short": _int_validator(16, "short"),
    "integer": _int_validator(32, "integer"),
    "long": _int_validator(64, "long"),
    "float": _float_validator("float", 4),
    "double": _float_validator("double", 8),
    "string": _check_string,
    "binary": _check_binary,
    "date": _check_date,
    "timestamp": _check_timestamp,
    "timestamp_ntz": _check_timestamp_ntz,
}


def as_mapping(v: Any, path: str) -> Mapping[str, Any]:
    """A record value as a mapping of field names: a dict, a dataclass, a pydantic model or a
    named tuple."""
    if isinstance(v, Mapping):
        return v
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {f.name: getattr(v, f.name) for f in dataclasses.fields(v)}
    dump = getattr(v, "model_dump", None)
    if callable(dump) and not isinstance(v, type):
        result = dump()
        if isinstance(result, Mapping):
            return result
    as_dict = getattr(v, "_asdict", None)
    if isinstance(v, tuple) and callable(as_dict):
        return as_dict()  # type: ignore[no-any-return]
    raise _fail(path or "value", "a dict, dataclass, pydantic model or named tuple", v)


def _struct_validator(t: pa.StructType, nulls: Mapping[str, Any]) -> Validator:
    fields = []
    for f in t:
        nullable, children = nulls.get(f.name, (True, {}))
        fields.append((f.name, nullable, validator(f.type, children)))
    names = frozenset(f.name for f in t)

    def check_struct(v: Any, path: str) -> tuple[Any, int]:
        m = v if v.__class__ is dict else as_mapping(v, path)
        if len(m) > len(names) or not names.issuperset(m):
            unknown = sorted(str(k) for k in m if k not in names)
            if unknown:
                where = f" of {path!r}" if path else ""
                raise InvalidRecordError(
                    f"unknown field {_field_path(path, unknown[0])!r}{where}: the schema has "
                    f"{', '.join(sorted(names))}"
                )
        out: dict[str, Any] = {}
        total = 0
        get = m.get
        for name, nullable, check in fields:
            item = get(name)
            if item is None:
                if not nullable:
                    raise InvalidRecordError(
                        f"field {_field_path(path, name)!r} is required (declared NOT NULL) but "
                        "is missing or None"
                    )
                out[name] = None
                continue
            out[name], size = check(item, _field_path(path, name))
            total += size
        return out, total

    return check_struct


def cast_column(column: Any, to: pa.DataType, what: str) -> Any:
    """``column`` converted to ``to`` safely (an overflow or lost digit is an error)."""
    if column.type == to:
        return column
    try:
        return pc.cast(column, to, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise InvalidRecordError(
            f"{what} has type {column.type}, which does not convert to {_safe_name(to)}: {exc}"
        ) from None


def conform_values(value: Any, schema: TopicSchema, what: str) -> pa.Array:
    """A struct column of values (fields matched by name, in any order, a subset allowed when
    the rest are nullable) as the schema's storage type; a null row is a tombstone. Raises
    InvalidRecordError naming the field: unknown, unconvertible, or NOT NULL but null."""
    if isinstance(value, pa.ChunkedArray):
        value = value.combine_chunks()
    if not pa.types.is_struct(value.type):
        raise InvalidRecordError(
            f"{what}: the topic is typed; 'value' must be a struct of {schema.ddl()}, got "
            f"{value.type}"
        )
    present = {f.name: i for i, f in enumerate(value.type)}
    unknown = sorted(set(present) - set(schema.field_names()))
    if unknown:
        raise InvalidRecordError(
            f"{what}: unknown field 'value.{unknown[0]}'; the schema is {schema.ddl()}"
        )
    rows = len(value)
    parent_null = pc.is_null(value) if value.null_count else None
    children = []
    for declared in schema.value:
        nulls = schema.value_nulls.get(declared.name, (True, {}))
        path = f"value.{declared.name}"
        if declared.name in present:
            child = value.field(present[declared.name])
            if parent_null is not None:  # a tombstone's fields are null, whatever was there
                child = pc.if_else(parent_null, pa.nulls(rows, child.type), child)
            child = cast_column(child, declared.type, f"{what}: field {path!r}")
        elif nulls[0]:
            child = pa.nulls(rows, declared.type)
        else:
            raise InvalidRecordError(
                f"{what}: field {path!r} is required (declared NOT NULL) and has no column"
            )
        _check_required(child, nulls, path, parent_null, what)
        children.append(child)
    return pa.StructArray.from_arrays(children, fields=list(schema.value), mask=parent_null)


def _check_required(
    array: Any, declared: tuple[bool, Any], path: str, parent_null: Any, what: str
) -> None:
    """NOT NULL fields hold no null where their parent is not null."""
    nullable, children = declared
    if not nullable and array.null_count:
        nulls = pc.is_null(array)
        if parent_null is not None:
            nulls = pc.and_(nulls, pc.invert(parent_null))
        if pc.any(nulls).as_py():
            row = pc.index(nulls, True).as_py()
            raise InvalidRecordError(
                f"{what}: field {path!r} is declared NOT NULL but row {row} is null"
            )
    if pa.types.is_struct(array.type):
        own = pc.is_null(array) if array.null_count else None
        if own is not None and parent_null is not None:
            own = pc.or_(own, parent_null)
        elif own is None:
            own = parent_null
        for i, f in enumerate(array.type):
            _check_required(
                array.field(i), children.get(f.name, (True, {})), f"{path}.{f.name}", own, what
            )


def record_sizes(key: Any, value: Any) -> Any:
    """Each record's key plus value size in bytes (a numpy int64 array): string and binary
    lengths plus fixed widths, summed through structs, arrays and maps row by row (the size a
    typed record is held to against ``max.message.bytes``)."""
    import numpy as np

    total = np.zeros(len(value), np.int64)
    for column in (key, value):
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        total += _row_sizes(column)
    return total


def _row_sizes(array: Any) -> Any:
    import numpy as np

    rows = len(array)
    t = array.type
    valid = (
        pc.is_valid(array).to_numpy(zero_copy_only=False).astype(np.int64)
        if array.null_count
        else np.ones(rows, np.int64)
    )
    if pa.types.is_null(t):
        return np.zeros(rows, np.int64)
    if pa.types.is_binary(t) or pa.types.is_string(t):
        raw = pc.binary_length(array).to_numpy(zero_copy_only=False)
        return np.nan_to_num(raw.astype(np.float64), nan=0).astype(np.int64)
    if pa.types.is_struct(t):
        sizes = np.zeros(rows, np.int64)
        for i in range(t.num_fields):
            sizes += _row_sizes(pc.struct_field(array, [i]))
        return sizes * valid
    if pa.types.is_map(t):  # as the list of its key-value entries
        array = pa.ListArray.from_arrays(
            array.offsets, pa.StructArray.from_arrays([array.keys, array.items], ["k", "v"])
        )
    if pa.types.is_list(t) or pa.types.is_map(t):
        flat = pc.list_flatten(array)
        parents = pc.list_parent_indices(array).to_numpy(zero_copy_only=False)
        element = _row_sizes(flat)
        return np.bincount(parents, weights=element, minlength=rows).astype(np.int64) + 4 * valid
    return max(t.bit_width // 8, 1) * valid


def key_bytes(keys: pa.Array | pa.ChunkedArray, key_type: str | None) -> pa.Array:
    """Typed keys as the bytes the partitioner hashes: Kafka's serializer of that type
    (UTF-8 for strings, big-endian for numbers), so placement matches a Kafka client's."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    if key_type is None or key_type == "binary":
        return keys
    if key_type == "string":
        return keys.cast(pa.binary())
    width = {"long": ">i8", "integer": ">i4", "short": ">i2", "double": ">f8", "float": ">f4"}[
        key_type
    ]
    filled = keys.fill_null(0) if keys.null_count else keys
    raw = filled.to_numpy(zero_copy_only=False).astype(width)
    size = raw.dtype.itemsize
    fixed = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(size), len(keys), [None, pa.py_buffer(raw.tobytes())]
    )
    out = fixed.cast(pa.binary())
    if keys.null_count:
        out = pc.if_else(pc.is_null(keys), pa.nulls(len(keys), pa.binary()), out)
    return out


def describe(history: Sequence[TopicSchema]) -> list[dict[str, Any]]:
    """The history for display: id, time, key type and the DDL of each version."""
    return [
        {
            "id": s.id,
            "createdTime": s.created_ms,
            "key": s.key_declared or "binary",
            "value": s.ddl(),
        }
        for s in history
    ]
