"""`servimg matrix HOST/REPO` over a repository of 50 tags (docs/benchmarks.md, "Issue 41"): how long a
release engineer waits, and that no image layer is read.

Builds `--digests` small images on the fake base (tests/fakebase.py; each definition named apart, so each
is its own digest), pushes each signed with its verify result under `--tags / --digests` tags into a fresh
repository of the registry, attaches a signed ladder receipt to each, then runs `python -m servimg matrix
REPO --key PUB --json --quiet` `--runs` times through a counting proxy in front of the registry
(tests/test_faults.py `FaultProxy`): the median wall time, and the requests it made by kind — layer blob
GETs must be 0.

    .venv/bin/python benchmarks/matrix.py --registry 127.0.0.1:5000 [--digests 10 --tags 50 --runs 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import fakebase as fb  # noqa: E402
from servimg.backends import transport  # noqa: E402
from servimg.oci.store import BlobStore  # noqa: E402
from test_faults import FaultProxy  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--registry", default="127.0.0.1:5000")
    ap.add_argument("--digests", type=int, default=10)
    ap.add_argument("--tags", type=int, default=50)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="matrix-bench-") as scratch, FaultProxy(args.registry) as proxy:
        root = Path(scratch)
        cache = str(root / "cache")
        repo = f"{proxy.host}/bench/matrix-{uuid.uuid4().hex[:8]}"
        base = fb.make_base(root / "base", [fb.tar(fb.package_members())])
        report = root / "verify.json"
        report.write_text(
            json.dumps({"checks": [{"code": "SOURCE", "status": "PASS", "subject": "s", "message": "m"}]})
        )
        assert fb.main(["key", "generate", "--out", str(root / "keys"), "--quiet", "--cache", cache]) == 0
        key = root / "keys" / "servimg.key"
        layers: set[str] = set()
        per = args.tags // args.digests
        for i in range(args.digests):
            definition = fb.make_repo(root / f"repo{i}", base, name=f"bench{i}")
            built = f"oci:{root / f'built{i}'}"
            assert fb.main(["lock", str(definition), "--quiet", "--cache", cache]) == 0
            assert fb.main(["build", str(definition), "--to", built, "--quiet", "--cache", cache]) == 0
            image = transport.fetch(built, fb.on_host(BlobStore(Path(cache)), lambda _: None))
            layers |= {str(d.digest) for d in image.layer_descriptors}
            for t in range(per):
                push = ["push", built, f"{repo}:v{i}-{t}", "--key", str(key), "--report", str(report)]
                assert fb.main([*push, "--quiet", "--cache", cache]) == 0
            receipt = root / f"receipt{i}.json"
            arms = [{"id": "cold", "verdict": "PASS", "spec": {"args": []}}]
            receipt.write_text(
                json.dumps(
                    {
                        "ladder": "cpu-smoke",
                        "verdict": "PASS",
                        "image": {"digest": str(image.digest), "config_digest": str(image.config_digest)},
                        "arms": arms,
                    }
                )
            )
            attest = ["attest", f"{repo}:v{i}-0", "--predicate-type", "test-result", "--file", str(receipt)]
            assert fb.main([*attest, "--key", str(key), "--quiet", "--cache", cache]) == 0
        times, kinds, layer_reads = [], Counter[str](), 0
        for _ in range(args.runs):
            before = len(proxy.log)
            argv = [
                sys.executable,
                "-m",
                "servimg",
                "matrix",
                repo,
                "--key",
                str(root / "keys" / "servimg.pub"),
            ]
            start = time.perf_counter()
            done = subprocess.run(
                [*argv, "--json", "--quiet", "--cache", cache], capture_output=True, text=True
            )
            times.append(time.perf_counter() - start)
            doc = json.loads(done.stdout.strip().splitlines()[-1])
            assert doc["status"] == "OK" and doc["digests"] == args.digests, doc
            requests = proxy.log[before:]
            layer_reads += sum(any(layer in path for layer in layers) for _, path, _ in requests)
            kinds = Counter(f"{method} {_kind(path)}" for method, path, _ in requests)
        print(
            json.dumps(
                {
                    "tags": per * args.digests,
                    "digests": args.digests,
                    "runs_s": [round(t, 3) for t in times],
                    "median_s": round(statistics.median(times), 3),
                    "layer_blob_reads": layer_reads,
                    "requests_per_run": dict(sorted(kinds.items())),
                },
                indent=1,
            )
        )


def _kind(path: str) -> str:
    for part in ("/tags/list", "/_catalog", "/referrers/", "/manifests/", "/blobs/"):
        if part in path:
            return part.strip("/")
    return path


if __name__ == "__main__":
    main()
