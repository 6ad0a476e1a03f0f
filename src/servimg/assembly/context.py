"""What a command and the build run with, carried as one value: the blob cache, where steps are logged,
how transfers show progress, and the build's seams (chosen once by the caller: `assembly.defaults.
default_seams(host)` for what `servimg` does on this host, with any seam replaced on the value)."""

from __future__ import annotations

from dataclasses import dataclass, field

from servimg.assembly.seams import Seams
from servimg.core.progress import NULL, Log, Progress
from servimg.oci.store import BlobStore


def _silent(message: str) -> None:
    del message


@dataclass(frozen=True)
class Context:
    store: BlobStore
    log: Log = _silent
    progress: Progress = NULL
    seams: Seams = field(kw_only=True)
