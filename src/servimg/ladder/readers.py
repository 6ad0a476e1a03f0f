"""The ladder formats' readers: `core.fields` in its LAX mode, with the ladder formats' own mapping
reader (`Fields`: says what the mapping is), version numbers and shared ids.

The ladder definition and probe set were pydantic models (lax mode); LAX accepts exactly what those
accepted and coerces it the same way (an integer for a float field, `"8000"` for a port, `yes` for
a boolean, an integral float for an integer, UTF-8 bytes for a string), so no ladder that loaded before
is refused now, none refused before loads now, and every parsed value (hence every receipt) is the same.
Plain code: importing it costs nothing, unlike the schema library (docs/benchmarks.md).

A reader is `(value, path, problems) -> typed value`. It raises `Invalid(message)` when the value itself
is wrong (the caller files the message under the value's path), or `Invalid()` once it has filed the
problems it found inside the value (a mapping or a list) itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from servimg.core import fields
from servimg.core.fields import LAX, Invalid, K, Reader, T, key_path, optional, problem, read

# The structure (Invalid, paths, problems, optional, mapping) is servimg.core.fields'; what is this
# module's own is the lax coercion of each scalar and the ladder formats' wording ("should be ...").
__all__ = ["Invalid", "Reader", "key_path", "optional", "problem", "read"]

UNKNOWN_KEY = "unknown key (check the spelling; see docs/ladder.md)"  # the schema of the file read


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
# core.fields' readers in LAX mode: what the ladder formats' pydantic models accepted, in their words.
def describe(value: object) -> str:
    return fields.describe(value, LAX)


def string(value: object) -> str:
    return fields.string(value, LAX)


def whole_number(value: object) -> int:
    return fields.whole_number(value, LAX)


def number(value: object) -> float:
    return fields.number(value, LAX)


def text(*, pattern: str | None = None, min_length: int = 0, meaning: str = "") -> Reader[str]:
    return fields.text(pattern=pattern, min_length=min_length, meaning=meaning, mode=LAX)


def integer(*, ge: int | None = None, le: int | None = None) -> Reader[int]:
    return fields.integer(ge=ge, le=le, mode=LAX)


def floating(*, ge: float | None = None, gt: float | None = None, le: float | None = None) -> Reader[float]:
    return fields.floating(ge=ge, gt=gt, le=le, mode=LAX)


boolean = fields.lax_boolean


def choice(*options: str) -> Reader[str]:
    return fields.choice(*options, mode=LAX)


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
    return fields.items(reader, min_length=min_length, mode=LAX)


def mapping(key: Reader[K], value: Reader[T]) -> Reader[dict[K, T]]:
    return fields.mapping(key, value, mode=LAX)


def strings_in(value: object) -> list[str]:
    """The strings a list or a mapping's values hold as written (bytes decoded), ignoring the rest: for
    cross-checks over parts that may not have validated."""
    if isinstance(value, Mapping):
        value = list(value.values())
    if not isinstance(value, list | tuple | set | frozenset):
        return []
    decoded = (fields.decoded_text(bytes(v)) if isinstance(v, bytes | bytearray) else v for v in value)
    return [v for v in decoded if isinstance(v, str)]


# ------------------------------------------------------------------------------------------ shared
ID_PATTERN = r"[a-z0-9][a-z0-9._-]{0,63}"
IDENT = text(pattern=ID_PATTERN, meaning="an id: lowercase letters, digits, '.', '_', '-'")
"""An id in the ladder formats (arm, family, prompt, probe set)."""
STRING = scalar(string)


def shape(value: object, path: str, problems: list[str], what: str) -> Fields:
    """The keys of a mapping in the ladder formats (`what` the mapping is, said when it is no mapping)."""
    return Fields(value, path, problems, what=what)
