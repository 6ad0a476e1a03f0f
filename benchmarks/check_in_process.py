"""`servimg check REF` in the process the user started, this checkout against another one (docs/benchmarks.md,
"Issue 39"): what a deployer waits on when a gate checks a pulled tag.

Each round runs `python -m servimg check REF --key PUB --json --quiet` once with this checkout's code and
once with `--before DIR`'s (DIR/src on PYTHONPATH; `SERVIMG_SERVER=0`, so a checkout from before issue 39
runs in-process too rather than through its resident server), the order alternating round by round; both
must print the same status. Also `python -X importtime` of each checkout's `servimg.commands.provenance`
(what `check` imports), cumulative microseconds of the top-level import.

    .venv/bin/python benchmarks/check_in_process.py --ref HOST/REPO:TAG --key keys/servimg.pub \
        --before ../before-checkout --runs 7 [--json out.json]
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

REPO = Path(__file__).resolve().parent.parent


def env_for(checkout: Path) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(checkout / "src"), SERVIMG_SERVER="0")


def check(checkout: Path, ref: str, key: Path) -> tuple[float, str]:
    argv = [sys.executable, "-m", "servimg", "check", ref, "--key", str(key), "--json", "--quiet"]
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env_for(checkout))
    took = time.perf_counter() - start
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    status = json.loads(lines[-1]).get("status", "?") if lines else f"exit {proc.returncode}"
    return took, str(status)


def import_us(checkout: Path) -> int:
    argv = [sys.executable, "-X", "importtime", "-c", "import servimg.commands.provenance"]
    err = subprocess.run(argv, capture_output=True, text=True, env=env_for(checkout)).stderr
    for line in err.splitlines():
        if line.rstrip().endswith("| servimg.commands.provenance"):
            return int(line.split("|")[1])
    return -1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", required=True)
    ap.add_argument("--key", type=Path, required=True)
    ap.add_argument("--before", type=Path, required=True)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    sides = {"after": REPO, "before": args.before.resolve()}
    times: dict[str, list[float]] = {name: [] for name in sides}
    statuses: dict[str, set[str]] = {name: set() for name in sides}
    imports: dict[str, list[int]] = {name: [] for name in sides}
    for i in range(args.runs):
        for name in list(sides) if i % 2 == 0 else list(reversed(sides)):
            took, status = check(sides[name], args.ref, args.key)
            times[name].append(took)
            statuses[name].add(status)
            imports[name].append(import_us(sides[name]))
    result = {
        name: {
            "median_s": round(statistics.median(times[name]), 3),
            "times_s": [round(t, 3) for t in times[name]],
            "status": sorted(statuses[name]),
            "import_provenance_median_ms": round(statistics.median(imports[name]) / 1000, 1),
        }
        for name in sides
    }
    result["ratio_after_over_before"] = round(
        statistics.median(a / b for a, b in zip(times["after"], times["before"], strict=True)), 3
    )
    result["load_average"] = list(os.getloadavg())
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
