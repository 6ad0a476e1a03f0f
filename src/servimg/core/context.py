"""What a run carries, as one value (issue 49: the `Context` in `core/`, so every room takes the same one
and none unpacks it into `store, log` again): where its steps are logged (`Log`), how long transfers
(pulls, layer writes, pushes) show progress (`Progress`: the CLI passes a rich display, or nothing under
--quiet/--json), the blob store, and the build's seams.

The store and the seams live above `core/`, so `Context` is generic over them and the room that owns each
names the bound type: `oci.store.Io` is a Context as the rooms below `assembly/` take it (its store, any
seams), `assembly.context.Context` the one a command builds (its `Seams`, required: no concrete default).
Both are this one class; the build's is an `Io` wherever one is asked for (the type variables are
covariant).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import BinaryIO, Generic, Protocol, TypeVar

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


StoreT = TypeVar("StoreT", covariant=True)
SeamsT = TypeVar("SeamsT", covariant=True)


def silent(message: str) -> None:
    """The log of a run that reports nothing."""
    del message


@dataclass(frozen=True)
class Context(Generic[StoreT, SeamsT]):
    store: StoreT
    log: Log = silent
    progress: Progress = NULL
    seams: SeamsT = field(kw_only=True)
