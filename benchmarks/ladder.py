"""Ladder timing: arm wall times and the harness's overhead, from one or more ladder receipts.

Every receipt carries, per arm, `timing.wall_s` (from the arm's start to its last answer), `server_start_s`
(container start → /health answering 200), `requests_s` (waiting for completions) and `harness_s` (the
rest: creating the container, metric scrapes before/after every request, the tokenization check,
witness collection, bookkeeping). Stopping and removing a container happens after the arm and is in the
run's `run_wall_s` only. This script prints a table and the totals.

Usage:
    servimg ladder IMAGE --ladder verify/ladders/cpu-smoke.yaml --out out/ladder     # makes a receipt
    .venv/bin/python benchmarks/ladder.py out/ladder/receipt.json [more receipts…] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for arm in doc["arms"]:
        t = arm.get("timing") or {}
        wall = float(t.get("wall_s") or 0.0)
        out.append(
            {
                "ladder": doc["ladder"]["name"],
                "arm": arm["id"],
                "server": arm["spec"]["server"],
                "wall_s": wall,
                "server_start_s": t.get("server_start_s"),
                "requests_s": t.get("requests_s"),
                "harness_s": t.get("harness_s"),
                "harness_fraction": round(float(t.get("harness_s") or 0.0) / wall, 4) if wall else None,
                "requests": len(arm.get("requests") or []),
            }
        )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("receipts", nargs="+", type=Path)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    table = []
    totals = []
    for path in args.receipts:
        doc = json.loads(path.read_text())
        table += rows(doc)
        totals.append({"ladder": doc["ladder"]["name"], "verdict": doc["verdict"], **doc["timing"]})
    if args.json:
        print(json.dumps({"arms": table, "runs": totals}, indent=1))
        return 0
    head = ("ladder", "arm", "server", "wall s", "start s", "req s", "harness s", "harn %")
    print("{:<20} {:<9} {:<12} {:>8} {:>8} {:>7} {:>9} {:>7}".format(*head))
    for r in table:
        frac = "" if r["harness_fraction"] is None else f"{100 * r['harness_fraction']:.2f}"
        start, req, harness = r["server_start_s"] or 0, r["requests_s"] or 0, r["harness_s"] or 0
        print(
            f"{r['ladder']:<20} {r['arm']:<9} {r['server']:<12} {r['wall_s']:>8.1f} "
            f"{start:>8.1f} {req:>7.2f} {harness:>9.2f} {frac:>7}"
        )
    for t in totals:
        print(
            f"{t['ladder']}: {t['verdict']}; arms {t['arms_wall_s']:.1f}s, harness {t['harness_s']:.2f}s "
            f"({100 * (t['harness_fraction'] or 0):.2f}% of arm wall time), "
            f"whole run {t.get('run_wall_s', 0):.1f}s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
