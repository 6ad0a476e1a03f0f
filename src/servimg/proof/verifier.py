"""Who verifies an image, as a protocol (`Verifier`: the seam `assembly.seams.Seams.verifier`), and where a
host probes a built image (`ProbeRoute`, `probe_route(host)`): the one rule and the one calling
convention (`verify_or_refuse`) that the build, `servimg push`, `servimg verify` and `check --deep` share
(issue 49: each built its own verifier). The probe itself is `proof.verify`; the default verifier
(`assembly.defaults.ProbeVerifier`) runs it where the route says."""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Protocol, TypedDict, Unpack

from servimg.backends import transport
from servimg.backends.target import Holds
from servimg.core.digest import Digest
from servimg.core.errors import VerifyError
from servimg.core.platform import Host
from servimg.proof.verify import VerifyFailed, VerifyReport, run_probe_in_docker

if TYPE_CHECKING:
    from servimg.oci.image import Image
    from servimg.oci.store import Io


class ProbeRoute(StrEnum):
    """Where the whole probe runs over a built image: in the WARM root (the base's tree + the image's
    layer, `proof.warmverify`), in a CONTAINER of the image, or in a CHROOT of its extracted files."""

    WARM = "warm"
    CONTAINER = "container"
    CHROOT = "chroot"


def probe_route(host: Host) -> ProbeRoute:
    """The one rule for where a host probes a built image: the warm root where overlays mount, else a
    container where an engine runs, else a chroot."""
    return ProbeRoute.WARM if host.overlays else whole_image_route(host)


def whole_image_route(host: Host) -> ProbeRoute:
    """Where the probe runs over the whole image (no warm root): a container where an engine runs, else
    a chroot of its extracted files."""
    return ProbeRoute.CONTAINER if host.engine else ProbeRoute.CHROOT


class VerifyHow(TypedDict, total=False):
    """How a verifier runs: `base_config`, the base's image ID (the engine loads thin over it; None: no
    base there); `probe`, the route the build chose (`Sandboxes.probe`; absent: the verifier's own rule);
    `whole_image`, probe the whole image as it is (a container where an engine runs, else a chroot; never
    the warm root: `servimg verify`, `check --deep`); `audit`, the probe's audit mode."""

    base_config: Digest | None
    probe: ProbeRoute | None
    whole_image: bool
    audit: bool


class Verifier(Protocol):
    """Verifies an image value whose blobs are in the store; returns the report (the caller decides)."""

    def report(self, image: Image, io: Io, **how: Unpack[VerifyHow]) -> VerifyReport: ...


def verify_or_refuse(
    verifier: Verifier,
    image: Image,
    io: Io,
    *,
    base_config: Digest | None,
    consequence: str,
    probe: ProbeRoute | None = None,
) -> VerifyReport:
    """Stage 3, the one way every command runs it: the verifier's report, or VerifyFailed (carrying the
    report) saying what did not happen because the image failed (`consequence`: "nothing was tagged")."""
    report = verifier.report(image, io, base_config=base_config, probe=probe)
    if not report.ok:
        raise VerifyFailed(report, subject=f"the built image {image.digest.short}", consequence=consequence)
    counts = report.counts()
    io.log(f"verified: {counts.get('PASS', 0)} PASS, {counts.get('WARN', 0)} WARN, 0 FAIL")
    return report


def verify_ref(ref: str, io: Io, *, verifier: Verifier, host: Host, audit: bool = False) -> VerifyReport:
    """`servimg verify IMAGE`: an engine name or (short) ID, oci:DIR[:TAG], docker-archive:FILE or
    HOST/REPO:TAG, resolved as docker would (`transport.resolve`), probed whole by the verifier seam.

    An image the engine holds is probed in a container of it directly: reading it out of the engine
    (`docker save`, gigabytes for a serving image) only to load it back into a container of the same
    image would prove nothing more."""
    found = transport.resolve(ref, io.log)
    if found.target.holds(Holds.RUNNABLE):
        if host.engine:
            return VerifyReport.from_json(run_probe_in_docker(found.target.location, audit=audit))
        raise VerifyError(
            f"{ref} names an engine image, but no Docker Engine is reachable",
            hint="start dockerd, or verify an OCI layout / registry ref instead",
        )
    # Every blob it relies on is hashed where it is relied on: the source's here (rehash), the store's
    # copy where the probe runs on it (the verifier's).
    with transport.said_where(found):
        image = transport.fetch(found.ref, io, rehash=True)
    return verifier.report(image, io, base_config=None, whole_image=True, audit=audit)
