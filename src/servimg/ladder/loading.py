"""A ladder as read from its file: the definition, its probe set pinned by sha256 beside it, and the
prompts each arm runs (`load`, `LoadedLadder`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from servimg.core.digest import sha256_hex
from servimg.core.errors import LadderError
from servimg.ladder.definition import ArmSpec, LadderDefinition
from servimg.ladder.probeset import Family, ProbeSet, Prompt, probe_problems

# ------------------------------------------------------------------------------------------- loading


@dataclass(frozen=True)
class LoadedLadder:
    """A ladder with its probe set, both verified, and the exact bytes they were read from."""

    definition: LadderDefinition
    probes: ProbeSet
    ladder_path: Path
    probes_path: Path
    ladder_bytes: bytes
    probes_bytes: bytes
    # The ladder's instrument (definition `instrument:`), verified against its pin; None without one.
    instrument_path: Path | None = None
    instrument_bytes: bytes = b""

    @property
    def ladder_sha256(self) -> str:
        return sha256_hex(self.ladder_bytes)

    @property
    def probes_sha256(self) -> str:
        return sha256_hex(self.probes_bytes)

    def prompts_for(self, arm: ArmSpec) -> tuple[tuple[Family, Prompt], ...]:
        """What `arm` sends, in order: its own `prompts` (checked at load), else the whole probe set."""
        if not arm.prompts:
            return self.probes.prompts
        by_id = {prompt.id: (family, prompt) for family, prompt in self.probes.prompts}
        return tuple(by_id[prompt_id] for prompt_id in arm.prompts)


def load(path: Path, *, root: Path | None = None) -> LoadedLadder:
    """Read and validate a ladder and its probe set; the probe path is relative to `root` (default: the
    repository holding `verify/ladders/`), else found beside the ladder (a bundled copy in an image)."""
    ladder_bytes = _read(path, "ladder definition")
    ladder = LadderDefinition.parse(ladder_bytes, origin=str(path))
    probes_path, probes_bytes = _pinned(
        path, ladder.probes.path, ladder.probes.sha256, root, "probe set",
        "the probe set is frozen: restore it, or pin the new sha256 deliberately (a new ladder)",
    )  # fmt: skip
    probes = ProbeSet.parse(probes_bytes, origin=str(probes_path))
    problems = probe_problems(ladder, probes)
    if problems:
        raise LadderError(f"{probes_path}: the probe set cannot exercise this ladder", problems=problems)
    instrument_path, instrument_bytes = None, b""
    if ladder.instrument is not None:
        instrument_path, instrument_bytes = _pinned(
            path, ladder.instrument.path, ladder.instrument.sha256, root, "instrument",
            "the instrument is pre-registered: restore it, or pin the new sha256 deliberately",
        )  # fmt: skip
    return LoadedLadder(
        ladder, probes, path, probes_path, ladder_bytes, probes_bytes, instrument_path, instrument_bytes
    )


def _pinned(
    ladder_path: Path, relative: str, sha256: str, root: Path | None, what: str, hint: str
) -> tuple[Path, bytes]:
    """A file the ladder pins by sha256 (found like the probe set): its path and verified bytes."""
    found = resolve_pinned_path(ladder_path, relative, root)
    data = _read(found, what)
    actual = sha256_hex(data)
    if actual != sha256:
        raise LadderError(f"{found} has sha256 {actual}, the ladder pins {sha256}", hint=hint)
    return found, data


def resolve_pinned_path(ladder_path: Path, probes: str, root: Path | None) -> Path:
    if root is None:
        parent = ladder_path.resolve().parent
        root = (
            parent.parent.parent if (parent.name == "ladders" and parent.parent.name == "verify") else parent
        )
    candidate = root / probes
    if candidate.is_file():
        return candidate
    beside = ladder_path.resolve().parent / Path(probes).name
    return beside if beside.is_file() else candidate


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise LadderError(f"cannot read {what} {path}: {exc.strerror}") from None
