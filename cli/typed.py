"""Typed topics on the console: JSON in (``kstore produce``), JSON out (``kstore consume``).

A typed topic's value is one JSON object per record, converted field by field to what the
schema declares: dates and timestamps as ISO 8601 strings, decimals as strings or numbers
(read exactly, never through a float), binary as base64 strings, maps as JSON objects. The
producer then validates the result and names the field that is wrong. Printing does the
reverse, so ``kstore consume -o json`` output produces back unchanged.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import decimal
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

    from kstore.schema import TopicSchema


class TypedInputError(ValueError):
    """A JSON value that cannot be converted to the declared type (names the field)."""


def loads(text: str | bytes) -> Any:
    """JSON with exact decimals: numbers with a fraction or exponent become Decimal."""
    return json.loads(text, parse_float=decimal.Decimal)


def _where(path: str) -> str:
    return f"field {path!r}" if path else "the value"


class TypedInput:
    """Converts console input to the Python values a typed topic's producer accepts."""

    def __init__(self, schema: TopicSchema) -> None:
        self.schema = schema
        self.key_type: str | None = schema.key_declared

    # -- values --

    def value_from_text(self, data: bytes) -> Any:
        try:
            obj = loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise TypedInputError(
                f"the topic is typed ({self.schema.ddl()}): the value must be a JSON object ({exc})"
            ) from None
        return self.value_from_json(obj)

    def value_from_json(self, obj: Any) -> Any:
        if obj is None:
            return None
        if not isinstance(obj, Mapping):
            raise TypedInputError(
                f"the topic is typed: the value must be a JSON object with the fields "
                f"{', '.join(self.schema.field_names())}, got {type(obj).__name__}"
            )
        return convert(obj, self.schema.value, "")

    # -- keys --

    def key_from_text(self, data: bytes) -> Any:
        if self.key_type is None or self.key_type == "binary":
            return data
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise TypedInputError(f"the key must be UTF-8 text ({self.key_type})") from None
        if self.key_type == "string":
            return text
        return self._number_key(text.strip())

    def key_from_json(self, obj: Any, encoding: Any) -> Any:
        if obj is None:
            return None
        if self.key_type == "binary":
            if not isinstance(obj, str):
                raise TypedInputError("the key (binary) must be a string")
            if encoding == "base64":
                return _base64(obj, "the key")
            return obj.encode("utf-8")
        if encoding is not None:
            raise TypedInputError(f"key_encoding does not apply to {self.key_type} keys")
        if self.key_type == "string":
            if not isinstance(obj, str):
                raise TypedInputError(f"the key must be a JSON string, got {json.dumps(obj)}")
            return obj
        if isinstance(obj, bool) or not isinstance(obj, int | decimal.Decimal | str):
            raise TypedInputError(f"the key must be a number ({self.key_type}), got {obj!r}")
        return self._number_key(str(obj))

    def _number_key(self, text: str) -> Any:
        assert self.key_type is not None
        try:
            if self.key_type in ("double", "float"):
                return float(text)
            return int(text)
        except ValueError:
            raise TypedInputError(f"the key {text!r} is not a {self.key_type}") from None


def _base64(text: str, where: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise TypedInputError(
            f"{where} is not valid base64 (binary is written in base64)"
        ) from None


def convert(obj: Any, t: pa.DataType, path: str) -> Any:
    """A JSON value as the Python value of Arrow type ``t``. Values that do not convert are
    passed on unchanged, so that the producer's validation names the field and the type."""
    import pyarrow as pa

    if obj is None:
        return None
    if pa.types.is_struct(t):
        if not isinstance(obj, Mapping):
            return obj
        known = {f.name: f.type for f in t}
        return {
            k: convert(v, known[k], f"{path}.{k}" if path else k) if k in known else v
            for k, v in obj.items()
        }
    if pa.types.is_map(t):
        if not isinstance(obj, Mapping):
            return obj
        return {
            convert_key(k, t.key_type, path): convert(v, t.item_type, f"{path}[{k!r}]")
            for k, v in obj.items()
        }
    if pa.types.is_list(t):
        if not isinstance(obj, list):
            return obj
        return [convert(v, t.value_type, f"{path}[{i}]") for i, v in enumerate(obj)]
    if pa.types.is_decimal(t):
        if isinstance(obj, str):
            try:
                return decimal.Decimal(obj.strip())
            except decimal.InvalidOperation:
                raise TypedInputError(f"{_where(path)}: {obj!r} is not a decimal number") from None
        return obj
    if pa.types.is_floating(t):
        return float(obj) if isinstance(obj, decimal.Decimal) else obj
    if pa.types.is_integer(t):
        if isinstance(obj, decimal.Decimal) and obj == obj.to_integral_value():
            return int(obj)
        return obj
    if pa.types.is_binary(t):
        return _base64(obj, _where(path)) if isinstance(obj, str) else obj
    if pa.types.is_date32(t):
        if isinstance(obj, str):
            try:
                return dt.date.fromisoformat(obj.strip())
            except ValueError:
                raise TypedInputError(
                    f"{_where(path)}: {obj!r} is not an ISO 8601 date (YYYY-MM-DD)"
                ) from None
        return obj
    if pa.types.is_timestamp(t):
        if isinstance(obj, str):
            try:
                return dt.datetime.fromisoformat(obj.strip())
            except ValueError:
                raise TypedInputError(
                    f"{_where(path)}: {obj!r} is not an ISO 8601 date-time"
                ) from None
        return obj
    return obj


def convert_key(obj: str, t: pa.DataType, path: str) -> Any:
    """A map key: JSON object keys are strings; numeric map keys are written as numbers."""
    import pyarrow as pa

    if pa.types.is_integer(t):
        try:
            return int(obj)
        except ValueError:
            raise TypedInputError(f"{_where(path)}: map key {obj!r} is not an integer") from None
    if pa.types.is_floating(t):
        try:
            return float(obj)
        except ValueError:
            raise TypedInputError(f"{_where(path)}: map key {obj!r} is not a number") from None
    return convert(obj, t, path)


def to_json(value: Any) -> Any:
    """A typed value (as the consumer returns it) as JSON: ISO dates and times, decimals as
    strings (exact), binary as base64, map keys as strings."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return (
            value if value == value and value not in (float("inf"), float("-inf")) else str(value)
        )
    if isinstance(value, Mapping):
        return {str(to_json(k)): to_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    return str(value)


def dumps(value: Any) -> str:
    return json.dumps(to_json(value), ensure_ascii=False, separators=(",", ":"))
