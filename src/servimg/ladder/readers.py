"""Parsed YAML or JSON read into typed values for the ladder formats, every problem as `path: message`.

The ladder definition and probe set were pydantic models (lax mode); these readers accept exactly what
those accepted and coerce it the same way (an integer for a float field, `"8000"` for a port, `yes` for
a boolean, an integral float for an integer, UTF-8 bytes for a string), so no ladder that loaded before
is refused now, none refused before loads now, and every parsed value (hence every receipt) is the same.
Plain code: importing it costs nothing, unlike the schema library (docs/benchmarks.md).

A reader is `(value, path, problems) -> typed value`. It raises `Invalid(message)` when the value itself
is wrong (the caller files the message under the value's path), or `Invalid()` once it has filed the
problems it found inside the value (a mapping or a list) itself.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import TypeVar

from servimg.core import fields
from servimg.core.fields import Invalid, K, Reader, T, index_path, key_path, optional, problem, read

# The structure (Invalid, paths, problems, optional, mapping) is servimg.core.fields'; what is this
# module's own is the lax coercion of each scalar and the ladder formats' wording ("should be ...").
__all__ = ["Invalid", "Reader", "key_path", "optional", "problem", "read"]

UNKNOWN_KEY = "unknown key (check the spelling; see docs/ladder.md)"  # the schema of the file read


def describe(value: object) -> str:
    """What YAML/JSON calls the value's type, for messages."""
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", bytes: "binary"}
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple | set | frozenset):
        return "a list"
    return names.get(type(value), f"a {type(value).__name__}")


class Fields(fields.Fields):
    """core.fields' keys of one mapping, in the ladder formats' words (`what` the mapping is)."""

    def __init__(self, data: object, path: str, problems: list[str], *, what: str) -> None:
        if not isinstance(data, Mapping):
            raise Invalid(f"should be a mapping ({what}), not {describe(data)}")
        super().__init__(data, path, problems, unknown=UNKNOWN_KEY)

    def raw(self, key: str) -> object:
        """The value as written (None when absent), for rules that look across keys."""
        return self.get(key)

    def made(self, value: T) -> T:
        """`value` (built from what `take` returned) once every key is checked; raises if any failed."""
        self.done()
        return value


# ------------------------------------------------------------------------------------------ scalars
def _decoded(value: str | bytes) -> str | None:
    if isinstance(value, str):
        return value
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return None


def string(value: object) -> str:
    """A string; UTF-8 bytes (a YAML !!binary) are decoded, as the lax schema did."""
    if isinstance(value, bytes | bytearray):
        decoded = _decoded(bytes(value))
        if decoded is None:
            raise Invalid("should be a string: these bytes are not UTF-8")
        return decoded
    if not isinstance(value, str):
        raise Invalid(f"should be a string, not {describe(value)}")
    return value


def text(*, pattern: str | None = None, min_length: int = 0, meaning: str = "") -> Reader[str]:
    """A string; `pattern` must match all of it (`fullmatch`: no trailing newline slips past a `$`;
    DOTALL: a `.` is any character). `meaning` says in words what the pattern asks for."""
    compiled = re.compile(pattern, re.DOTALL) if pattern is not None else None
    expected = f"{meaning} ({pattern})" if meaning else f"a match of {pattern}"

    def reader(value: object, path: str, problems: list[str]) -> str:
        got = string(value)
        if len(got) < min_length:
            raise Invalid("should not be empty" if min_length == 1 else f"needs {min_length} characters")
        if compiled is not None and compiled.fullmatch(got) is None:
            raise Invalid(f"should be {expected}, not {got[:80]!r}")
        return got

    return reader


def _number_text(value: object) -> str | None:
    """The text of a quoted number, stripped; None when it is no text or not ASCII (no `٣`)."""
    got = _decoded(bytes(value)) if isinstance(value, bytes | bytearray) else value
    if not isinstance(got, str):
        return None
    got = got.strip()
    return got if got.isascii() else None


_ZERO_FRACTION = re.compile(r"(.*[0-9])\.0+")


def whole_number(value: object) -> int:
    """An integer: also a boolean, an integral finite float within 64 bits (`2.0`), or a quoted one
    (`"2"`, `" 2 "`, `"1_000"`, `"2.0"`), as the lax schema took them."""
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise Invalid("should be a finite number")
        if not value.is_integer():
            raise Invalid("should be an integer, not a number with a fractional part")
        if not -(2.0**63) < value < 2.0**63:
            raise Invalid("should be an integer of at most 64 bits")
        return int(value)
    got = _number_text(value)
    if got is None:
        raise Invalid(f"should be an integer, not {describe(value)}")
    zero = _ZERO_FRACTION.fullmatch(got)
    try:
        return int(zero.group(1) if zero else got)
    except ValueError:
        raise Invalid(f"should be an integer (got {got[:40]!r})") from None


def number(value: object) -> float:
    """A float: also an integer or a boolean (as a float) or a quoted number (`"0.5"`, `"1e3"`, `"inf"`)."""
    if isinstance(value, int | float):
        try:
            return float(value)
        except OverflowError:
            raise Invalid("should be a number that fits a float") from None
    got = _number_text(value)
    if got is None:
        raise Invalid(f"should be a number, not {describe(value)}")
    try:
        return float(got)
    except ValueError:
        raise Invalid(f"should be a number (got {got[:40]!r})") from None


def _bounds(
    ge: float | None, gt: float | None, le: float | None
) -> list[tuple[str, Callable[[float], bool]]]:
    out: list[tuple[str, Callable[[float], bool]]] = []
    if ge is not None:
        out.append((f">= {ge}", lambda x: x >= ge))
    if gt is not None:
        out.append((f"> {gt}", lambda x: x > gt))
    if le is not None:
        out.append((f"<= {le}", lambda x: x <= le))
    return out


def integer(*, ge: int | None = None, le: int | None = None) -> Reader[int]:
    return _bounded(whole_number, _bounds(ge, None, le))


def floating(*, ge: float | None = None, gt: float | None = None, le: float | None = None) -> Reader[float]:
    """A float within bounds (NaN is within none)."""
    return _bounded(number, _bounds(ge, gt, le))


N = TypeVar("N", int, float)


def _bounded(convert: Callable[[object], N], checks: list[tuple[str, Callable[[float], bool]]]) -> Reader[N]:
    def reader(value: object, path: str, problems: list[str]) -> N:
        got = convert(value)
        for what, ok in checks:
            if not ok(got):
                raise Invalid(f"should be {what} (got {got})")
        return got

    return reader


def boolean(value: object, path: str, problems: list[str]) -> bool:
    """core.fields' boolean (0/1, a quoted yes/no/on/off/true/false/t/f/y/n/1/0 in any case, unstripped),
    also from UTF-8 bytes, in the ladder formats' words."""
    got = _decoded(bytes(value)) if isinstance(value, bytes | bytearray) else value
    try:
        return fields.boolean(got, path, problems)
    except Invalid:
        raise Invalid(f"should be true or false, not {describe(value)}") from None


def choice(*options: str) -> Reader[str]:
    """One of `options`, spelt exactly."""

    def reader(value: object, path: str, problems: list[str]) -> str:
        if isinstance(value, str) and value in options:
            return value
        raise Invalid(f"should be one of {', '.join(repr(o) for o in options)} (got {value!r:.60})")

    return reader


def version(expected: int) -> Reader[int]:
    """The format's version number: equal to `expected` as a number (`1`, `1.0`, or `true` for 1, as the
    lax schema compared them), never a quoted one."""

    def reader(value: object, path: str, problems: list[str]) -> int:
        if isinstance(value, int | float) and value == expected:
            return expected
        raise Invalid(f"should be {expected} (got {value!r:.60})")

    return reader


def scalar(convert: Callable[[object], T]) -> Reader[T]:
    """A reader from a one-argument converter (`string`, `whole_number`, `number`)."""

    def reader(value: object, path: str, problems: list[str]) -> T:
        return convert(value)

    return reader


# ------------------------------------------------------------------------------------------ containers
def items(reader: Reader[T], *, min_length: int = 0) -> Reader[tuple[T, ...]]:
    """A list (a YAML !!set too, in its order, as the lax schema took it), element by element (each
    problem under `path[i]`), as a tuple."""

    def items_reader(value: object, path: str, problems: list[str]) -> tuple[T, ...]:
        if not isinstance(value, list | tuple | set | frozenset):
            raise Invalid(f"should be a list, not {describe(value)}")
        before = len(problems)
        out = [read(reader, item, index_path(path, i), problems) for i, item in enumerate(value)]
        if len(problems) != before:
            raise Invalid()
        if len(out) < min_length:
            raise Invalid(f"should have at least {min_length} item(s)")
        return tuple(out)  # type: ignore[arg-type]

    return items_reader


def mapping(key: Reader[K], value: Reader[T]) -> Reader[dict[K, T]]:
    """A mapping, every key and value read (a value's problems under `path.key`): core.fields' reader,
    in the ladder formats' words."""
    inner = fields.mapping(key, value)

    def mapping_reader(data: object, path: str, problems: list[str]) -> dict[K, T]:
        if not isinstance(data, Mapping):
            raise Invalid(f"should be a mapping, not {describe(data)}")
        return inner(data, path, problems)

    return mapping_reader


def strings_in(value: object) -> list[str]:
    """The strings a list or a mapping's values hold as written (bytes decoded), ignoring the rest: for
    cross-checks over parts that may not have validated."""
    if isinstance(value, Mapping):
        value = list(value.values())
    if not isinstance(value, list | tuple | set | frozenset):
        return []
    decoded = (_decoded(bytes(v)) if isinstance(v, bytes | bytearray) else v for v in value)
    return [v for v in decoded if isinstance(v, str)]


# ------------------------------------------------------------------------------------------ shared
ID_PATTERN = r"[a-z0-9][a-z0-9._-]{0,63}"
IDENT = text(pattern=ID_PATTERN, meaning="an id: lowercase letters, digits, '.', '_', '-'")
"""An id in the ladder formats (arm, family, prompt, probe set)."""
STRING = scalar(string)


def shape(value: object, path: str, problems: list[str], what: str) -> Fields:
    """The keys of a mapping in the ladder formats (`what` the mapping is, said when it is no mapping)."""
    return Fields(value, path, problems, what=what)
