"""Reading parsed YAML or JSON into typed values, every problem collected as `yaml.path: message`.

The validating constructors of the definitions servimg reads on every build (builder/definition.py,
builder/lock.py) are written with these readers rather than a schema library: they are plain code
that imports in microseconds, and each says in its own words what to write instead.

A reader is `(value, path, problems) -> typed value`. It raises `Invalid(message)` when the value itself
is wrong (the caller files the message under the value's path), or `Invalid()` once it has filed the
problems it found inside the value (a mapping or list) itself.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping
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


def describe(value: object) -> str:
    """What YAML/JSON calls the value's type, for messages."""
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list"}
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        return "a mapping"
    return names.get(type(value), f"a {type(value).__name__}")


# ------------------------------------------------------------------------------------------ scalars
def text(*, pattern: str | None = None, min_length: int = 0) -> Reader[str]:
    """A string; `pattern` must match all of it (`re.fullmatch`, so no trailing newline slips past `$`)."""
    compiled = re.compile(pattern) if pattern is not None else None

    def reader(value: object, path: str, problems: list[str]) -> str:
        if not isinstance(value, str):
            raise Invalid(f"must be a string, not {describe(value)}")
        if len(value) < min_length:
            raise Invalid(
                "must not be empty" if min_length == 1 else f"needs at least {min_length} characters"
            )
        if compiled is not None and compiled.fullmatch(value) is None:
            raise Invalid(f"must match {pattern} (got {value!r})")
        return value

    return reader


_INTEGER_TEXT = re.compile(r"\s*[+-]?[0-9]+\s*")


def whole_number(value: object) -> int:
    """An integer, also from an integral float (`2.0`) or a quoted one (`"2"`); never from a boolean
    (a YAML `yes` is no count)."""
    if isinstance(value, bool):
        raise Invalid(f"must be an integer, not {describe(value)}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, str) and _INTEGER_TEXT.fullmatch(value) and len(value) <= 4300:
        return int(value)
    raise Invalid(f"must be an integer, not {describe(value)}")


def integer(*, ge: int | None = None, le: int | None = None) -> Reader[int]:
    def reader(value: object, path: str, problems: list[str]) -> int:
        number = whole_number(value)
        if (ge is not None and number < ge) or (le is not None and number > le):
            raise Invalid(f"must be {_bounds(ge, le)} (got {number})")
        return number

    return reader


def _bounds(ge: int | None, le: int | None) -> str:
    if ge is not None and le is not None:
        return f"between {ge} and {le}"
    return f">= {ge}" if ge is not None else f"<= {le}"


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


def choice(*options: str) -> Reader[str]:
    """One of `options`, spelt exactly."""

    def reader(value: object, path: str, problems: list[str]) -> str:
        if isinstance(value, str) and value in options:
            return value
        raise Invalid(f"must be one of {', '.join(options)} (got {value!r:.60})")

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
def items(reader: Reader[T]) -> Reader[tuple[T, ...]]:
    """A list, read element by element (each problem under `path[i]`), as a tuple."""

    def items_reader(value: object, path: str, problems: list[str]) -> tuple[T, ...]:
        # A YAML !!set is refused with the rest: its order is the hash seed's, and the order is digested.
        if not isinstance(value, list | tuple):
            raise Invalid(f"must be a list, not {describe(value)}")
        before = len(problems)
        out = [read(reader, item, index_path(path, i), problems) for i, item in enumerate(value)]
        if len(problems) != before:
            raise Invalid()
        return tuple(out)  # type: ignore[arg-type]

    return items_reader


def mapping(key: Reader[K], value: Reader[T]) -> Reader[dict[K, T]]:
    """A mapping, every key and value read (a value's problems under `path.key`)."""

    def mapping_reader(data: object, path: str, problems: list[str]) -> dict[K, T]:
        if not isinstance(data, Mapping):
            raise Invalid(f"must be a mapping, not {describe(data)}")
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
