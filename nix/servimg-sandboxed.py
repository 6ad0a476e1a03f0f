"""Run servimg's own CLI inside a Nix build: no network, no Docker Engine, no /usr, not root.

    python servimg-sandboxed.py build-image    # builder of the image derivation (nix/image.nix)
    python servimg-sandboxed.py verify-image   # builder of the probe check (nix/checks.nix)

Everything that decides the image (resolution, drift check, overlay application, bytecode, the layer,
the probe, the archive) is `servimg build` / `servimg verify`, called through `servimg.cli.main`. This
file only adapts the environment:

1. The base is read from the OCI layout in $SERVIMG_BASE_LAYOUT (a store path assembled from
   fixed-output blobs) instead of the definition's `base.ref` (e.g. `docker-daemon:`, unreachable here),
   through servimg's base-source seam (`servimg.assembly.defaults.FromRef`, as `servimg build --base-from`).
   servimg still selects the manifest by the definition's pinned digest and verifies every blob; the
   definition, the lock and the image labels keep `base.ref`. When the pin names a multi-platform
   index, the platform manifest is the one the lock recorded ($SERVIMG_BASE_MANIFEST; nix/base.nix
   checked that the pinned index lists it) instead of asking the registry.
2. `unshare`/`chroot` come from $PATH (a Nix build has no /usr/bin): servimg's `bytecode.tool` searches
   $PATH first, so nothing needs adapting.
3. When not root (a sandboxed Nix build runs as uid 1000), the whole run is re-executed once inside
   `unshare --user --map-root-user`, so the chroot runner and the probe's chroot may chroot (a stopgap:
   docs/nix.md, "Changes wanted in servimg").

Environment (set by the derivation; nothing else is read):
  build-image:  SERVIMG_SRC (repository: images/, overlays/), SERVIMG_DEFINITION (images/<name>.yaml),
                SERVIMG_BASE_LAYOUT, SERVIMG_BASE_MANIFEST, SERVIMG_BASE_INDEX ("" unless the pin
                is an index), SERVIMG_LOCK_DIGEST (what nix/lock.nix computed), out, TMPDIR
  verify-image: SERVIMG_IMAGE_ARCHIVE (a docker-archive), out, TMPDIR
Outputs: build-image writes $out/image.tar (docker-archive), $out/digest (the OCI manifest digest),
$out/build.json (servimg's --json result); verify-image writes $out/verify.json.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

USERNS_MARK = "SERVIMG_SANDBOXED_IN_USERNS"


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        sys.exit(f"servimg-sandboxed: ${name} is not set (this script is a Nix builder; see nix/image.nix)")
    return value


def _become_root() -> None:
    """Stopgap 3: re-exec once in a user namespace where we are root (chroot needs CAP_SYS_CHROOT)."""
    if os.geteuid() == 0:
        return
    if os.environ.get(USERNS_MARK):
        sys.exit("servimg-sandboxed: still not root inside `unshare --user --map-root-user`")
    unshare = shutil.which("unshare")
    if unshare is None:
        sys.exit("servimg-sandboxed: not root and no `unshare` on $PATH (util-linux)")
    env = {**os.environ, USERNS_MARK: "1"}
    os.execve(unshare, [unshare, "--user", "--map-root-user", sys.executable, *sys.argv], env)


def _seams(base_layout: str) -> Any:
    """The build's base source (a seam servimg takes, nothing patched): the OCI layout in the store.

    servimg still selects the manifest by the definition's pinned digest and verifies every blob; the
    lock and the labels keep `base.ref`. For a pin that names a multi-platform index, the platform
    manifest is the one the lock recorded (nix/base.nix checked that the pinned index lists it)."""
    import dataclasses

    from servimg.assembly.defaults import FromRef, default_seams, probe_host

    index, manifest = os.environ.get("SERVIMG_BASE_INDEX", ""), os.environ.get("SERVIMG_BASE_MANIFEST", "")
    manifests = {index: manifest} if index and manifest else {}
    source = FromRef(f"oci:{base_layout}", manifests=manifests)
    return dataclasses.replace(default_seams(probe_host()), base_source=source)


def _run_cli(argv: list[str], seams: Any = None) -> list[dict[str, Any]]:
    from servimg.cli import main

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        rc = main(argv, seams=seams)
    text = buffer.getvalue()
    sys.stderr.write(text)
    results = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    if rc != 0 or not results or any(r.get("status") != "OK" for r in results):
        sys.exit(f"servimg-sandboxed: `servimg {' '.join(argv)}` failed (exit {rc})")
    return results


def build_image() -> None:
    src = Path(_env("SERVIMG_SRC"))
    definition = _env("SERVIMG_DEFINITION")
    base_layout = _env("SERVIMG_BASE_LAYOUT")
    out = Path(_env("out"))
    cache = Path(_env("TMPDIR")) / "servimg-cache"
    os.chdir(src)
    argv = ["build", definition, "--runner", "chroot", "--to", f"docker-archive:{out}/image.tar"]
    (result,) = _run_cli([*argv, "--json", "--cache", str(cache)], _seams(base_layout))
    expected = os.environ.get("SERVIMG_LOCK_DIGEST")
    if expected and result.get("lock_digest") != expected:
        sys.exit(
            f"servimg-sandboxed: servimg built from lock {result.get('lock_digest')}, "
            f"but nix/lock.nix evaluated {expected}"
        )
    (out / "digest").write_text(str(result["digest"]) + "\n")
    (out / "build.json").write_text(json.dumps(result, sort_keys=True, indent=2) + "\n")


def verify_image() -> None:
    archive = _env("SERVIMG_IMAGE_ARCHIVE")
    out = Path(_env("out"))
    cache = Path(_env("TMPDIR")) / "servimg-cache"
    (result,) = _run_cli(["verify", f"docker-archive:{archive}", "--json", "--cache", str(cache)])
    out.mkdir()
    (out / "verify.json").write_text(json.dumps(result, sort_keys=True, indent=2) + "\n")


def main(argv: list[str]) -> None:
    modes = {"build-image": build_image, "verify-image": verify_image}
    if len(argv) != 1 or argv[0] not in modes:
        sys.exit(__doc__)
    _become_root()
    modes[argv[0]]()


if __name__ == "__main__":
    main(sys.argv[1:])
