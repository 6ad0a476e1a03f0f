"""Pre-registration: everything a ladder run is judged by, hashed before the first arm and again before
every arm and at the end (a run whose inputs changed is INVALID): the ladder, the probe set, the
thresholds, the harness's own source files, the run variables and the model files."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from servimg.core import canonical
from servimg.core.digest import sha256_hex
from servimg.ladder.loading import LoadedLadder

HARNESS_MODULES = (
    "ladder/runner",
    "ladder/prereg",
    "ladder/server",
    "ladder/vllm",
    "ladder/definition",
    "ladder/loading",  # reads the definition and its pinned probe set
    "ladder/readers",  # the parser the definition and probe set were read with
    "ladder/evaluation",
    "ladder/receipt",
    "ladder/tinymodel",
    "inimage/tinymodel_gen",
    "inimage/cpu_permissions",  # run by every server process when the ladder asks for CPU permissions
)


def harness_files() -> dict[str, str]:
    """sha256 of the harness's own source: what judged the run is part of what was pre-registered."""
    package = Path(__file__).resolve().parents[1]
    return {f"servimg/{m}.py": sha256_hex((package / f"{m}.py").read_bytes()) for m in HARNESS_MODULES}


def tree_hashes(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): sha256_hex(p.read_bytes())
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


@dataclass(frozen=True)
class Inputs:
    """Everything pre-registered; `sha256` is over the canonical JSON of `as_json()`."""

    ladder_path: str
    ladder_sha256: str
    probes_path: str
    probes_sha256: str
    thresholds_sha256: str
    harness: Mapping[str, str]
    variables: Mapping[str, str]
    model_files: Mapping[str, str]
    # The ladder's instrument (path, sha256); left out when the ladder has none.
    instrument: Mapping[str, str] | None = None

    def as_json(self) -> dict[str, object]:
        instrument = {"instrument": dict(self.instrument)} if self.instrument is not None else {}
        return instrument | {
            "ladder": {"path": self.ladder_path, "sha256": self.ladder_sha256},
            "probes": {"path": self.probes_path, "sha256": self.probes_sha256},
            "thresholds_sha256": self.thresholds_sha256,
            "harness": dict(self.harness),
            "vars": dict(self.variables),
            "model_files": dict(self.model_files),
        }

    @property
    def sha256(self) -> str:
        return sha256_hex(canonical.dumps(self.as_json()))


def capture_inputs(loaded: LoadedLadder, variables: Mapping[str, str], model_dir: Path | None) -> Inputs:
    """Hash the inputs from disk (so a later call sees edits made while the run was going)."""
    return Inputs(
        str(loaded.ladder_path),
        sha256_hex(loaded.ladder_path.read_bytes()),
        str(loaded.probes_path),
        sha256_hex(loaded.probes_path.read_bytes()),
        loaded.definition.thresholds_sha256,
        harness_files(),
        dict(sorted(variables.items())),
        tree_hashes(model_dir) if model_dir is not None else {},
        (
            {"path": str(loaded.instrument_path), "sha256": sha256_hex(loaded.instrument_path.read_bytes())}
            if loaded.instrument_path is not None
            else None
        ),
    )


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
