"""The builder of one base-blob fixed-output derivation (nix/base.nix): fetch a manifest or a blob by
digest from a registry with servimg's own distribution client, verified against that digest, into $out.

    python fetch-blob.py manifest|blob REGISTRY/REPO[:TAG] sha256:<hex>

Nix checks the result again (outputHashMode "flat", outputHash = the digest's hex), so a registry that
serves other bytes fails the build twice over. Anonymous pulls only: a Nix build sees no ~/.docker/config.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] not in ("manifest", "blob"):
        print(__doc__, file=sys.stderr)
        return 2
    kind, ref_text, digest_text = argv
    from servimg.backends.registry import RegistryClient
    from servimg.core.digest import Digest
    from servimg.core.reference import Reference

    ref = Reference.parse(ref_text)
    digest = Digest.parse(digest_text)
    out = Path(os.environ["out"])  # noqa: SIM112 (Nix names the output variable `out`)
    with RegistryClient(ref.registry) as client:
        if kind == "manifest":
            data, media_type, got = client.get_manifest(ref.repository, str(digest))
            print(f"fetched manifest {got} ({media_type}, {len(data)} bytes)", file=sys.stderr)
            out.write_bytes(data)
        else:
            # Download beside the build's TMPDIR (the store directory is not ours to write temp files in).
            with tempfile.TemporaryDirectory() as tmp:
                dest = Path(tmp) / digest.hex
                client.download_blob(ref.repository, digest, dest)
                shutil.copyfile(dest, out)
            print(f"fetched blob {digest}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
