"""Progress for long transfers (pulls, layer writes, pushes), decoupled from how it is displayed.

The library takes a `Progress`; the CLI passes a rich display (or nothing under --quiet/--json).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import BinaryIO, Protocol

Advance = Callable[[int], None]
# What every stage reports its steps to (the CLI's reporter, `print`, or a test's list.append).
Log = Callable[[str], None]


class Progress(Protocol):
    def transfer(self, description: str, total: int) -> contextlib.AbstractContextManager[Advance]: ...


class NullProgress:
    @contextlib.contextmanager
    def transfer(self, description: str, total: int) -> Iterator[Advance]:
        yield lambda n: None


NULL = NullProgress()


class CountingReader:
    """A read-only file wrapper that reports every chunk read (requests streams it as the body)."""

    def __init__(self, raw: BinaryIO, advance: Advance) -> None:
        self._raw = raw
        self._advance = advance

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        self._advance(len(data))
        return data

    def __getattr__(self, name: str) -> object:  # seek/tell/close/fileno pass through
        return getattr(self._raw, name)

    def __enter__(self) -> CountingReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self._raw.close()
