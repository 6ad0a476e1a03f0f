"""Witness overhead: interpreter start-up and imports with and without the `.pth` hook, inside real images.

Builds the tiny test image (tests/fixtures/images/tiny.yaml on the local test base) with `witness: true`
for each Debian release, then runs ONE container per image that spawns the image's interpreter `--runs`
times per case WITH the hook and as many times WITHOUT it, interleaved pair by pair (A/B, then B/A), so
that machine load hits both alike. "Without" is the same image with `servimg-witness.pth` renamed away
for that run: same interpreter, same files, the hook neither imported nor installed. Cases:

    startup    python -c pass                                (the .pth imports the hook and installs it)
    overlay    python -c 'import tinypkg.core'                (a watched module: one record, one JSON write)
    stdlib     python -c 'import asyncio, email.mime…, …'     (hundreds of unwatched imports: per-event cost)

Reported: medians with and without, and the median of the paired differences; a start-up breakdown
(`python -c pass` with the .pth empty / holding `import tinypkg.util` / `import servimg_witness` / the
real line, interleaved: any first import from site-packages costs the same path-finder set-up, which a
service pays anyway); `-X importtime` self time of `servimg_witness` and `tinypkg.core`; the per-call
cost of the hook on two frequent audited calls (`open`, `sys._getframe`), timeit in one process with and
without the hook (median of 5 each).

Usage (root, Docker Engine, debootstrap; the test bases are cached after the first run):
    .venv/bin/python benchmarks/witness.py --runs 31 [--suites bookworm trixie] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from servimg.assembly.context import Context  # noqa: E402
from servimg.assembly.defaults import default_seams, probe_host  # noqa: E402
from servimg.assembly.pipeline import build, lock  # noqa: E402
from servimg.assembly.plan import BuildPlan  # noqa: E402
from servimg.backends.engine import client  # noqa: E402
from servimg.backends.target import Target  # noqa: E402
from servimg.bases import catalog as bases  # noqa: E402
from servimg.bases.assemble import base_image  # noqa: E402
from servimg.oci.store import BlobStore  # noqa: E402

HOST_SEAMS = default_seams(probe_host())  # what servimg does on this host, as its CLI runs it

STDLIB = (
    "import asyncio, argparse, concurrent.futures, csv, dataclasses, decimal, email.mime.multipart, "
    "http.client, json, logging.handlers, multiprocessing, pathlib, sqlite3, subprocess, tarfile, "
    "typing, unittest, urllib.request, uuid, xml.etree.ElementTree, zipfile"
)
CASES = {"startup": "pass", "overlay": "import tinypkg.core", "stdlib": STDLIB}

# Runs inside the image, under its interpreter with -I (the runner itself must not carry the hook).
IN_IMAGE = r"""
import glob, json, os, statistics, subprocess, sys, time
python, runs, cases = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
pth = glob.glob("/opt/venv/lib/python3*/site-packages/servimg-witness.pth")[0]
env = {"PATH": "/usr/bin:/bin", "SERVIMG_WITNESS_DIR": "/tmp/witness"}

def hook(on):
    if os.path.exists(pth) != on:
        os.rename(pth + ".off", pth) if on else os.rename(pth, pth + ".off")

def run(argv, **kw):
    return subprocess.run([python, *argv], env=env, check=True, **kw)

out = {}
for name, code in cases.items():
    for on in (True, False):
        hook(on)
        run(["-c", code])  # warm the page cache
    times = {True: [], False: []}
    for i in range(runs):
        for on in ((True, False) if i % 2 else (False, True)):
            hook(on)
            t0 = time.perf_counter()
            run(["-c", code])
            times[on].append(time.perf_counter() - t0)
    diffs = [(a - b) * 1e3 for a, b in zip(times[True], times[False])]
    out[name] = {
        "with_ms": statistics.median(times[True]) * 1e3,
        "without_ms": statistics.median(times[False]) * 1e3,
        "paired_diff_ms": statistics.median(diffs),
    }
# Start-up breakdown: what the .pth line holds, interleaved. The first import from site-packages sets up
# its path finder; a service pays that anyway, so `import tinypkg.util` is the fair baseline.
hook(True)
line = open(pth).read()
variants = {"empty": "", "any_site_import": "import tinypkg.util\n"}
variants.update({"hook_import": "import servimg_witness\n", "hook_installed": line})
spent = {k: [] for k in variants}
for i in range(runs):
    for k in (list(variants) if i % 2 else list(variants)[::-1]):
        with open(pth, "w") as fh:
            fh.write(variants[k])
        t0 = time.perf_counter()
        run(["-c", "pass"])
        spent[k].append(time.perf_counter() - t0)
with open(pth, "w") as fh:
    fh.write(line)
out["startup_breakdown_ms"] = {k: statistics.median(v) * 1e3 for k, v in spent.items()}
selfs = {"servimg_witness": [], "tinypkg.core": []}
for _ in range(runs):
    err = run(["-X", "importtime", "-c", "import tinypkg.core"], capture_output=True, text=True).stderr
    for line in err.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) == 3 and parts[2] in selfs:
            selfs[parts[2]].append(int(parts[0].split()[-1]))
out["importtime_self_us"] = {k: statistics.median(v) if v else None for k, v in selfs.items()}
micro = ("import timeit, sys; "
         "o = timeit.timeit('open(\"/dev/null\").close()', number=100000) / 100000 * 1e9; "
         "f = timeit.timeit('sys._getframe()', 'import sys', number=1000000) / 1000000 * 1e9; "
         "print(o, f)")
calls = {True: [], False: []}
for i in range(5):
    for on in ((True, False) if i % 2 else (False, True)):
        hook(on)
        printed = run(["-c", micro], capture_output=True, text=True).stdout
        calls[on].append([float(x) for x in printed.split()])
hook(True)
out["per_call_ns"] = {
    call: {"with": statistics.median(v[k] for v in calls[True]),
           "without": statistics.median(v[k] for v in calls[False])}
    for k, call in enumerate(("open", "sys._getframe"))
}
out["loadavg"] = os.getloadavg()
print(json.dumps(out))
"""


def build_witnessed(suite: str, store: BlobStore, work: Path) -> tuple[str, str]:
    """The tiny image of `suite` built with `witness: true`. Returns (image ID, python version)."""
    recipe = bases.pinned_recipe(f"test-{suite}")
    base = bases.build_base(
        recipe, Context(store, lambda m: None, seams=HOST_SEAMS), targets=[Target.engine()]
    )
    root = work / suite
    shutil.copytree(REPO / "tests" / "fixtures" / "images", root / "images")
    shutil.copytree(REPO / "tests" / "fixtures" / "overlays", root / "overlays")
    path = root / "images" / "tiny.yaml"
    text = path.read_text().replace("oci:FILLED-IN-BY-THE-TEST", base["oci_ref"])
    text = text.replace("sha256:" + "0" * 64, base["digest"])
    path.write_text(text.replace("witness: false", "witness: true"))
    lock(path, Context(store, lambda m: None, seams=HOST_SEAMS), "docker")
    result = build(
        BuildPlan.make(path, to="docker", runner="docker"), Context(store, lambda m: None, seams=HOST_SEAMS)
    )
    python = base_image(recipe, Context(store, lambda m: None, seams=HOST_SEAMS)).labels[
        "io.servimg.test.python"
    ]
    return str(result.images[0].image.config_digest), python


def measure(image: str, runs: int) -> dict[str, Any]:
    argv = ["/usr/bin/python3", "-I", "-c", IN_IMAGE, "/opt/venv/bin/python", str(runs), json.dumps(CASES)]
    logs = client().containers.run(image, argv, entrypoint=[], network_mode="none", remove=True)
    result: dict[str, Any] = json.loads(logs.decode().strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=31)
    parser.add_argument("--suites", nargs="+", default=["bookworm", "trixie"], choices=["bookworm", "trixie"])
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    store = BlobStore()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="servimg-bench-witness-") as tmp:
        for suite in args.suites:
            image, python = build_witnessed(suite, store, Path(tmp))
            results[suite] = {"python": python, "image": image, **measure(image, args.runs)}
    for suite, r in results.items():
        print(f"{suite} (python{r['python']}), median of {args.runs} interleaved pairs, load {r['loadavg']}:")
        for case in CASES:
            c = r[case]
            print(
                f"  {case:8} without {c['without_ms']:7.2f} ms  with {c['with_ms']:7.2f} ms  "
                f"paired difference {c['paired_diff_ms']:+6.2f} ms"
            )
        print(f"  -X importtime self (with the hook): {r['importtime_self_us']} us")
        steps = ", ".join(f"{k} {v:.2f} ms" for k, v in r["startup_breakdown_ms"].items())
        print(f"  python -c pass with the .pth holding: {steps}")
        for call, v in r["per_call_ns"].items():
            print(f"  per call {call:14} without {v['without']:6.0f} ns  with {v['with']:6.0f} ns")
    if args.json:
        args.json.write_text(json.dumps({"runs": args.runs, "results": results}, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
