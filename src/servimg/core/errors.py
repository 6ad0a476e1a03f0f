"""One base error for everything servimg refuses, with a hint that says what to do next.

Errors are wrapped with context as they travel outwards ("applying overlay vllm-gate: …") so that the
message a user reads names the input that was wrong, and `diagnostics()` names the next command to run.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence


class ServimgError(Exception):
    """Base error. `problems` lists every collected problem (validators collect all, then raise once)."""

    def __init__(self, message: str, *, hint: str = "", problems: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.problems: tuple[str, ...] = tuple(problems)

    def __str__(self) -> str:
        if not self.problems:
            return self.message
        return self.message + "\n" + "\n".join(f"  - {p}" for p in self.problems)

    def diagnostics(self) -> str:
        """A human hint: what to do next (may be empty)."""
        return self.hint

    def context(self, what: str) -> ServimgError:
        """Return a copy of this error whose message is prefixed with `what`: same class, hint, problems
        and every attribute a subclass carries (a wrapped VerifyFailed keeps its `.report`)."""
        wrapped = type(self).__new__(type(self))
        wrapped.__dict__.update(self.__dict__)
        ServimgError.__init__(wrapped, f"{what}: {self.message}", hint=self.hint, problems=self.problems)
        wrapped.__cause__ = self
        return wrapped

    def as_dict(self) -> dict[str, object]:
        return {
            "error": type(self).__name__,
            "message": self.message,
            "problems": list(self.problems),
            "hint": self.hint,
        }


class HostError(ServimgError):
    """The machine refused: a path of the wrong kind (a file where a directory belongs), a missing parent,
    no permission, a read-only file system, a full disk. A user's mistake or a machine's limit, never a bug
    in servimg: the message names the path, the hint the way out (issue 48 item 6)."""


FULL_DISK_HINT = (
    "free space on that file system, or point SERVIMG_CACHE at a larger disk, or make room in the cache "
    "with `servimg cache prune --max-size SIZE`; nothing was published, run the command again"
)


def host_error(exc: OSError, doing: str = "", *, where: object = None) -> HostError:
    """`exc` as the user reads it: which path, what is wrong with it, and what to do next. `where` names
    the place written to when the error itself names no file (a `write` that ran out of space)."""
    path = exc.filename if exc.filename is not None else (where if where is not None else "a path")
    other = f" (and {exc.filename2})" if exc.filename2 is not None else ""
    prefix = f"{doing}: " if doing else ""
    code = exc.errno
    if code in (errno.ENOSPC, errno.EDQUOT):
        held = f"the device holding {path}" if exc.filename is not None or where is not None else "a device"
        message, hint = f"no space left on {held}", FULL_DISK_HINT
    elif code == errno.EEXIST:
        kind = " (a file)" if os.path.isfile(str(path)) else ""
        message = f"{path} already exists{kind}"
        hint = "choose a path that does not exist yet (a new directory's parents must be directories), "
        hint += "or remove it"
    elif code == errno.ENOTDIR:
        message = f"{path}: a file is where a directory belongs (a part of this path is not a directory)"
        hint = "name a directory, or a new path whose parent is a directory"
    elif code == errno.EISDIR:
        message, hint = f"{path} is a directory, where a file belongs", "name a file, not a directory"
    elif code == errno.ENOENT:
        message = f"{path}: no such file or directory"
        hint = "check the path; a new file's or directory's parent directory must exist (mkdir -p it)"
    elif code in (errno.EACCES, errno.EPERM):
        message, hint = (
            f"{path}: permission denied",
            "choose a place you may write to, or fix its permissions",
        )
    elif code == errno.EROFS:
        message, hint = f"{path} is on a read-only file system", "choose a writable place"
    else:
        message = f"{path}: {exc.strerror or exc}"
        hint = "check the path and the file system it is on, then run the command again"
    return HostError(f"{prefix}{message}{other}", hint=hint)


class DefinitionError(ServimgError):
    """The image definition (images/<name>.yaml) is malformed or inconsistent."""


class LockError(ServimgError):
    """The lock file is malformed, missing, or the inputs drifted from it."""


class OverlayError(ServimgError):
    """A patch does not parse, does not apply exactly, or escapes its package root."""


class LayerError(ServimgError):
    """A layer tarball is malformed, hostile, or does not match its digest."""


class ImageError(ServimgError):
    """An image manifest/config/layout is malformed or inconsistent."""


class BackendError(ServimgError):
    """A base source or sink (engine, registry, layout, archive) failed."""


class RegistryError(BackendError):
    """The OCI registry refused, failed, or was unreachable."""


class BytecodeError(ServimgError):
    """Compiling with the image's own interpreter failed, or the interpreter was not found."""


def collect(problems: Sequence[str], error: type[ServimgError], message: str, hint: str = "") -> None:
    """Raise `error` once with every problem, if there are any."""
    if problems:
        raise error(message, hint=hint, problems=problems)


class BuildError(ServimgError):
    """The build could not proceed (runner, interpreter, target)."""


class BaseBuildError(ServimgError):
    """A locally built base (demo, CPU vLLM, test bases) could not be built from its pins."""


class DigestError(ServimgError):
    """A digest string is malformed or uses an unsupported algorithm."""


class ReferenceParseError(ServimgError):
    """An image reference (HOST/REPO:TAG@DIGEST, docker-daemon:, oci:, docker-archive:) is malformed."""


class StoreError(ServimgError):
    """The local blob cache is missing a blob or holds one that does not match its digest."""


class RebaseError(ServimgError):
    """An overlay stack does not carry over onto a new base (or the rebase could not be prepared)."""


class UsageError(ServimgError):
    """The command line asks for something inconsistent."""


class ModelError(ServimgError):
    """The tiny model servimg builds for the CPU ladder could not be built or used."""


class VerifyError(ServimgError):
    """The probe could not be prepared or run, or its report is unreadable."""


class WitnessError(ServimgError):
    """A serving process ran code that is not the patched code, or its witness records are unusable."""


class LadderError(ServimgError):
    """A ladder definition or probe set is malformed, or does not match its pin."""


class LadderRunError(ServimgError):
    """The ladder could not run (no image, a bad variable, a server that never came up …)."""
