"""Running another platform's binaries here: qemu-user through the kernel's binfmt_misc.

A base for linux/arm64 is bootstrapped, and an arm64 image's own interpreter compiles and probes it, on an
amd64 host by running its binaries under qemu (Debian's qemu-user-static registers the handlers). The
handler needs the F flag (the interpreter opened when it is registered): the chroots servimg runs in hold
no qemu binary of their own. `require` says exactly what is missing before anything starts, and what to run.
"""

from __future__ import annotations

from pathlib import Path

from servimg.core.errors import BuildError
from servimg.core.platform import Platform

BINFMT = Path("/proc/sys/fs/binfmt_misc")
# The binfmt_misc handler qemu-user-static registers for each architecture servimg builds.
HANDLERS = {"arm64": "qemu-aarch64", "amd64": "qemu-x86_64"}
SETUP_HINT = (
    "run `bash scripts/setup.sh` (installs qemu-user-static, mounts binfmt_misc, registers the handlers)"
)


def problem(platform: Platform, binfmt: Path = BINFMT) -> str | None:
    """Why this host cannot run `platform`'s binaries, or None when it can (natively or emulated)."""
    if not platform.emulated:
        return None
    name = HANDLERS.get(platform.architecture)
    if name is None:
        return f"no emulator known for {platform}"
    if not (binfmt / "status").exists():
        return f"binfmt_misc is not mounted at {binfmt}, so no {platform} binary can run here"
    try:
        lines = (binfmt / name).read_text(encoding="utf-8").splitlines()
    except OSError:
        return f"no binfmt_misc handler {name} is registered for {platform} binaries"
    if "enabled" not in lines:
        return f"the binfmt_misc handler {name} is registered but disabled"
    flags = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("flags:")), "")
    if "F" not in flags:
        return (
            f"the binfmt_misc handler {name} lacks the F flag, so it cannot run inside a chroot or container"
        )
    return None


def require(platform: Platform, what: str, binfmt: Path = BINFMT) -> None:
    """Raise before `what` starts when this host cannot run `platform`'s binaries."""
    found = problem(platform, binfmt)
    if found is not None:
        raise BuildError(
            f"{what} for {platform} needs emulation on this {Platform.host()} host: {found}", hint=SETUP_HINT
        )
