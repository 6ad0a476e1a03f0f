"""What importing a command's modules costs, before and after a change (docs/benchmarks.md, "Issue 30").

Each module is imported in a fresh interpreter (`python -c "import M"`, bytecode written and warmed once
first), N rounds interleaved between the two checkouts; medians and the after/before ratio.

Usage:
    git worktree add /tmp/wt-before <commit>
    .venv/bin/python benchmarks/imports.py --before /tmp/wt-before --runs 15 \
        [--modules servimg.judging.check,servimg.invocation.session]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODULES = ("servimg.judging.policy", "servimg.judging.check", "servimg.invocation.session")


def _import_s(src: Path, module: str) -> float:
    env = {"PYTHONPATH": str(src), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}  # bytecode allowed
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", f"import {module}"], env=env, check=True)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="a checkout of the commit before")
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--modules", default=",".join(MODULES))
    args = parser.parse_args()
    trees = {"before": args.before / "src", "after": REPO / "src"}
    modules = [m for m in args.modules.split(",") if m]
    for src in trees.values():  # write and warm the bytecode of both
        for module in modules:
            _import_s(src, module)
    times: dict[str, dict[str, list[float]]] = {m: {k: [] for k in trees} for m in modules}
    for _ in range(args.runs):
        for module in modules:
            for name, src in trees.items():
                times[module][name].append(_import_s(src, module))
    out = {}
    for module, by in times.items():
        before, after = statistics.median(by["before"]), statistics.median(by["after"])
        ratio = round(after / before, 3)
        out[module] = {"before_s": round(before, 4), "after_s": round(after, 4), "ratio": ratio}
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
