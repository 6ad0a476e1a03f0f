"""servimg build of the demo vs an equivalent hand-written Dockerfile on the same base.

The Dockerfile does what people do by hand (docs/design.md, "Why"): COPY the patched files, `sha256sum -c`,
`rm` the pycs, `py_compile` them. Each side builds N times from scratch (Dockerfile: `--no-cache`; servimg:
the image removed from the engine first, so the thin load really happens, verification included). Reports
median wall times, their ratio, and whether each side produced one image ID or several.

Usage (after `bash scripts/setup.sh` and `servimg base demo`):
    .venv/bin/python benchmarks/build_vs_dockerfile.py --runs 5 [--json out.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from servimg.build.definition import ImageDefinition  # noqa: E402
from servimg.build.pipeline import resolve  # noqa: E402
from servimg.oci.store import BlobStore  # noqa: E402

BENCH_REPOSITORY = "servimg-bench/vllm"  # its own repository: the benchmark removes its images
DOCKER = ["docker"]


def sh(*argv: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=True, **kw)  # type: ignore[call-overload]


def bench_definition(tmp: Path) -> Path:
    """A copy of the demo definition whose images go to their own repository, locked."""
    shutil.copytree(REPO / "images", tmp / "images")
    shutil.copytree(REPO / "overlays", tmp / "overlays")
    demo = tmp / "images" / "demo.yaml"
    demo.write_text(demo.read_text().replace("repository: servimg/vllm", f"repository: {BENCH_REPOSITORY}"))
    sh(str(REPO / ".venv" / "bin" / "servimg"), "lock", str(demo), "--quiet")
    return demo


def dockerfile_context(demo: Path, tmp: Path) -> tuple[Path, str]:
    """The patched files (exactly what servimg's overlays produce) plus a Dockerfile that installs them."""
    store = BlobStore()
    resolution = resolve(demo, store, lambda m: None)
    definition = ImageDefinition.load(demo)
    base_ref = definition.base.ref.removeprefix("docker-daemon:")
    lines = [f"FROM {base_ref}"]
    sums, pycs, sources = [], [], []
    for i, change in enumerate(resolution.changes):
        assert change.content is not None
        (tmp / f"f{i}.py").write_bytes(change.content)
        target = "/" + change.path
        lines.append(f"COPY f{i}.py {target}")
        sums.append(f"{hashlib.sha256(change.content).hexdigest()}  {target}")
        directory, name = target.rsplit("/", 1)
        pycs.append(f"{directory}/__pycache__/{name[:-3]}.*.pyc")
        sources.append(target)
    (tmp / "SHA256SUMS").write_text("\n".join(sums) + "\n")
    lines.append("COPY SHA256SUMS /tmp/SHA256SUMS")
    lines.append(
        "RUN sha256sum -c /tmp/SHA256SUMS && rm -f "
        + " ".join(pycs)
        + " && /opt/venv/bin/python -m py_compile "
        + " ".join(sources)
    )
    (tmp / "Dockerfile").write_text("\n".join(lines) + "\n")
    return tmp, base_ref


def time_dockerfile(context: Path, runs: int) -> tuple[list[float], list[str]]:
    times, ids = [], []
    env = dict(os.environ, DOCKER_BUILDKIT="0")
    for i in range(runs):
        start = time.perf_counter()
        sh(*DOCKER, "build", "--no-cache", "-q", "-t", f"servimg-bench/dockerfile:{i}", str(context), env=env)
        times.append(time.perf_counter() - start)
        ids.append(
            sh(*DOCKER, "image", "inspect", "-f", "{{.Id}}", f"servimg-bench/dockerfile:{i}").stdout.strip()
        )
        time.sleep(1.1)  # a later second: the hand-written build stamps times into the image
    return times, ids


def time_servimg(demo: Path, runs: int) -> tuple[list[float], list[str]]:
    servimg = str(REPO / ".venv" / "bin" / "servimg")
    times, digests = [], []
    for _ in range(runs):
        out = sh(*DOCKER, "images", "-q", "--no-trunc", BENCH_REPOSITORY).stdout.split()
        for image_id in set(out):
            subprocess.run([*DOCKER, "rmi", "-f", image_id], capture_output=True)
        start = time.perf_counter()
        result = sh(servimg, "build", str(demo), "--to", "docker", "--json", "--quiet")
        times.append(time.perf_counter() - start)
        digests.append(json.loads(result.stdout.strip().splitlines()[-1])["digest"])
    return times, digests


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        demo = bench_definition(Path(tmp) / "repo")
        (Path(tmp) / "ctx").mkdir()
        context, _ = dockerfile_context(demo, Path(tmp) / "ctx")
        df_times, df_ids = time_dockerfile(context, args.runs)
        sv_times, sv_digests = time_servimg(demo, args.runs)
    for i in range(args.runs):
        subprocess.run([*DOCKER, "rmi", f"servimg-bench/dockerfile:{i}"], capture_output=True)
    result = {
        "runs": args.runs,
        "dockerfile": {
            "median_s": statistics.median(df_times),
            "times_s": df_times,
            "distinct_image_ids": len(set(df_ids)),
        },
        "servimg": {
            "median_s": statistics.median(sv_times),
            "times_s": sv_times,
            "distinct_manifest_digests": len(set(sv_digests)),
        },
    }
    result["ratio_servimg_over_dockerfile"] = result["servimg"]["median_s"] / result["dockerfile"]["median_s"]
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
