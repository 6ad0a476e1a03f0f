"""The build's Context: `core.context.Context` over the blob store and the build's `Seams` (chosen once by
the caller: `assembly.defaults.default_seams(host)` for what `servimg` does on this host, with any seam
replaced on the value). One class, named here with its types bound, so a command's Context is an
`oci.store.Io` wherever a room below `assembly/` asks for one."""

from __future__ import annotations

from typing import TypeAlias

from servimg.assembly.seams import Seams
from servimg.core import context
from servimg.oci.store import BlobStore

Context: TypeAlias = context.Context[BlobStore, Seams]
