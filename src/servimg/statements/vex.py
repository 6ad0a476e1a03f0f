"""VEX for the advisories an image's overlays fix (issue 41): a backported security fix leaves the package at
its base version, so scanners (Trivy, Grype, Docker Scout) still report the advisory as open; a VEX
statement says it is fixed *in this image*.

- OpenVEX v0.2.0 (https://github.com/openvex/spec, OPENVEX-SPEC.md): one document per image, one statement
  per advisory, status `fixed`, the product
  `pkg:oci/<name>@sha256%3A<hex>?repository_url=<host[:port]/repo>` (the repository it is published to:
  `oci_purl`) with the patched distribution `pkg:pypi/<name>@<version>` as its subcomponent. Attached as
  a signed in-toto attestation (predicate type = the OpenVEX context), in every format servimg publishes.
- CycloneDX 1.6 carries the same in the SBOM (`statements.sbom`): the overlay's pedigree patch `resolves`
  the advisory, and `vulnerabilities[]` says `analysis.state: resolved` for the patched component.

Only advisories (`CVE-…`, `GHSA-…`: core.fixid) make statements; an upstream reference alone is not a
vulnerability a scanner matches. Deterministic: the timestamp is the lock's SOURCE_DATE_EPOCH, the id
derives from the image digest.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from urllib.parse import quote

from servimg.core import fixid
from servimg.core.digest import Digest
from servimg.core.reference import DEFAULT_REGISTRY, Reference
from servimg.statements import attest
from servimg.statements.derived import ImageFacts

CONTEXT = attest.OPENVEX_V020
_NAMESPACE = uuid.UUID("6f1c5a2e-7b7d-4c55-9a3e-0d7f1f0e5e21")


@dataclass(frozen=True)
class Advisory:
    """One advisory an overlay of the image fixes, in the distribution it patches."""

    id: str
    overlay: str
    patch_sha256: str
    distribution: str
    version: str

    @property
    def purl(self) -> str:
        return f"pkg:pypi/{self.distribution.lower().replace('_', '-')}@{self.version}"

    def note(self) -> str:
        return (
            f"fixed by servimg overlay {self.overlay} (patch sha256:{self.patch_sha256}) applied to "
            f"{self.distribution} {self.version}; its sentinels are proven in the image by `servimg verify`"
        )


def advisories(facts: ImageFacts) -> list[Advisory]:
    """Every advisory an overlay of the image's lock says it fixes, in lock order."""
    packages = {p.import_name: p for p in facts.lock.packages}
    out = []
    for overlay in facts.lock.overlays:
        package = packages.get(overlay.package)
        if package is None:
            continue
        for fix in overlay.fixes:
            if fixid.is_advisory(fix):
                out.append(
                    Advisory(fix, overlay.id, overlay.patch_sha256, package.distribution, package.version)
                )
    return out


def repository_url(ref: Reference) -> str:
    """Where a node pulls `ref`'s repository from, as purl's `repository_url` writes it: host[:port]/path,
    Docker Hub as `docker.io` (the purl spec's own example, and what scanners print)."""
    host = "docker.io" if ref.registry == DEFAULT_REGISTRY else ref.registry
    return f"{host}/{ref.repository}"


def oci_purl(repository: str, digest: Digest, *, pulled_from: str | None) -> str:
    """The image as purl-spec's `oci` type writes it (PURL-TYPES.rst, `oci`): the name is the last path
    segment of the repository, lowercased; the version is the manifest digest (its `:` percent-encoded);
    `repository_url` is the repository a node pulls it from, with host and port
    (`127.0.0.1:5000/myorg/vllm`). `pulled_from` is None where the image has no such place yet (an OCI
    layout): then the digest alone identifies it. Scanners (Trivy) name a scanned image the same way, so
    their matching of a VEX product is a comparison of these parts (tests/test_vex.py checks it against
    a real Trivy)."""
    name = (pulled_from or repository).rstrip("/").rsplit("/", 1)[-1].lower()
    purl = f"pkg:oci/{quote(name, safe='')}@{quote(str(digest), safe='')}"
    if pulled_from is None:
        return purl
    return f"{purl}?repository_url={quote(pulled_from, safe='/:')}"


def openvex(
    facts: ImageFacts, name: str, digest: Digest, author: str, *, pulled_from: str | None
) -> dict[str, object] | None:
    """The OpenVEX document for the image, or None when its overlays fix no advisory. `name` is the
    definition's repository; `pulled_from` the registry repository the image is published to (`oci_purl`)."""
    found = advisories(facts)
    if not found:
        return None
    when = dt.datetime.fromtimestamp(facts.lock.source_date_epoch, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    product = oci_purl(name, digest, pulled_from=pulled_from)
    statements = [
        {
            "vulnerability": {"name": advisory.id},
            "products": [{"@id": product, "subcomponents": [{"@id": advisory.purl}]}],
            "status": "fixed",
            "status_notes": advisory.note(),
        }
        for advisory in found
    ]
    return {
        "@context": CONTEXT,
        "@id": f"urn:uuid:{uuid.uuid5(_NAMESPACE, str(digest))}",
        "author": author,
        "timestamp": when,
        "version": 1,
        "tooling": "servimg",
        "statements": statements,
    }
