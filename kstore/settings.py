"""One typed model for settings: a declared `Setting` per key, typed validators, and groups.

A validator turns a value given by a user (a Python value, or the string a CLI or Spark
option carries) into its canonical type, or says what is wrong with it by raising
`BadSettingError`. A `Settings` group turns that problem into its own `KStoreError` subclass,
prefixed with the key as the group names it ("config 'retention.ms': ..."), and never shows
the value of a secret.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

from kstore.errors import InvalidConfigurationError, KStoreError

INT64_MAX = 9_223_372_036_854_775_807


class BadSettingError(Exception):
    """What is wrong with a value (raised by validators, never out of a `Settings` group)."""


Validator = Callable[[Any], Any]


def is_int(value: object) -> TypeGuard[int]:
    """An integer, and not a bool (``True`` is an ``int`` to Python, never to a setting)."""
    return isinstance(value, int) and not isinstance(value, bool)


# -- validators -----------------------------------------------------------------------------------


def integer(
    minimum: int = 0,
    maximum: int = INT64_MAX,
    *,
    allow_minus_one: bool = False,
    strings: bool = True,
) -> Validator:
    """An integer in [minimum, maximum] (``-1`` too when it means unlimited); a string of
    digits is accepted when ``strings``."""

    def parse(value: Any) -> int:
        if isinstance(value, bool):
            raise BadSettingError("expected an integer, got a boolean")
        if isinstance(value, str) and strings:
            try:
                value = int(value.strip())
            except ValueError:
                raise BadSettingError(f"expected an integer, got {value!r}") from None
        if not isinstance(value, int):
            raise BadSettingError(f"expected an integer, got {type(value).__name__}")
        if allow_minus_one and value == -1:
            return value
        if not minimum <= value <= maximum:
            extra = " (or -1 for unlimited)" if allow_minus_one else ""
            raise BadSettingError(f"{value} is out of range [{minimum}, {maximum}]{extra}")
        return value

    return parse


def whole(minimum: int = 0) -> Validator:
    """A Python ``int`` of at least ``minimum``, as a client's keyword argument is given (no
    strings, no booleans, no floats)."""
    wanted = "a non-negative integer" if minimum == 0 else f"an integer >= {minimum}"

    def parse(value: Any) -> int:
        if not is_int(value) or value < minimum:
            raise BadSettingError(f"must be {wanted}, got {value!r}")
        return value

    return parse


def optional(validator: Validator) -> Validator:
    """``None`` (the setting left to its default behaviour), or a value ``validator`` takes."""

    def parse(value: Any) -> Any:
        return None if value is None else validator(value)

    return parse


def as_given(value: Any) -> Any:
    """Any value, kept as given: one checked where it is used (a store's storage options)."""
    return value


def a_callable(value: Any) -> Any:
    """A function (a serializer, a deserializer)."""
    if not callable(value):
        raise BadSettingError(f"must be callable, got {type(value).__name__}")
    return value


def at_least(floor: int) -> Validator:
    """A lenient reader: a non-negative integer, one below ``floor`` read as ``floor``."""
    lenient = integer(0)

    def read(value: Any) -> int:
        number: int = lenient(value)
        return max(number, floor)

    return read


def ratio(value: Any) -> float:
    """A number from 0 to 1."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise BadSettingError(f"expected a number, got {value!r}") from None
    if isinstance(value, bool) or not 0.0 <= number <= 1.0:
        raise BadSettingError(f"{value!r} is out of range [0, 1]")
    return number


def choice(
    choices: tuple[str, ...],
    aliases: Mapping[str, str] | None = None,
    *,
    lower: bool = False,
) -> Validator:
    """One of ``choices`` (an alias stands for its choice); ``lower``: case-insensitive."""

    def parse(value: Any) -> str:
        if not isinstance(value, str):
            raise BadSettingError(f"expected a string, got {type(value).__name__}")
        text = value.strip().lower() if lower else value.strip()
        text = (aliases or {}).get(text, text)
        if text not in choices:
            raise BadSettingError(f"{value!r} is not one of {', '.join(choices)}")
        return text

    return parse


def boolean_text(value: Any) -> bool:
    """``true`` or ``false`` in any case, as Spark and the CLI hand them over as strings."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text == "true":
        return True
    if text == "false":
        return False
    raise BadSettingError(f"expected true or false, got {value!r}")


_AMOUNT = re.compile(r"\s*(\d+)\s*([a-z]*)\s*")
DURATION_UNITS_MS = {
    "": 1.0,
    "us": 0.001,
    "ms": 1.0,
    "s": 1000.0,
    "sec": 1000.0,
    "m": 60_000.0,
    "min": 60_000.0,
    "h": 3_600_000.0,
    "d": 86_400_000.0,
}


def duration_ms(value: Any) -> int:
    """Spark's time strings (``Utils.timeStringAsMs``): ``15m``, ``10s``, ``500ms``, ``100``."""
    match = _AMOUNT.fullmatch(str(value).lower())
    if match is None or match.group(2) not in DURATION_UNITS_MS:
        raise BadSettingError(f"expected a duration such as '15m', '30s' or '500ms', got {value!r}")
    return int(int(match.group(1)) * DURATION_UNITS_MS[match.group(2)])


MAX_BYTES = INT64_MAX  # the largest size: a signed 64-bit length
SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kb": 1 << 10,
    "m": 1 << 20,
    "mb": 1 << 20,
    "g": 1 << 30,
    "gb": 1 << 30,
    "t": 1 << 40,
    "tb": 1 << 40,
}


def size_bytes(value: Any) -> int:
    """A positive byte size as Spark writes them: ``1048576``, ``512k``, ``64m``, ``1g``."""
    text = str(value)
    match = _AMOUNT.fullmatch(text.lower())
    if isinstance(value, bool) or match is None or match.group(2) not in SIZE_UNITS:
        raise BadSettingError(f"expected a size such as '1048576', '512k' or '64m', got {value!r}")
    digits = match.group(1).lstrip("0") or "0"
    # The digit count is checked first so that a huge literal never reaches int().
    number = int(digits) * SIZE_UNITS[match.group(2)] if len(digits) <= 20 else MAX_BYTES + 1
    if number <= 0:
        raise BadSettingError("must be positive")
    if number > MAX_BYTES:
        raise BadSettingError(
            f"{text.strip()!r} is too large; the limit is {MAX_BYTES} bytes (2**63 - 1)"
        )
    return number


# -- settings and groups --------------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    """One key: its default, how a given value is validated, and what it means."""

    name: str
    default: Any
    parse: Validator
    doc: str
    # How a stored value is read, when more leniently than a new value is validated.
    read: Validator | None = None
    # Kafka's name for it, where it differs from ``name``.
    kafka_name: str | None = None
    # A credential: its value never appears in a message.
    secret: bool = False


class Settings(Mapping[str, Setting]):
    """A group of declared settings, with one entry point that validates values by key.

    ``label`` formats how a message names a key; ``error`` is the group's error class.
    """

    def __init__(
        self,
        kind: str,
        settings: Iterable[Setting],
        *,
        label: Callable[[str], str] = lambda name: f"config {name!r}",
        error: type[KStoreError] = InvalidConfigurationError,
    ) -> None:
        self.kind = kind
        self._by_name = {s.name: s for s in settings}
        self.label = label
        self.error = error

    def __getitem__(self, name: str) -> Setting:
        return self._by_name[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    def defaults(self) -> dict[str, Any]:
        return {name: s.default for name, s in self._by_name.items()}

    def unknown(self, name: str) -> KStoreError:
        close = difflib.get_close_matches(name, list(self._by_name), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return self.error(f"unknown {self.kind} {name!r}{hint}")

    def check_names(self, names: Iterable[object]) -> None:
        for name in names:
            if not isinstance(name, str) or name not in self._by_name:
                raise self.unknown(str(name))

    def parse(self, name: str, value: Any) -> Any:
        """``value`` validated as setting ``name``: its canonical form, or the group's error
        naming the key, what is wrong and (unless a secret) the value."""
        if name not in self._by_name:
            raise self.unknown(name)
        return self._apply(self._by_name[name], self._by_name[name].parse, value)

    def read(self, name: str, value: Any) -> Any:
        """A stored value read as leniently as the setting allows."""
        setting = self._by_name[name]
        return self._apply(setting, setting.read or setting.parse, value)

    def validate(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Every given value validated (unknown keys refused); only the given keys returned."""
        if not isinstance(values, Mapping):
            raise self.error(f"{self.kind} must be a mapping, got {type(values).__name__}")
        self.check_names(values)
        return {name: self.parse(name, value) for name, value in values.items()}

    def _apply(self, setting: Setting, validator: Validator, value: Any) -> Any:
        try:
            return validator(value)
        except BadSettingError as problem:
            text = "the value given is not valid (not shown: it is a credential)"
            raise self.error(
                f"{self.label(setting.name)}: {text if setting.secret else problem}"
            ) from None
