"""Reading parsed YAML or JSON into typed values, every problem collected as `yaml.path: message`.

The validating constructors of the definitions servimg reads on every build (definitions/definition.py,
definitions/lock.py, judging/policy.py) and the ladder formats (ladder/readers.py) are written with these
readers rather than a schema library: they are plain code that imports in microseconds, and each says
in its own words what to write instead. One set of readers, two modes (`Mode`): STRICT for what
servimg's users write against its docs, LAX for the ladder formats that pydantic once read in lax mode;
`exact_integer` and `digest` for what servimg writes itself (a lock: nothing coerced).

A reader is `(value, path, problems) -> typed value`. It raises `Invalid(message)` when the value itself
is wrong (the caller files the message under the value's path), or `Invalid()` once it has filed the
problems it found inside the value (a mapping or list) itself.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from servimg.core.digest import Digest
from servimg.core.errors import ServimgError

T = TypeVar("T")
K = TypeVar("K")
Reader = Callable[[object, str, list[str]], T]


class Invalid(Exception):
    """The value cannot be read; `message` is None when its problems are already filed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message)
        self.message = message


def key_path(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def index_path(path: str, index: int) -> str:
    return f"{path}[{index}]"


def problem(path: str, message: str) -> str:
    return f"{path or '<root>'}: {message}"


def read(reader: Reader[T], value: object, path: str, problems: list[str]) -> T | None:
    """`reader` applied to `value`, or None with every problem filed."""
    try:
        return reader(value, path, problems)
    except Invalid as exc:
        if exc.message is not None:
            problems.append(problem(path, exc.message))
        return None


def read_all(reader: Reader[T], data: object, refuse: Callable[[list[str]], Exception]) -> T:
    """`reader` applied to a whole document, or `refuse(problems)` raised with every problem in it."""
    problems: list[str] = []
    value = read(reader, data, "", problems)
    if value is None:
        raise refuse(problems)
    return value


_REQUIRED = object()


class Fields:
    """The keys of one mapping, each read once by `take`; `done` files every key nobody took."""

    def __init__(self, data: object, path: str, problems: list[str], *, unknown: str) -> None:
        if not isinstance(data, Mapping):
            raise Invalid(f"must be a mapping, not {describe(data)}")
        self._data: Mapping[object, object] = data
        self._path = path
        self._problems = problems
        self._unknown = unknown
        self._taken: set[str] = set()
        self._before = len(problems)

    def get(self, key: str) -> object:
        """The raw value (None when absent), for rules that look at another key before reading it."""
        return self._data.get(key)

    def take(self, key: str, reader: Reader[T], default: object = _REQUIRED) -> T:
        """The key's value read by `reader`; `default` when absent (a required key when none is given).
        After a problem the value is a placeholder: `done` raises before anyone uses it."""
        self._taken.add(key)
        path = key_path(self._path, key)
        if key not in self._data:
            if default is _REQUIRED:
                self._problems.append(problem(path, "required key is missing"))
                return None  # type: ignore[return-value]
            return default  # type: ignore[return-value]
        return read(reader, self._data[key], path, self._problems)  # type: ignore[return-value]

    @property
    def ok(self) -> bool:
        """No problem filed for this mapping so far (so its values are what `take` returned)."""
        return len(self._problems) == self._before

    def done(self) -> None:
        for key in self._data:
            if key not in self._taken:
                self._problems.append(problem(key_path(self._path, key), self._unknown))
        if not self.ok:
            raise Invalid()


def record(cls: type[T], readers: Mapping[str, Reader[Any]], *, unknown: str) -> Reader[T]:
    """A reader for dataclass `cls`: each field read by `readers[name]`, in field order; a field with a
    default (or a default factory) may be left out, one without is required; any other key is unknown."""
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    assert {f.name for f in fields} == set(readers), cls  # a new field needs its reader

    def reader(data: object, path: str, problems: list[str]) -> T:
        f = Fields(data, path, problems, unknown=unknown)
        values = {spec.name: f.take(spec.name, readers[spec.name], _default(spec)) for spec in fields}
        f.done()
        return cls(**values)

    return reader


def _default(spec: dataclasses.Field[Any]) -> object:
    if spec.default is not dataclasses.MISSING:
        return spec.default
    if spec.default_factory is not dataclasses.MISSING:
        return spec.default_factory()
    return _REQUIRED


@dataclass(frozen=True)
class Mode:
    """How far the readers go to take a value, and how their messages say what is wanted.

    STRICT (definitions, locks, policies: files servimg's own users write against its docs): JSON's own
    types, plus the few spellings YAML writers use (an integral float or a quoted integer for an integer;
    yes/no/on/off for a boolean); "must be". LAX (the ladder formats, which pydantic models once read in
    lax mode): also a boolean or a quoted number for a number, UTF-8 bytes for a string, a set for a
    list, exactly as those models coerced them, so that no ladder that loaded before is refused and every
    parsed value (hence every receipt) is the same; "should be"."""

    name: str
    verb: str

    @property
    def lax(self) -> bool:
        return self is LAX


STRICT = Mode("strict", "must be")
LAX = Mode("lax", "should be")


def describe(value: object, mode: Mode = STRICT) -> str:
    """What YAML/JSON calls the value's type, for messages."""
    names: dict[type, str] = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
    names.update({bytes: "binary"} if mode.lax else {list: "a list"})
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        return "a mapping"
    if mode.lax and isinstance(value, list | tuple | set | frozenset):
        return "a list"
    return names.get(type(value), f"a {type(value).__name__}")


# ------------------------------------------------------------------------------------------ scalars
def decoded_text(value: str | bytes) -> str | None:
    """`value` as text: bytes decoded as UTF-8 (None when they are not)."""
    if isinstance(value, str):
        return value
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return None


def string(value: object, mode: Mode = STRICT) -> str:
    """A string; LAX also decodes UTF-8 bytes (a YAML !!binary)."""
    if mode.lax and isinstance(value, bytes | bytearray):
        decoded = decoded_text(bytes(value))
        if decoded is None:
            raise Invalid("should be a string: these bytes are not UTF-8")
        return decoded
    if not isinstance(value, str):
        raise Invalid(f"{mode.verb} a string, not {describe(value, mode)}")
    return value


def text(
    *, pattern: str | None = None, min_length: int = 0, meaning: str = "", mode: Mode = STRICT
) -> Reader[str]:
    """A string; `pattern` must match all of it (`re.fullmatch`, so no trailing newline slips past `$`;
    LAX matches with DOTALL, a `.` being any character). `meaning` says in words what the pattern asks."""
    compiled = re.compile(pattern, re.DOTALL if mode.lax else 0) if pattern is not None else None
    expected = f"{meaning} ({pattern})" if meaning else f"a match of {pattern}"

    def reader(value: object, path: str, problems: list[str]) -> str:
        got = string(value, mode)
        if len(got) < min_length:
            if mode.lax:
                raise Invalid("should not be empty" if min_length == 1 else f"needs {min_length} characters")
            raise Invalid(
                "must not be empty" if min_length == 1 else f"needs at least {min_length} characters"
            )
        if compiled is not None and compiled.fullmatch(got) is None:
            if mode.lax:
                raise Invalid(f"should be {expected}, not {got[:80]!r}")
            raise Invalid(f"must match {pattern} (got {got!r})")
        return got

    return reader


_INTEGER_TEXT = re.compile(r"\s*[+-]?[0-9]+\s*")
_ZERO_FRACTION = re.compile(r"(.*[0-9])\.0+")


def whole_number(value: object, mode: Mode = STRICT) -> int:
    """An integer, also from an integral float (`2.0`) or a quoted one (`"2"`). STRICT never takes a
    boolean (a YAML `yes` is no count); LAX does, and a quoted `"1_000"` or `"2.0"`, as pydantic did."""
    if mode.lax:
        return _lax_whole_number(value)
    if isinstance(value, bool):
        raise Invalid(f"must be an integer, not {describe(value)}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, str) and _INTEGER_TEXT.fullmatch(value) and len(value) <= 4300:
        return int(value)
    raise Invalid(f"must be an integer, not {describe(value)}")


def _number_text(value: object) -> str | None:
    """The text of a quoted number, stripped; None when it is no text or not ASCII (no `٣`)."""
    got = decoded_text(bytes(value)) if isinstance(value, bytes | bytearray) else value
    if not isinstance(got, str):
        return None
    got = got.strip()
    return got if got.isascii() else None


def _lax_whole_number(value: object) -> int:
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
        raise Invalid(f"should be an integer, not {describe(value, LAX)}")
    zero = _ZERO_FRACTION.fullmatch(got)
    try:
        return int(zero.group(1) if zero else got)
    except ValueError:
        raise Invalid(f"should be an integer (got {got[:40]!r})") from None


def number(value: object, mode: Mode = STRICT) -> float:
    """A float, also from an integer. LAX also takes a boolean or a quoted number (`"0.5"`, `"inf"`)."""
    if isinstance(value, int | float) and (mode.lax or not isinstance(value, bool)):
        try:
            return float(value)
        except OverflowError:
            raise Invalid(f"{mode.verb} a number that fits a float") from None
    got = _number_text(value) if mode.lax else None
    if got is None:
        raise Invalid(f"{mode.verb} a number, not {describe(value, mode)}")
    try:
        return float(got)
    except ValueError:
        raise Invalid(f"should be a number (got {got[:40]!r})") from None


def integer(*, ge: int | None = None, le: int | None = None, mode: Mode = STRICT) -> Reader[int]:
    if mode.lax:
        return _bounded(_lax_whole_number, _bounds(ge, None, le), mode)

    def reader(value: object, path: str, problems: list[str]) -> int:
        got = whole_number(value)
        if (ge is not None and got < ge) or (le is not None and got > le):
            raise Invalid(f"must be {_between(ge, le)} (got {got})")
        return got

    return reader


def floating(
    *, ge: float | None = None, gt: float | None = None, le: float | None = None, mode: Mode = STRICT
) -> Reader[float]:
    """A float within bounds (NaN is within none)."""
    return _bounded(lambda value: number(value, mode), _bounds(ge, gt, le), mode)


def _between(ge: int | None, le: int | None) -> str:
    if ge is not None and le is not None:
        return f"between {ge} and {le}"
    return f">= {ge}" if ge is not None else f"<= {le}"


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


N = TypeVar("N", int, float)


def _bounded(
    convert: Callable[[object], N], checks: list[tuple[str, Callable[[float], bool]]], mode: Mode
) -> Reader[N]:
    def reader(value: object, path: str, problems: list[str]) -> N:
        got = convert(value)
        for what, ok in checks:
            if not ok(got):
                raise Invalid(f"{mode.verb} {what} (got {got})")
        return got

    return reader


def exact_integer(value: object, path: str, problems: list[str]) -> int:
    """An integer and nothing else (machine-written JSON: no coercion)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise Invalid(f"must be an integer, not {describe(value)}")
    return value


_TRUE = {"1", "on", "t", "true", "y", "yes"}
_FALSE = {"0", "off", "f", "false", "n", "no"}


def digest(value: object, path: str, problems: list[str]) -> Digest:
    """A digest as `Digest.parse` reads it (`sha256:<64 lowercase hex>`)."""
    if not isinstance(value, str):
        raise Invalid(f"must be a digest string, not {describe(value)}")
    try:
        return Digest.parse(value)
    except ServimgError as exc:
        raise Invalid(exc.message) from None


def boolean(value: object, path: str, problems: list[str]) -> bool:
    """true/false, also as 0/1 or a quoted yes/no/on/off/true/false (what YAML 1.1 spells as booleans)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
        return value.lower() in _TRUE
    raise Invalid(f"must be true or false, not {describe(value)}")


def lax_boolean(value: object, path: str, problems: list[str]) -> bool:
    """`boolean` also from UTF-8 bytes, in LAX's words."""
    got = decoded_text(bytes(value)) if isinstance(value, bytes | bytearray) else value
    try:
        return boolean(got, path, problems)
    except Invalid:
        raise Invalid(f"should be true or false, not {describe(value, LAX)}") from None


def choice(*options: str, mode: Mode = STRICT) -> Reader[str]:
    """One of `options`, spelt exactly."""
    listed = ", ".join(repr(o) for o in options) if mode.lax else ", ".join(options)

    def reader(value: object, path: str, problems: list[str]) -> str:
        if isinstance(value, str) and value in options:
            return value
        raise Invalid(f"{mode.verb} one of {listed} (got {value!r:.60})")

    return reader


def either(listed: Reader[T], mapped: Reader[K]) -> Reader[T | K]:
    """`mapped` for a mapping, `listed` for anything else (a key that takes a list or a mapping)."""

    def reader(value: object, path: str, problems: list[str]) -> T | K:
        return mapped(value, path, problems) if isinstance(value, Mapping) else listed(value, path, problems)

    return reader


def optional(reader: Reader[T]) -> Reader[T | None]:
    def optional_reader(value: object, path: str, problems: list[str]) -> T | None:
        return None if value is None else reader(value, path, problems)

    return optional_reader


# ------------------------------------------------------------------------------------------ containers
def items(reader: Reader[T], *, min_length: int = 0, mode: Mode = STRICT) -> Reader[tuple[T, ...]]:
    """A list, read element by element (each problem under `path[i]`), as a tuple. STRICT refuses a YAML
    !!set (its order is the hash seed's, and the order is digested); LAX takes it in its order, as the
    lax schema did."""
    kinds = (list, tuple, set, frozenset) if mode.lax else (list, tuple)

    def items_reader(value: object, path: str, problems: list[str]) -> tuple[T, ...]:
        if not isinstance(value, kinds):
            raise Invalid(f"{mode.verb} a list, not {describe(value, mode)}")
        before = len(problems)
        out = [read(reader, item, index_path(path, i), problems) for i, item in enumerate(value)]
        if len(problems) != before:
            raise Invalid()
        if len(out) < min_length:
            raise Invalid(f"{mode.verb.replace(' be', '')} have at least {min_length} item(s)")
        return tuple(out)  # type: ignore[arg-type]

    return items_reader


def mapping(key: Reader[K], value: Reader[T], *, mode: Mode = STRICT) -> Reader[dict[K, T]]:
    """A mapping, every key and value read (a value's problems under `path.key`)."""

    def mapping_reader(data: object, path: str, problems: list[str]) -> dict[K, T]:
        if not isinstance(data, Mapping):
            raise Invalid(f"{mode.verb} a mapping, not {describe(data, mode)}")
        before = len(problems)
        out: dict[K, T] = {}
        for raw_key, raw_value in data.items():
            where = key_path(path, raw_key)
            try:
                checked = key(raw_key, where, problems)
            except Invalid as exc:
                problems.append(problem(where, f"key {exc.message}"))
                read(value, raw_value, where, problems)  # its value's problems too, all at once
                continue
            out[checked] = read(value, raw_value, where, problems)  # type: ignore[assignment]
        if len(problems) != before:
            raise Invalid()
        return out

    return mapping_reader
