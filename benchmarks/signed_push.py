"""What cosign's formats add to a signed push (issue 31): `push_image` with servimg's referrers only
(`--formats oci`) against every format (`oci,sig,att,bundle`), the base already in the registry.

    .venv/bin/python benchmarks/signed_push.py IMAGE --registry 127.0.0.1:5000 [--runs 5] [--json out.json]

IMAGE is any IMAGE argument (the demo image: `servimg/vllm:demo-…` or `127.0.0.1:5000/servimg/vllm:TAG`).
Untimed, once: the image is read into the cache and verified (the report every push attaches). Each run
pushes to a repository of its own whose base layers (every layer but the top, overlay one) were uploaded
first, untimed: what is timed is what a signed push of a freshly built image does when its base is in the
registry already (the overlay layer, config, manifest, the statements with the SBOM, each attestation in
each format, the tag). The two modes alternate, so drift on a shared machine hits both; reported: the
median of each and their ratio, measured in the one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from pathlib import Path

from servimg.assembly.context import Context
from servimg.assembly.defaults import default_seams, probe_host
from servimg.attesting.attach import push_image
from servimg.backends import transport
from servimg.backends.registryclient import RegistryClient
from servimg.backends.target import Target
from servimg.formats import cosign
from servimg.oci.store import BlobStore
from servimg.proof.verify import verify_image_value
from servimg.signing.dsse import SigningKey

MODES = {"oci": frozenset({cosign.NATIVE}), "all": frozenset(cosign.FORMATS)}


def _quiet(_: str) -> None:
    pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("image")
    parser.add_argument("--registry", required=True)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    store = BlobStore()
    image = transport.fetch_argument(args.image, Context(store, print, seams=default_seams(probe_host())))
    report = verify_image_value(
        image, Context(store, print, seams=default_seams(probe_host())), in_container=probe_host().engine
    )
    assert report.ok, "the image does not verify"
    key = SigningKey.generate("ecdsa-p256")
    base_layers = image.layer_descriptors[:-1]
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    attached: dict[str, int] = {}
    for run in range(args.runs):
        for mode, formats in MODES.items():
            repo = f"bench31/{mode}-{run}-{uuid.uuid4().hex[:8]}"
            with RegistryClient(args.registry) as client:
                for layer in base_layers:  # the base is in the registry already
                    path = store.path(layer.digest)
                    client.push_blob(repo, layer.digest, layer.size, lambda p=path: p.open("rb"))
            start = time.perf_counter()
            pushed = push_image(
                image,
                Target.parse(f"{args.registry}/{repo}:bench"),
                Context(store, _quiet, seams=default_seams(probe_host())),
                key=key,
                report=report,
                formats=formats,
            )
            times[mode].append(time.perf_counter() - start)
            attached[mode] = sum(len(a.formats) for a in pushed.attached)
    medians = {mode: statistics.median(t) for mode, t in times.items()}
    result = {
        "image": args.image,
        "digest": str(image.digest),
        "layers": len(image.layers),
        "top_layer_bytes": image.layer_descriptors[-1].size,
        "runs": args.runs,
        "median_s": {mode: round(m, 3) for mode, m in medians.items()},
        "all_s": {mode: [round(x, 3) for x in t] for mode, t in times.items()},
        "artifacts_written": attached,
        "ratio_all_over_oci": round(medians["all"] / medians["oci"], 3),
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
