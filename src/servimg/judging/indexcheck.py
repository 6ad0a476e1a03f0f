"""The provenance of a multi-platform index, and `check` of an index: every platform, then the index.

Each child of an index servimg built carries its own provenance, verify result and SBOM (attached to the
child's digest, exactly as for a single-platform image). The index gets one statement of its own
(`index_statement`): SLSA Provenance v1 with servimg's index build type, whose resolved dependencies name
every child by platform and digest, and whose parameters name the lock of all platforms.

`check_index` checks every child as `check` checks an image (each row prefixed with its platform), then
what binds them into this index: each child's config names the index's lock and its own platform
(`assembly.platforms.child_labels`), and the index's own provenance, signed as the policy demands, names
exactly these children. A child replaced by an image of another lock FAILs, in a row naming its platform.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from servimg.assembly.context import Context
from servimg.assembly.platforms import INDEX_LOCK, PLATFORM_LABEL, PLATFORMS_LOCK_LABEL
from servimg.assembly.release import PlatformImage
from servimg.backends import transport
from servimg.backends.target import Target
from servimg.core.digest import Digest
from servimg.core.errors import ServimgError, UsageError
from servimg.core.findings import FAIL, PASS, Finding
from servimg.core.platform import Platform
from servimg.definitions.platformlock import PlatformLocks, load_any
from servimg.formats import referrers
from servimg.judging.check import CheckReport, Policy, check
from servimg.judging.evidence import row
from servimg.judging.policy import Trust
from servimg.oci.index import ImageIndex
from servimg.signing import dsse
from servimg.signing.keys import load_trusted
from servimg.statements import attest
from servimg.statements.derived import ImageFacts, Invocation

INDEX_BUILD_TYPE = "https://servimg.io/buildtypes/image-index/v1"


def index_statement(
    index: ImageIndex, children: Sequence[PlatformImage], name: str, invocation: Invocation, builder: str
) -> bytes:
    """The index's provenance statement: subject the index digest; every child by platform and digest."""
    predicate = attest.provenance(
        external_parameters={
            "platforms": [str(c.platform) for c in children],
            "lock": index.annotations.get(INDEX_LOCK, ""),
        },
        resolved_dependencies=[
            {
                "name": str(c.platform),
                "digest": {"sha256": c.image.digest.hex},
                "annotations": {"config": str(c.image.config_digest), "mediaType": c.image.media_type},
            }
            for c in children
        ],
        builder_id=builder,
        invocation_id=invocation.id,
        started_on=invocation.started_on,
        finished_on=invocation.finished_on,
        internal_parameters={"command": list(invocation.command)},
        build_type=INDEX_BUILD_TYPE,
    )
    return attest.statement([(name, index.digest)], attest.PROVENANCE_V1, predicate)


def child_ref(ref: str, digest: Digest) -> str:
    """The child `digest` of the index `ref` names, as a reference every command reads."""
    child = Target.parse(ref).digest_ref(digest)
    if child is None:
        raise UsageError(
            f"{ref}: selecting one platform of an index works for a registry reference",
            hint="push the index to a registry (servimg build --to HOST/REPO) and name it there",
        )
    return child


def check_index(
    ref: str,
    index: ImageIndex,
    ctx: Context,
    policy: Policy,
    *,
    deep: bool = False,
    only: Platform | None = None,
) -> CheckReport:
    """Every platform checked as an image (`only`: that one), then the bindings into this index."""
    lock = index.annotations.get(INDEX_LOCK)
    findings: list[Finding] = []
    # `--lock` with a multi-platform lock file: each child against its platform's part, the index
    # against the whole (a single-platform lock file is each child's as for one image).
    written = load_any(policy.lock) if policy.lock is not None else None  # read once for every child
    locked, one = (written, None) if isinstance(written, PlatformLocks) else (None, written)
    if locked is not None:
        policy = dataclasses.replace(policy, lock=None)
        findings.append(_lock_file_row(locked, lock))
    trust = Trust.of(policy, one)
    for entry in index.chosen(only):
        prefix = f"[{entry.platform}]"
        try:
            report, evidence = check(
                child_ref(ref, entry.descriptor.digest), ctx, policy, deep=deep, trust=trust
            )
        except ServimgError as exc:
            findings.append(row(f"{prefix} image", FAIL, f"{entry.descriptor.digest}: {exc.message}"))
            continue
        findings += [dataclasses.replace(f, subject=f"{prefix} {f.subject}") for f in report.findings]
        labels = evidence.located.image.labels
        findings.append(_binding_row(prefix, entry.platform, entry.descriptor.digest, labels, lock))
        if locked is not None:
            findings.append(_platform_lock_row(prefix, entry.platform, evidence.facts, locked))
    if only is None:
        findings.append(_index_provenance_row(ref, index, policy))
    return CheckReport(
        tuple(findings), ref=ref, digest=index.digest, config_digest=None, policy=policy.to_json()
    )


def _binding_row(
    prefix: str, platform: Platform, digest: Digest, labels: dict[str, str], lock: str | None
) -> Finding:
    what = f"{prefix} index binding"
    child_lock, child_platform = labels.get(PLATFORMS_LOCK_LABEL), labels.get(PLATFORM_LABEL)
    if lock is None:
        return row(what, FAIL, f"the index names no lock ({INDEX_LOCK}): not an index servimg built")
    if child_lock != lock:
        built = f"from lock {child_lock}" if child_lock else "not as part of any multi-platform lock"
        return row(
            what,
            FAIL,
            f"{platform}: {digest} was built {built}; the index's lock is {lock} (a replaced child)",
        )
    if child_platform != str(platform):
        return row(what, FAIL, f"{platform}: {digest} was built for {child_platform}, listed as {platform}")
    return row(
        what, PASS, f"{platform}: {digest.short} built from the index's lock {Digest.parse(lock).short}"
    )


def _lock_file_row(locked: PlatformLocks, lock: str | None) -> Finding:
    what = "index lock"
    if lock != str(locked.digest):
        return row(what, FAIL, f"the index names lock {lock}, the lock file is {locked.digest}")
    return row(what, PASS, f"the index was built from the lock file ({locked.digest.short})")


def _platform_lock_row(
    prefix: str, platform: Platform, facts: ImageFacts | None, locked: PlatformLocks
) -> Finding:
    what = f"{prefix} lock"
    if str(platform) not in locked.platforms:
        return row(what, FAIL, f"the lock file has no {platform} part")
    expected = locked.of(platform).digest
    if facts is None:
        return row(what, FAIL, f"{platform}: the image carries no readable lock")
    if facts.lock_digest != expected:
        return row(
            what, FAIL, f"{platform}: built from lock {facts.lock_digest}, the lock file's part is {expected}"
        )
    return row(what, PASS, f"{platform}: built from the lock file's {platform} part ({expected.short})")


def _index_provenance_row(ref: str, index: ImageIndex, policy: Policy) -> Finding:
    """The index's own provenance: signed as the policy demands, naming exactly the index's children."""
    what = "index provenance"
    trusted = load_trusted(policy.all_keys())
    problems: list[str] = []
    listed: list[dict[str, object]] = []
    with transport.referrers(Target.parse(ref)) as place:
        listed, _ = place.discover(index.digest)
        for descriptor in listed:
            try:
                artifact = Digest.parse(str(descriptor.get("digest")))
                envelope = dsse.Envelope.parse(referrers.fetch_envelope(place, index.digest, artifact))
                statement = attest.parse_statement(envelope.payload)
            except ServimgError:
                continue
            build = statement.predicate.get("buildDefinition")
            if not isinstance(build, dict) or build.get("buildType") != INDEX_BUILD_TYPE:
                continue
            signed = _signed(envelope, trusted, policy)
            if signed is not None:
                problems.append(signed)
                continue
            named = {
                (str(d.get("name")), str(dict(d.get("digest") or {}).get("sha256")))
                for d in build.get("resolvedDependencies") or []
                if isinstance(d, dict)
            }
            actual = {(str(e.platform), e.descriptor.digest.hex) for e in index.entries}
            if named != actual:
                problems.append("it names other children than the index lists")
                continue
            return row(
                what,
                PASS,
                f"names its {len(actual)} children by platform and digest, signed as the policy demands",
            )
    why = "; ".join(problems) if problems else f"no index provenance is attached to {index.digest}"
    return row(what, FAIL, why)


def _signed(envelope: dsse.Envelope, trusted: Sequence[dsse.VerifyKey], policy: Policy) -> str | None:
    """None when the envelope is signed as the policy demands, else why not."""
    if not envelope.signatures:
        return None if policy.allow_unsigned else "unsigned (sign the build with --sign KEY)"
    if not trusted:
        return None if policy.allow_unsigned else "signed, but no trusted key was given (--key PUB)"
    result = dsse.verify(envelope, trusted, policy.threshold)
    return None if result.verified else f"signature: {result.reason}"
