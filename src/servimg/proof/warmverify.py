"""The whole probe over a built image in the warm root: the base's tree (extracted once per base chain,
kept by its ordered diffIDs: `proof.warmroot`) with the image's own servimg layer laid over it in a fresh
upper dir, so the probe sees exactly the image's layers, run by the image's interpreter as its service
would run (the command's interpreter flags and entry, Env, WorkingDir).

Every check runs in this run, over the final tree: RECORD hashes every file of every declared
distribution, nothing is taken from an earlier run or merged from a part (docs/design.md, "The proof is
computed, never remembered"). `servimg verify IMAGE` runs the same probe in a container or a chroot; the
build uses the warm root where this host can mount overlays because it needs no engine and no copy of the
image (`proof.verifier.probe_route`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from servimg.core import jsonview as jv
from servimg.core.errors import VerifyError
from servimg.oci.filesystem import LayeredFS
from servimg.oci.image import Image
from servimg.oci.store import Io
from servimg.proof.verify import (
    SPEC_IN_IMAGE,
    VerifyReport,
    probe_command,
    probe_in,
    service_command,
)
from servimg.proof.warmroot import MOUNT_FAILED, WarmRoot, lay_out, new_upper


class WarmRootUnavailable(VerifyError):
    """The warm root's overlay cannot be mounted here (no user namespaces, an unsafe path): the caller
    runs the whole probe in a container or a chroot instead."""


@dataclass
class LayerOverlay:
    """The warm root with one layer tar laid over it in a fresh upper dir per run: the probe's sandbox
    (`verify.probe_in`) for a built image, base + its servimg layer."""

    root: WarmRoot
    layer: Path
    name: str = "the warm root"
    hint: str = "run `servimg verify` on the image: the same probe in a container or a chroot"

    def execute(
        self, argv: Sequence[str], env: Mapping[str, str], work: Path | None, workdir: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        if work is not None:
            raise VerifyError("the warm root's probe overlay mounts no work dir", hint="pass work=None")
        upper = new_upper("servimg-verify-")
        try:
            lay_out(self.layer, upper)
            proc = self.root.run(upper, argv, env=env, workdir=workdir)
        finally:
            shutil.rmtree(upper.parent, ignore_errors=True)
        if proc.returncode == MOUNT_FAILED:
            raise WarmRootUnavailable(
                f"the warm root's overlay could not be mounted: {proc.stderr.strip()[-300:]}"
            )
        return proc


def verify_in_warm_root(image: Image, io: Io) -> VerifyReport:
    """The whole probe over `image` (a base and one servimg layer, as every build makes) in the warm
    root. Raises WarmRootUnavailable where the overlay cannot be mounted, VerifyError where the probe
    cannot run at all."""
    store, log = io.store, io.log
    if len(image.layers) < 2:
        raise VerifyError("the warm root verifies a built image: a base and a servimg layer")
    *base_layers, top = image.layers
    base_chain = [(store.uncompressed(x.descriptor.digest, x.diff_id), x.diff_id) for x in base_layers]
    top_tar = store.uncompressed(top.descriptor.digest, top.diff_id)
    spec = json.loads(LayeredFS([top_tar]).read(SPEC_IN_IMAGE.lstrip("/")))
    config = jv.obj(image.config.get("config") or {}, "config")
    interpreter = str(jv.member(spec, "interpreter", "path"))
    service = service_command(config, interpreter)
    root = WarmRoot.of(LayeredFS.cached(base_chain, store.root), [d for _, d in base_chain], store.root)
    command = probe_command(interpreter, service.python_args, SPEC_IN_IMAGE, entry=service.entry)
    log(f"verifying {image.digest.short}: the whole probe in the warm root (its base + its layer)")
    workdir = str(config.get("WorkingDir") or "/")
    return VerifyReport.from_json(probe_in(LayerOverlay(root, top_tar), command, image.env, workdir))
