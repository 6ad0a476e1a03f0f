"""The one result a rebuild of an unchanged definition would otherwise compute again: the compiled
bytecode of the overlay layer.

It is a pure function of its inputs, so it is cached under the sha256 of a canonical document of EVERY
input that can change it (the key), in `<cache>/results/compiled/v1/sha256/<key>.json`: the base chain
(ordered diffIDs: the interpreter and the stdlib it compiles with), the interpreter's path and the facts
the lock pins (version, magic, cache tag), the runner, the compile step itself (sha256 of
servimg/inimage/compile.py and its interpreter flags), and each source (its path in the image, the sha256
of its bytes, its optimisation levels).

An entry (servimg.cache.results) holds its full key document and the sha256 of its value; on read
both are checked (and each pyc's own sha256), so a corrupt, truncated or foreign entry (another key's
file under this name) is ignored and the bytecode compiled and written again. Entries are written
atomically (temp + rename): a reader sees a whole entry or none. No verdict is cached: every build runs
the whole probe (assembly.defaults.ProbeVerifier).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from servimg.cache.results import FORMAT as FORMAT
from servimg.cache.results import OFF as OFF
from servimg.cache.results import bypassed as bypassed
from servimg.cache.results import entry_path as entry_path
from servimg.cache.results import read as read
from servimg.cache.results import write as write
from servimg.core.digest import Digest, sha256_hex
from servimg.patching.bytecode import COMPILE_ARGS, COMPILE_SCRIPT, CompileJob, InterpreterFacts

COMPILED = "compiled"


# -- compiled bytecode -------------------------------------------------------------------------------
def compile_key(
    base_diff_ids: Sequence[Digest],
    interpreter: str,
    pinned: InterpreterFacts,
    runner: str,
    jobs: Sequence[CompileJob],
) -> dict[str, object]:
    return {
        "base_diff_ids": [str(d) for d in base_diff_ids],
        "interpreter": interpreter,
        "pinned": {"version": pinned.version, "magic": pinned.magic, "cache_tag": pinned.cache_tag},
        "runner": runner,
        "compile_script_sha256": sha256_hex(COMPILE_SCRIPT.read_bytes()),
        "compile_args": list(COMPILE_ARGS),
        "jobs": sorted([j.image_path, sha256_hex(j.source), sorted(j.opt_levels)] for j in jobs),
    }


Compiled = tuple[InterpreterFacts, dict[tuple[str, int], bytes]]


def compiled_value(facts: InterpreterFacts, pycs: Mapping[tuple[str, int], bytes]) -> dict[str, object]:
    return {
        "facts": {
            "executable": facts.executable,
            "version": facts.version,
            "magic": facts.magic,
            "cache_tag": facts.cache_tag,
        },
        "pycs": [
            {"path": path, "opt": opt, "sha256": sha256_hex(data), "data": base64.b64encode(data).decode()}
            for (path, opt), data in sorted(pycs.items())
        ],
    }


def read_compiled(value: Any, jobs: Sequence[CompileJob]) -> Compiled | None:
    """A cached value back as (facts, pycs), only when every pyc is whole and there is exactly one per
    job and opt level."""
    try:
        facts = InterpreterFacts(
            **{k: str(value["facts"][k]) for k in ("executable", "version", "magic", "cache_tag")}
        )
        pycs: dict[tuple[str, int], bytes] = {}
        for item in value["pycs"]:
            data = base64.b64decode(item["data"], validate=True)
            if sha256_hex(data) != item["sha256"]:
                return None
            pycs[(str(item["path"]), int(item["opt"]))] = data
    except (KeyError, TypeError, ValueError, binascii.Error):
        return None
    wanted = {(j.image_path, opt) for j in jobs for opt in j.opt_levels}
    return (facts, pycs) if set(pycs) == wanted else None


def compile_cached(
    root: Path,
    base_diff_ids: Sequence[Digest],
    interpreter: str,
    pinned: InterpreterFacts,
    runner: str,
    jobs: Sequence[CompileJob],
    compile: Callable[[], Compiled],
) -> Compiled:
    """`compile()`'s result, from the cache when an entry for exactly these inputs checks out."""
    key = compile_key(base_diff_ids, interpreter, pinned, runner, jobs)
    hit = read(root, COMPILED, key)
    found = read_compiled(hit, jobs) if hit is not None else None
    if found is not None:
        return found
    facts, pycs = compile()
    write(root, COMPILED, key, compiled_value(facts, pycs))
    return facts, pycs
