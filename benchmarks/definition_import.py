"""What reading a definition and its lock costs a build: the import of their modules in a fresh
interpreter and a cold `servimg build` of the demo, for one or more checkouts run alternately
(docs/benchmarks.md, "The definition and the lock without pydantic").

A checkout is a directory with src/, images/, overlays/ and verify/ (a worktree, or `git archive REV src
images overlays verify | tar -x -C DIR` for an older revision). The demo's base must be cached
(`servimg base demo`). Builds go to fresh OCI layouts with SERVIMG_NO_RESULT_CACHE=1 (all the work done).

Usage:
    .venv/bin/python benchmarks/definition_import.py --tree /tmp/before --tree . [--runs 5] [--imports 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

IMPORT = "import servimg.definitions.definition, servimg.definitions.lock"


def _timed(argv: list[str], tree: Path, **env: str) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run(
        argv,
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree / "src"), **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return time.perf_counter() - start, proc.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=5, help="cold builds per tree")
    parser.add_argument("--imports", type=int, default=10, help="fresh-interpreter imports per tree")
    args = parser.parse_args()
    trees = [t.resolve() for t in args.tree]
    imports: dict[Path, list[float]] = {t: [] for t in trees}
    builds: dict[Path, list[float]] = {t: [] for t in trees}
    digests: dict[Path, set[str]] = {t: set() for t in trees}
    for _ in range(args.imports):
        for tree in trees:
            imports[tree].append(_timed([sys.executable, "-c", IMPORT], tree)[0])
    with tempfile.TemporaryDirectory() as scratch:
        for i in range(args.runs):
            for n, tree in enumerate(trees):
                out = Path(scratch) / f"out-{n}-{i}"
                argv = [sys.executable, "-m", "servimg", "build", "images/demo.yaml", "--to", f"oci:{out}"]
                seconds, stdout = _timed([*argv, "--quiet", "--json"], tree, SERVIMG_NO_RESULT_CACHE="1")
                builds[tree].append(seconds)
                digests[tree].add(json.loads(stdout)["digest"])
    for tree in trees:
        print(
            f"{tree}: import median {statistics.median(imports[tree]):.2f} s, "
            f"cold build median {statistics.median(builds[tree]):.2f} s "
            f"({', '.join(f'{s:.2f}' for s in builds[tree])}), digest(s) {sorted(digests[tree])}"
        )


if __name__ == "__main__":
    main()
