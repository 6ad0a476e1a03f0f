"""Ladder wall time, local (arms one after another) vs `--on slurm` (one job per chain), from two runs of
the same ladder on the same image, and the N-node model: wall ≈ slowest chain + submission overhead.

Inputs: the local run's receipt directory and the Slurm run's (`--out`, the shared results directory: its
`jobs/chain-N.json` carry each job's start and finish on the node, second resolution). Per chain: the sum
of its arms' wall times as the local run measured them (what the chain costs on a node of its own) and
the job's time on its node (pull by digest + pre-registration check + arms + container removal).
Overhead = Slurm wall − the longest job: sbatch, scheduling, the polling interval, collecting.

Usage:
    servimg ladder IMAGE --out out/local …
    servimg ladder HOST/REPO@sha256:… --on slurm --out out/slurm …
    .venv/bin/python benchmarks/ladder_slurm.py out/local out/slurm [--json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any


def _load(path: Path) -> dict[str, Any]:
    doc = json.loads(path.read_text())
    assert isinstance(doc, dict)
    return doc


def _seconds(start: str | None, end: str | None) -> float | None:
    if not start or not end:
        return None
    fmt = "%Y-%m-%dT%H:%M:%SZ"
    return (dt.datetime.strptime(end, fmt) - dt.datetime.strptime(start, fmt)).total_seconds()


def compare(local_dir: Path, slurm_dir: Path) -> dict[str, Any]:
    local, on_slurm = _load(local_dir / "receipt.json"), _load(slurm_dir / "receipt.json")
    arm_wall = {a["id"]: float((a.get("timing") or {}).get("wall_s") or 0.0) for a in local["arms"]}
    chains = []
    for job in on_slurm["placement"]["jobs"]:
        status = _load(slurm_dir / "jobs" / f"chain-{job['chain']}.json")
        chains.append(
            {
                "chain": job["chain"],
                "arms": job["arms"],
                "job_id": job["job_id"],
                "node": job["node"],
                "local_arms_s": round(sum(arm_wall.get(a, 0.0) for a in job["arms"]), 1),
                "job_on_node_s": _seconds(status.get("started_at"), status.get("finished_at")),
            }
        )
    local_wall = float(local["timing"]["run_wall_s"])
    slurm_wall = float(on_slurm["timing"]["run_wall_s"])
    longest_job = max((c["job_on_node_s"] or 0.0) for c in chains)
    slowest_chain = max(c["local_arms_s"] for c in chains)
    return {
        "ladder": local["ladder"]["name"],
        "verdicts": [local["verdict"], on_slurm["verdict"]],
        "local_wall_s": round(local_wall, 1),
        "slurm_wall_s": round(slurm_wall, 1),
        "speedup": round(local_wall / slurm_wall, 2) if slurm_wall else None,
        "chains": chains,
        "longest_job_s": longest_job,
        "overhead_s": round(slurm_wall - longest_job, 1),
        "model_n_nodes_s": round(slowest_chain + (slurm_wall - longest_job), 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("local", type=Path, help="the local run's --out directory")
    parser.add_argument("slurm", type=Path, help="the Slurm run's --out directory")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = compare(args.local, args.slurm)
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"ladder {result['ladder']} ({' / '.join(result['verdicts'])})")
    print("| chain | arms | job | node | arms' wall s (local run) | job on node s |")
    print("|---|---|---|---|---|---|")
    for c in result["chains"]:
        arms = " → ".join(c["arms"])
        print(
            f"| {c['chain']} | {arms} | {c['job_id']} | {c['node']} | {c['local_arms_s']} "
            f"| {c['job_on_node_s']} |"
        )
    print(
        f"local sequential {result['local_wall_s']} s, slurm {result['slurm_wall_s']} s "
        f"(×{result['speedup']}); overhead {result['overhead_s']} s; "
        f"N-node model (slowest chain + overhead) {result['model_n_nodes_s']} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
