"""servimg build of the demo vs an equivalent hand-written Dockerfile on the same base, and how the build's
cost scales (docs/benchmarks.md, "Build").

The Dockerfile does what people do by hand (docs/design.md, "Why"): COPY the patched files, `sha256sum -c`,
`rm` the pycs, `py_compile` them (classic builder, `--no-cache`). Sections (all on the base that the
checkout's images/demo.yaml pins, which must be cached: `servimg base demo`):

- paired: N rounds, each round one Dockerfile build, one `servimg build --to oci:DIR` (a fresh layout)
  and one `servimg build --to docker` (the image removed from the engine first, so the thin load really
  happens), each in the process that runs it (as every servimg command runs), the whole probe included;
  `--no-oci` leaves the layout side out (its 4.5 GB copy's writeback slows the side after it); with
  `--before DIR`, also `servimg build --to docker` of another checkout's code (DIR/src, in-process:
  `SERVIMG_SERVER=0` for a checkout that still had a resident server), the order rotated round by round.
  Medians, the median of the per-round ratios, and how many distinct outputs each side produced.
- scaling: the same overlays on the base (1×) and on the base with 2× and 4× its files (extra unrelated
  layers of small files under /opt/filler*, one per file of the base, site-packages/dist-info renamed so
  the packages stay unique); all three written as OCI layouts, `--to oci:DIR`, after one warm-up build
  per base (its indexes and warm root), rounds interleaved.
- changed: 1, 10 and 100 patched files (one overlay appending a comment to N vLLM modules), `--to oci:DIR`.
- warm: the same definition built again with its compiled bytecode cached (servimg.patching.resultcache),
  into the same layout (the sink writes nothing new), interleaved with `servimg --help` (the CLI's start)
  and a bare `python -c pass`. Every other section sets SERVIMG_NO_RESULT_CACHE (a build that does all its
  work, as `--no-cache` does).

Usage (after `bash scripts/setup.sh` and `servimg base demo`):
    .venv/bin/python benchmarks/build_vs_dockerfile.py --runs 5 [--sections paired,scaling,changed,warm]
        [--before OTHER_CHECKOUT] [--no-oci] [--json out.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import difflib
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from servimg.assembly.context import Context  # noqa: E402
from servimg.assembly.defaults import default_seams, probe_host  # noqa: E402
from servimg.assembly.pipeline import base_fs, resolve  # noqa: E402
from servimg.backends import transport  # noqa: E402
from servimg.backends.target import Target  # noqa: E402
from servimg.definitions.definition import ImageDefinition  # noqa: E402
from servimg.oci.image import Descriptor, Image, Layer  # noqa: E402
from servimg.oci.layer import Entry, Kind, write_layer  # noqa: E402
from servimg.oci.store import BlobStore  # noqa: E402

HOST_SEAMS = default_seams(probe_host())  # what servimg does on this host, as its CLI runs it

BENCH_REPOSITORY = "servimg-bench13/vllm"  # its own repository: the benchmark removes its images
DOCKER = ["docker"]
SERVIMG = [sys.executable, "-m", "servimg"]
# Every section but `warm` measures a build that does all its work: the compile cache
# (servimg.patching.resultcache) is switched off, as `docker build --no-cache` reuses nothing. `warm`
# measures what it saves.
WARM_ENV = dict(os.environ, PYTHONPATH=str(REPO / "src"))
ENV = dict(WARM_ENV, SERVIMG_NO_RESULT_CACHE="1")


def before_env(checkout: Path) -> dict[str, str]:
    """Another checkout's code, run in-process (`SERVIMG_SERVER=0`: a checkout from before issue 39 would
    otherwise hand the command to a resident server), its result caches off like ENV's."""
    return dict(ENV, PYTHONPATH=str(checkout / "src"), SERVIMG_SERVER="0")


def sh(*argv: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=True, env=kw.pop("env", ENV), **kw)


def servimg(*argv: str, env: dict[str, str] = ENV) -> dict[str, Any]:
    proc = subprocess.run([*SERVIMG, *argv, "--json", "--quiet"], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"servimg {' '.join(argv)} failed:\n{proc.stdout}\n{proc.stderr}")
    out = proc.stdout.strip().splitlines()
    return json.loads(out[-1]) if out else {}


def timed(run: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    value = run()
    return time.perf_counter() - start, value


# -- definitions ----------------------------------------------------------------------------------
def checkout(tmp: Path) -> Path:
    """A copy of images/, overlays/, verify/ladders/ and verify/probes/ whose demo definition publishes
    to its own repository."""
    shutil.copytree(REPO / "images", tmp / "images")
    shutil.copytree(REPO / "overlays", tmp / "overlays")
    for bundled in ("ladders", "probes"):  # the ladder demo.yaml bundles, and its probe sets
        shutil.copytree(REPO / "verify" / bundled, tmp / "verify" / bundled)
    demo = tmp / "images" / "demo.yaml"
    demo.write_text(demo.read_text().replace("repository: servimg/vllm", f"repository: {BENCH_REPOSITORY}"))
    return demo


def variant(demo: Path, name: str, edit: Callable[[dict[str, Any]], None]) -> Path:
    doc = yaml.safe_load(demo.read_text())
    doc["name"] = name
    edit(doc)
    path = demo.parent / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    servimg("lock", str(path))
    return path


def dockerfile_context(demo: Path, tmp: Path) -> tuple[Path, str]:
    """The patched files (exactly what servimg's overlays produce) plus a Dockerfile that installs them."""
    resolution = resolve(demo, Context(BlobStore(), lambda m: None, seams=HOST_SEAMS))
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


def scaled_base(demo: Path, factor: int, out: Path) -> tuple[str, str]:
    """The demo base + (factor - 1) layers, each holding one small file per file of the base (so the
    merged tree has `factor` times the files), written as an OCI layout. Returns (ref, digest)."""
    store = BlobStore()
    definition = ImageDefinition.load(demo)
    base = transport.fetch(definition.base.ref, Context(store, lambda m: None, seams=HOST_SEAMS))
    # The 1× base is the base itself: its tree is walked only to make filler layers.
    files = [n.path for n in base_fs(base, store).walk("") if n.is_file] if factor > 1 else []
    image = base
    for k in range(1, factor):
        # Renamed so that no filler dir is a site dir or a dist-info (the packages stay unique).
        names = [p.replace("site-packages", "site-pkgs").replace(".dist-info", ".dist-inf") for p in files]
        entries = [Entry(f"opt/filler{k}/{p}", Kind.FILE, 0o644, data=f"{k}:{p}\n".encode()) for p in names]
        dirs = {e.path.rsplit("/", 1)[0] for e in entries}
        for d in list(dirs):
            while "/" in d:
                d = d.rsplit("/", 1)[0]
                dirs.add(d)
        entries += [Entry(d, Kind.DIR, 0o755) for d in sorted(dirs)]
        tmp = store.root / "tmp" / f"bench13-filler-{factor}-{k}"
        blob = write_layer(entries, tmp, mtime=0)
        store.adopt(tmp, blob.digest)
        created = str(base.config.get("created") or dt.datetime.fromtimestamp(0, dt.UTC).isoformat())
        image = image.with_layer(
            Layer(Descriptor(base.layers[-1].descriptor.media_type, blob.digest, blob.size), blob.diff_id),
            labels={},
            created=created,
            history=f"benchmark filler {k}",
        )
    assert isinstance(image, Image)
    transport.publish(
        image, Target.layout(out), Context(store, lambda m: None, seams=HOST_SEAMS), tag=f"x{factor}"
    )
    return f"oci:{out}:x{factor}", str(image.digest)


def changed_files_overlay(demo: Path, count: int) -> dict[str, Any]:
    """One overlay appending a comment to `count` vLLM modules (sorted, none the demo overlays touch)."""
    resolution = resolve(demo, Context(BlobStore(), lambda m: None, seams=HOST_SEAMS))
    site = resolution.lock.package("vllm").site_packages.lstrip("/")
    touched = {c.path for c in resolution.changes}
    fs = resolution.fs
    modules = sorted(
        n.path
        for n in fs.below(f"{site}/vllm")
        if n.is_file and n.path.endswith(".py") and n.path not in touched and n.size > 0
    )[:count]
    diff: list[str] = []
    for path in modules:
        rel = path.removeprefix(site + "/")
        old = fs.read(path).decode().splitlines(keepends=True)
        if old and not old[-1].endswith("\n"):
            continue
        new = [*old, "# servimg benchmark: changed\n"]
        diff += difflib.unified_diff(old, new, f"a/{rel}", f"b/{rel}", n=1)
    patch = demo.parent.parent / "overlays" / "vllm" / f"bench-{count}.patch"
    patch.write_text("".join(diff))
    return {
        "id": f"bench-changed-{count}",
        "package": "vllm",
        "patch": f"overlays/vllm/bench-{count}.patch",
        "sha256": hashlib.sha256(patch.read_bytes()).hexdigest(),
        "description": f"benchmark: {count} changed files",
        "upstream": [],
    }


# -- sections -------------------------------------------------------------------------------------
def remove_bench_images() -> None:
    out = sh(*DOCKER, "images", "-q", "--no-trunc", BENCH_REPOSITORY).stdout.split()
    for image_id in set(out):
        subprocess.run([*DOCKER, "rmi", "-f", image_id], capture_output=True)


def paired(demo: Path, tmp: Path, runs: int, before: Path | None = None, oci: bool = True) -> dict[str, Any]:
    (tmp / "ctx").mkdir()
    context, _ = dockerfile_context(demo, tmp / "ctx")
    env = dict(ENV, DOCKER_BUILDKIT="0")

    def dockerfile(i: int) -> str:
        tag = f"servimg-bench13/dockerfile:{i}"
        sh(*DOCKER, "build", "--no-cache", "-q", "-t", tag, str(context), env=env)
        return sh(*DOCKER, "image", "inspect", "-f", "{{.Id}}", tag).stdout.strip()

    def to_oci(i: int) -> str:
        return str(servimg("build", str(demo), "--to", f"oci:{tmp / f'layout-{i}'}")["digest"])

    def to_docker(i: int) -> str:
        return str(servimg("build", str(demo), "--to", "docker")["digest"])

    steps: dict[str, Callable[[int], str]] = {"dockerfile": dockerfile, "docker": to_docker}
    if oci:  # a fresh layout copies the 4.5 GB base: its writeback slows whatever reads files next
        steps["oci"] = to_oci
    if before is not None:
        old = before_env(before)
        steps["docker_before"] = lambda i: str(
            servimg("build", str(demo), "--to", "docker", env=old)["digest"]
        )
    sides: dict[str, list[float]] = {name: [] for name in steps}
    outputs: dict[str, list[str]] = {name: [] for name in steps}
    order = list(steps)
    for i in range(runs):
        for name in order[i % len(order) :] + order[: i % len(order)]:
            if name.startswith("docker"):
                remove_bench_images()  # the thin load and the tag really happen
            took, out = timed(lambda n=name, i=i: steps[n](i))  # type: ignore[misc]
            sides[name].append(took)
            outputs[name].append(out)
        time.sleep(1.1)  # a later second: the hand-written build stamps times into the image
    for i in range(runs):
        subprocess.run([*DOCKER, "rmi", f"servimg-bench13/dockerfile:{i}"], capture_output=True)
    remove_bench_images()
    result: dict[str, Any] = {
        name: {
            "median_s": statistics.median(times),
            "times_s": [round(t, 3) for t in times],
            "distinct_outputs": len(set(outputs[name])),
        }
        for name, times in sides.items()
    }
    for sink in (name for name in steps if name != "dockerfile"):
        ratios = [s / d for s, d in zip(sides[sink], sides["dockerfile"], strict=True)]
        result[f"paired_ratio_{sink}"] = statistics.median(ratios)
    return result


def repeat(definition: Path, out: Path, runs: int) -> dict[str, Any]:
    servimg("build", str(definition), "--to", f"oci:{out / 'warmup'}")  # indexes, warm root
    times = [
        timed(lambda i=i: servimg("build", str(definition), "--to", f"oci:{out / str(i)}"))[0]
        for i in range(runs)
    ]
    return {"median_s": statistics.median(times), "times_s": [round(t, 3) for t in times]}


def scaling(demo: Path, tmp: Path, runs: int) -> dict[str, Any]:
    """1×, 2× and 4× the base's files, every base an OCI layout (the same read path for each: the 1× row
    is the demo base itself written as a layout), one warm-up build each, then `runs` rounds of one
    build per size, interleaved so that load drift hits every size alike."""
    definitions: dict[str, Path] = {}
    for factor in (1, 2, 4):
        ref, digest = scaled_base(demo, factor, tmp / f"base-x{factor}")

        def edit(doc: dict[str, Any], ref: str = ref, digest: str = digest) -> None:
            doc["base"]["ref"], doc["base"]["digest"] = ref, digest

        definitions[f"{factor}x"] = variant(demo, f"demo-x{factor}", edit)
        servimg("build", str(definitions[f"{factor}x"]), "--to", f"oci:{tmp / f's{factor}' / 'warmup'}")
    times: dict[str, list[float]] = {name: [] for name in definitions}
    for i in range(runs):
        for name, definition in definitions.items():
            out = tmp / f"s{name}" / str(i)
            times[name].append(
                timed(lambda d=definition, o=out: servimg("build", str(d), "--to", f"oci:{o}"))[0]
            )
    rows: dict[str, Any] = {
        name: {"median_s": statistics.median(t), "times_s": [round(x, 3) for x in t]}
        for name, t in times.items()
    }
    for factor in ("2x", "4x"):
        rows[factor]["vs_1x"] = rows[factor]["median_s"] / rows["1x"]["median_s"]
    return rows


def changed(demo: Path, tmp: Path, runs: int) -> dict[str, Any]:
    """Round by round (one build of each size per round), so that load drifting over the section hits
    every size alike."""
    definitions = {}
    for count in (1, 10, 100):
        overlay = changed_files_overlay(demo, count)

        def edit(doc: dict[str, Any], overlay: dict[str, Any] = overlay) -> None:
            doc["overlays"] = [overlay]

        definitions[count] = variant(demo, f"demo-changed-{count}", edit)
        servimg("build", str(definitions[count]), "--to", f"oci:{tmp / f'warmup-{count}'}")
    times: dict[int, list[float]] = {count: [] for count in definitions}
    for i in range(runs):
        for count, definition in definitions.items():
            out = tmp / f"c{count}-{i}"
            times[count].append(
                timed(lambda d=definition, o=out: servimg("build", str(d), "--to", f"oci:{o}"))[0]
            )
    rows: dict[str, Any] = {
        str(count): {"median_s": statistics.median(t), "times_s": [round(x, 3) for x in t]}
        for count, t in times.items()
    }
    per_file = (rows["100"]["median_s"] - rows["1"]["median_s"]) / 99
    rows["marginal_s_per_file_1_to_100"] = per_file
    rows["predicted_10_s"] = rows["1"]["median_s"] + 9 * per_file
    return rows


def warm(demo: Path, tmp: Path, runs: int) -> dict[str, Any]:
    """The same definition again and again into the same layout: the sink has nothing new to write."""
    out = f"oci:{tmp / 'warm'}"
    first = servimg("build", str(demo), "--to", out, env=WARM_ENV)["digest"]
    times, digests, floor, python = [], set(), [], []
    for _ in range(runs):  # interleaved, so that load drifting over the section hits each alike
        took, built = timed(lambda: servimg("build", str(demo), "--to", out, env=WARM_ENV))
        times.append(took)
        digests.add(built["digest"])
        floor.append(timed(lambda: sh(*SERVIMG, "--help"))[0])
        python.append(timed(lambda: sh(sys.executable, "-c", "pass"))[0])
    return {
        "median_s": statistics.median(times),
        "times_s": [round(t, 3) for t in times],
        "same_digest": digests == {first},
        "cli_start_median_s": statistics.median(floor),
        "python_start_median_s": statistics.median(python),
        "load_average": os.getloadavg(),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--sections", default="paired,scaling,changed,warm")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--before", type=Path, help="paired: also build with this checkout's code")
    parser.add_argument("--no-oci", action="store_true", help="paired: leave the fresh-layout side out")
    args = parser.parse_args()
    wanted = args.sections.split(",")
    result: dict[str, Any] = {"runs": args.runs}
    with tempfile.TemporaryDirectory(prefix="servimg-bench13-") as tmp:
        root = Path(tmp)
        demo = checkout(root / "repo")
        servimg("lock", str(demo))
        result["base"] = {
            "ref": ImageDefinition.load(demo).base.ref,
            "digest": str(ImageDefinition.load(demo).base.digest),
        }
        sections = {"paired": paired, "scaling": scaling, "changed": changed, "warm": warm}
        for name in wanted:
            (root / name).mkdir()
            if name == "paired":
                result[name] = paired(demo, root / name, args.runs, args.before, oci=not args.no_oci)
            else:
                result[name] = sections[name](demo, root / name, args.runs)
            print(json.dumps({name: result[name]}), file=sys.stderr)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
