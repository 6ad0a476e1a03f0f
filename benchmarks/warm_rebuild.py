"""The CLI's start and a warm no-op rebuild, for one or more checkouts (docs/benchmarks.md, "Build").

A rebuild of an unchanged definition with everything cached is near the CLI's own start-up, so this
measures both, interleaved round by round (load drifting over the run hits each alike), per checkout:

- `servimg --help` and `servimg --version` (the console script, PYTHONPATH = the checkout's src);
- `servimg build` of the fake tiny base's definition (tests/fakebase.py: a base without an interpreter,
  so the host's Python compiles and no probe runs) into the same OCI layout again: the CLI's start,
  resolve + drift check, plan, layer write and the layout, i.e. everything but compile and probe, which
  the demo's `warm` section of benchmarks/build_vs_dockerfile.py measures on a real base;
- a bare `python -c pass` (the interpreter's own start, the floor under all of it).

With `--base oci:LAYOUT:TAG --base-digest sha256:…` (a real test base, e.g. the one `servimg base
test-trixie` caches), the rebuilt definition is instead tests/fixtures/images/tiny.yaml on that base,
built by the real CLI (`servimg lock`, then `servimg build`, each checkout with its own cache): its
compile and probe are real, and a warm rebuild on this branch takes both from the result caches.

Usage:
    .venv/bin/python benchmarks/warm_rebuild.py --runs 10 [--checkout DIR ...] [--json out.json]
        [--base oci:DIR:TAG --base-digest sha256:...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CONSOLE = Path(sys.executable).with_name("servimg")

SETUP = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1] + "/tests")
import fakebase as fb
root = Path(sys.argv[2])
base = fb.make_base(root / "base", [fb.tar(fb.package_members())])
d = fb.make_repo(root / "repo", base)
cache = ["--cache", str(root / "cache")]
assert fb.main(["lock", str(d), *cache, "--quiet"]) == 0
assert fb.main(["build", str(d), "--to", "oci:" + str(root / "out"), *cache, "--quiet"]) == 0
"""
BUILD = (
    "import sys; sys.path.insert(0, sys.argv[1] + '/tests'); import fakebase as fb; "
    "sys.exit(fb.main(sys.argv[2:]))"
)


def run(argv: list[str], checkout: Path) -> tuple[float, str]:
    env = dict(os.environ, PYTHONPATH=str(checkout / "src"))
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    return time.perf_counter() - start, proc.stdout


def fake_base(checkout: Path, root: Path) -> list[str]:
    """The fake tiny base's repository, locked and built once; the command that rebuilds it."""
    run([sys.executable, "-c", SETUP, str(checkout), str(root)], checkout)
    definition = root / "repo" / "images" / "tiny.yaml"
    build = ["build", str(definition), "--to", f"oci:{root / 'out'}", "--cache", str(root / "cache")]
    return [sys.executable, "-c", BUILD, str(checkout), *build, "--json", "--quiet"]


def real_base(checkout: Path, root: Path, base: str, digest: str) -> list[str]:
    """tests/fixtures' tiny definition on a real base, locked and built once by the real CLI."""
    shutil.copytree(checkout / "tests" / "fixtures" / "images", root / "images")
    shutil.copytree(checkout / "tests" / "fixtures" / "overlays", root / "overlays")
    definition = root / "images" / "tiny.yaml"
    text = definition.read_text().replace("oci:FILLED-IN-BY-THE-TEST", base)
    definition.write_text(text.replace("sha256:" + "0" * 64, digest))
    cache = ["--cache", str(root / "cache")]
    run([str(CONSOLE), "lock", str(definition), *cache, "--quiet"], checkout)
    build = [
        str(CONSOLE),
        "build",
        str(definition),
        "--to",
        f"oci:{root / 'out'}",
        *cache,
        "--json",
        "--quiet",
    ]
    run(build, checkout)
    return build


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--checkout", type=Path, action="append", default=[])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--base", default=None, help="oci:LAYOUT:TAG of a real test base")
    parser.add_argument("--base-digest", default=None)
    args = parser.parse_args()
    checkouts = args.checkout or [REPO]
    result: dict[str, Any] = {"runs": args.runs, "load_average_before": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="servimg-warm-") as tmp:
        commands: dict[str, dict[str, list[str]]] = {}
        for i, checkout in enumerate(checkouts):
            root = Path(tmp) / str(i)
            warm = (
                real_base(checkout, root, args.base, args.base_digest)
                if args.base
                else fake_base(checkout, root)
            )
            commands[str(checkout)] = {
                "help": [str(CONSOLE), "--help"],
                "version": [str(CONSOLE), "--version"],
                "warm_build": warm,
                "python": [sys.executable, "-c", "pass"],
            }
        times: dict[str, dict[str, list[float]]] = {c: {k: [] for k in cmds} for c, cmds in commands.items()}
        digests: dict[str, set[str]] = {c: set() for c in commands}
        for _ in range(args.runs):
            for checkout, cmds in commands.items():
                for name, argv in cmds.items():
                    took, out = run(argv, Path(checkout))
                    times[checkout][name].append(took)
                    if name == "warm_build":
                        digests[checkout].add(json.loads(out.strip().splitlines()[-1])["digest"])
        for checkout, by_name in times.items():
            result[checkout] = {
                **{f"{name}_median_s": round(statistics.median(t), 3) for name, t in by_name.items()},
                **{f"{name}_s": [round(x, 3) for x in t] for name, t in by_name.items()},
                "warm_build_distinct_digests": len(digests[checkout]),
                "warm_build_digests": sorted(digests[checkout]),
            }
    result["load_average_after"] = os.getloadavg()
    report(result, args.json)
    return 0


def report(result: dict[str, Any], to: Path | None) -> None:
    """The result on stdout, and in `to` when given."""
    text = json.dumps(result, indent=2) + "\n"
    sys.stdout.write(text)
    if to is not None:
        to.write_text(text)


if __name__ == "__main__":
    sys.exit(main())
