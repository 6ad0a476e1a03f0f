"""Code that runs inside the image (src/servimg/inimage/) runs on the image's interpreter, not ours.

An image may carry any Python from 3.9 to 3.13 and nothing but its standard library (the probe and the
witness hook are copied into every image as lone files; the compile helper runs with `-S -s`). So every
file there: imports only the standard library at module level, imports only the standard library inside
functions too (except tinymodel_gen, which runs in the CPU vLLM image and declares what it uses from it),
has no relative import (each runs as a lone file), and parses with the Python 3.9 grammar, here and on
every older interpreter this machine has.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from servimg import inimage

INIMAGE = Path(inimage.__file__).parent
FILES = sorted(p for p in INIMAGE.glob("*.py") if p.name != "__init__.py")

# What tinymodel_gen may import inside its functions: the CPU vLLM image's own packages (the model is
# generated there, with the versions the ladder then serves). Nothing else in inimage/ imports any.
IMAGE_SIDE = {"tinymodel_gen.py": {"numpy", "torch", "transformers", "tokenizers", "safetensors"}}
# Standard-library modules that are not in this interpreter's list: `_sha2` is 3.12+'s name for the
# `_sha256` accelerator (the witness hook tries both; this host may be 3.11).
STDLIB = set(sys.stdlib_module_names) | {"__future__", "_sha2"}
OLDEST = (3, 9)


def _imports(tree: ast.Module) -> tuple[set[str], set[str], list[int]]:
    """(top-level names imported at module level, those imported anywhere else, relative-import lines)."""
    module_level = {id(node) for node in tree.body}
    top: set[str] = set()
    nested: set[str] = set()
    relative = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                relative.append(node.lineno)
            names = {(node.module or "").split(".")[0]}
        else:
            continue
        (top if id(node) in module_level else nested).update(names)
    return top, nested, relative


def test_inimage_code_is_stdlib_only_and_python_3_9() -> None:
    assert {p.name for p in FILES} >= {"probe.py", "witness_hook.py", "compile.py", "tinymodel_gen.py"}
    problems = []
    for path in FILES:
        tree = ast.parse(path.read_text(), str(path), feature_version=OLDEST)  # no match, no 3.10+ syntax
        top, nested, relative = _imports(tree)
        assert top, f"{path.name}: parsed no imports?"
        problems += [f"{path.name}: module-level import of {m}" for m in sorted(top - STDLIB)]
        allowed = STDLIB | IMAGE_SIDE.get(path.name, set())
        problems += [f"{path.name}: function-level import of {m}" for m in sorted(nested - allowed)]
        problems += [f"{path.name}:{line}: relative import (it runs as a lone file)" for line in relative]
    assert problems == []


def _version(exe: str) -> tuple[int, int] | None:
    """The (major, minor) an interpreter reports, or None when it does not run (a pyenv shim for a
    version that is not selected exits 127)."""
    try:
        done = subprocess.run(
            [exe, "-I", "-c", "import sys; print(*sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except OSError:
        return None
    parts = done.stdout.split()
    return (int(parts[0]), int(parts[1])) if done.returncode == 0 and len(parts) == 2 else None


def _older_interpreters() -> dict[tuple[int, int], str]:
    """One working interpreter per Python version from 3.9 up to (not including) this one: on PATH,
    in /usr/bin or /usr/local/bin, or installed by pyenv."""
    found: dict[tuple[int, int], str] = {}
    for minor in range(OLDEST[1], sys.version_info[1]):
        name = f"python3.{minor}"
        candidates = [shutil.which(name), f"/usr/bin/{name}", f"/usr/local/bin/{name}"]
        candidates += [str(p) for p in sorted(Path.home().glob(f".pyenv/versions/3.{minor}*/bin/{name}"))]
        for exe in candidates:
            if exe and Path(exe).is_file() and _version(exe) == (3, minor):
                found[(3, minor)] = exe
                break
    return found


@pytest.mark.skipif(not _older_interpreters(), reason="no Python older than this one on the machine")
def test_inimage_code_compiles_on_every_older_interpreter_present() -> None:
    """The grammar check above is ast's emulation; an older interpreter, where one is installed, is the
    real thing."""
    for exe in _older_interpreters().values():
        for path in FILES:
            done = subprocess.run(
                [exe, "-I", "-c", "import sys; compile(open(sys.argv[1]).read(), sys.argv[1], 'exec')", path],
                capture_output=True,
                text=True,
            )
            assert done.returncode == 0, f"{exe} {path.name}: {done.stderr}"
