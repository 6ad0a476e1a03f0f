"""The parameters of every command: what `servimg.cli` turns its arguments into, before the command's
module is loaded. Plain frozen values over the standard library only (importing this module must stay
cheap: `servimg --help` imports it); what a value means is decided by the command that receives it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# The bases `servimg base NAME` builds (servimg.bases.catalog has their recipes).
BASES = ("demo", "seed", "test-bookworm", "test-trixie")
DEFAULT_KEY_NAME = "servimg"  # = servimg.signing.keys.DEFAULT_NAME (tests/test_findings.py checks)
KEY_ALGORITHMS = ("ed25519", "ecdsa-p256")  # signing.dsse.ALGORITHMS (kept light: the CLI parses flags)


@dataclass(frozen=True)
class Lock:
    definitions: tuple[Path, ...]
    runner: str = "auto"


@dataclass(frozen=True)
class Publish:
    """How evidence is published beside a digest (issue 31): the formats (`oci,sig,att,bundle` or
    `all`, formats.cosign.FORMATS) and, for containers/image's `signedBy` policies, a GPG key whose
    simple signatures go to a lookaside directory."""

    formats: str = "all"
    gpg_key: str | None = None  # a GPG key fingerprint (or anything `gpg --local-user` takes)
    lookaside: Path | None = None  # where containers/image reads signatures (served over HTTP, or file://)


@dataclass(frozen=True)
class Build:
    definitions: tuple[Path, ...]
    to: str | None = None
    runner: str = "auto"
    tag: str | None = None
    sign: Path | None = None  # a private key: attach signed provenance and the verify result
    builder_id: str | None = None
    publish: Publish = Publish()
    platform: str | None = None  # a multi-platform build to the engine: which child it gets


@dataclass(frozen=True)
class OverlayEdit:
    definition: Path
    package: str
    dir: Path
    with_stack: bool = False  # the files as the definition's overlays leave them
    platform: str | None = None  # a multi-platform definition: whose files (else this host's, or its first)


@dataclass(frozen=True)
class OverlaySave:
    definition: Path
    package: str
    dir: Path
    id: str
    description: str | None = None  # None: the placeholder, and no lock until it is replaced
    fixes: tuple[str, ...] = ()  # `fixes:` of the new entry (core.fixid)
    upstream: tuple[str, ...] = ()  # `upstream:` of the new entry


@dataclass(frozen=True)
class OverlayDrop:
    definition: Path
    id: str


@dataclass(frozen=True)
class Init:
    base: str  # an IMAGE argument: the base to start from
    name: str
    repository: str | None = None  # default servimg/<name>
    out: Path | None = None  # default images/<name>.yaml
    force: bool = False  # replace an existing definition


@dataclass(frozen=True)
class Rebase:
    definition: Path
    base: str | None
    digest: str | None = None
    versions: tuple[str, ...] = ()  # NAME=VERSION
    drop_absorbed: bool = False
    write: bool = False
    runner: str = "auto"
    packages: tuple[str, ...] = ()  # NAME==VERSION: re-resolve the definition's locally built base


@dataclass(frozen=True)
class Verify:
    images: tuple[str, ...]
    audit: bool = False
    platform: str | None = None  # one platform of an index (default: every one)


@dataclass(frozen=True)
class WitnessCollect:
    containers: tuple[str, ...]
    out: Path | None = None  # default witness/CONTAINER


@dataclass(frozen=True)
class Slurm:
    """`--on slurm`'s options, as given (servimg.placement.slurm.SlurmOptions checks them when it runs)."""

    partition: str | None = None
    gres: str | None = None
    nodes_max: int | None = None
    time_limit: str | None = None
    extra: tuple[str, ...] = ()


@dataclass(frozen=True)
class K8s:
    """`--on k8s`'s options, as given (servimg.placement.k8s.K8sOptions checks them when it emits)."""

    namespace: str = "default"
    gpu_resource: str = "nvidia.com/gpu"
    gpus: str | None = None
    results_claim: str | None = None
    results_host_path: str | None = None
    time_limit: str | None = None
    python: str | None = None
    force: bool = False


@dataclass(frozen=True)
class Ladder:
    image: str  # an IMAGE argument: its arms run as containers (resolved into the engine)
    ladder: Path | None = None  # default: the image's bundled ladder
    gpus: str | None = None
    out: Path | None = None  # default ladder-out/<ladder name>
    variables: tuple[str, ...] = ()  # NAME=VALUE
    endpoint: str | None = None  # every arm against this server instead
    attach: str | None = None  # REPO: attach the receipt there as a test-result
    key: Path | None = None
    on: str = "local"  # local | slurm | k8s (each chain of arms one job)
    slurm: Slurm = Slurm()
    k8s: K8s | None = None  # with on == "k8s"
    emit: Path | None = None  # --on k8s: the manifests' directory
    collect: Path | None = None  # the results of emitted Jobs: judge them, write the receipt
    k8s_jobs: Path | None = None  # with collect: `kubectl get jobs -o json`, for the Jobs' own states
    platform: str | None = None  # an index: which platform's arms run (default: this host's)


@dataclass(frozen=True)
class Base:
    name: str  # one of BASES
    to: tuple[str, ...] | None = None  # default: docker when an engine runs
    repin: bool = False
    workdir: Path | None = None
    platforms: str | None = None  # linux/amd64,linux/arm64 (default: linux/amd64)


@dataclass(frozen=True)
class KeyGenerate:
    out: Path
    name: str = DEFAULT_KEY_NAME
    force: bool = False
    algorithm: str = "ed25519"  # or ecdsa-p256 (cosign's default)


@dataclass(frozen=True)
class PolicyExport:
    """`servimg policy export`: the deploy side's policy files from what `check` enforces."""

    out: Path
    registry: str
    key: tuple[Path, ...] = ()  # a GPG public key (containers gpg) or PEM public keys
    runtime: str | None = None  # containers
    signatures: str = "gpg"  # gpg | sigstore (with --runtime containers)
    lookaside: str | None = None  # the URL registries.d names (gpg)
    kyverno: bool = False
    policy_controller: bool = False
    policy: Path | None = None  # the check policy file (keys, requirements, ladders)
    require_ladder: tuple[str, ...] = ()


@dataclass(frozen=True)
class Push:
    image: str
    dest: str
    key: Path | None = None  # unsigned without
    report: Path | None = None  # a `servimg verify --json` report to attach instead of running the probe
    builder_id: str | None = None
    unsigned: bool = False  # attach unsigned attestations even beside signed ones
    publish: Publish = Publish()


@dataclass(frozen=True)
class Lookup:
    """Where a ref's attestations are, and whom to trust."""

    keys: tuple[Path, ...] = ()  # trusted public keys
    repo: str | None = None  # where a local image without RepoDigests was pushed
    remote: bool = False  # the registry's image, not a pulled copy


@dataclass(frozen=True)
class Attest:
    ref: str
    predicate_type: str  # test-result | provenance | vsa | a URI
    file: Path
    key: Path | None = None
    lookup: Lookup = Lookup()
    publish: Publish = Publish()


@dataclass(frozen=True)
class PolicyFlags:
    """A policy file (or the default policy) with the command line's flags on top
    (servimg.commands.provenance.policy_of adds them up)."""

    file: Path | None = None
    ladders: tuple[str, ...] = ()
    builders: tuple[str, ...] = ()
    threshold: int | None = None
    allow_unsigned: bool = False
    deep: bool = False  # also pull the image and run the probe in it again
    rebuilds: int | None = None  # independent rebuild attestations required
    tag_binding: str | None = None  # warn | require
    lock: Path | None = None  # the repository lock the image must be built from
    fixes: tuple[str, ...] = ()  # fixes the trusted evidence must prove (core.fixid)


@dataclass(frozen=True)
class RebuildFlags:
    """`--rebuild [--definition PATH] [--attach]`: rebuild here; `attach` signs the result with the one
    private key among the --key files and attaches it beside the image."""

    definition: Path | None = None
    attach: bool = False
    rebuilder_id: str | None = None
    requested: bool = True  # False: only its options were given (a usage error)


@dataclass(frozen=True)
class Check:
    ref: str
    policy: PolicyFlags = PolicyFlags()
    lookup: Lookup = Lookup()
    rebuild: RebuildFlags | None = None
    platform: str | None = None  # one platform of an index (default: every one, and the index)


@dataclass(frozen=True)
class Fixes:
    ref: str
    policy: Path | None = None  # a policy file: its keys and accepted predicate types
    lookup: Lookup = Lookup()


@dataclass(frozen=True)
class Vex:
    ref: str
    out: Path | None = None  # write the OpenVEX document here (what `trivy image --vex FILE` reads)
    policy: Path | None = None
    lookup: Lookup = Lookup()


@dataclass(frozen=True)
class Matrix:
    repository: str  # HOST/REPO
    markdown: bool = False
    policy: Path | None = None
    lookup: Lookup = Lookup()


@dataclass(frozen=True)
class Promote:
    ref: str
    tag: str
    sign: Path | None = None  # signs the verification summary
    verifier_id: str | None = None
    policy: PolicyFlags = PolicyFlags()
    lookup: Lookup = Lookup()
    publish: Publish = Publish()


@dataclass(frozen=True)
class Show:
    ref: str
    markdown: bool = False
    lookup: Lookup = Lookup()
    platform: str | None = None  # an index: which platform's card


@dataclass(frozen=True)
class Diff:
    a: str
    b: str
    files: bool = False  # compare the images themselves, not their provenance
    limit: int = 40  # with files: changes shown per layer
    lookup: Lookup = Lookup()


@dataclass(frozen=True)
class CacheVerify:
    repair: bool = False  # remove the files that do not match their names


@dataclass(frozen=True)
class CacheStatus:
    pass


@dataclass(frozen=True)
class CachePrune:
    max_size: str | None = None  # keep at most this much (`20G`); None: SERVIMG_CACHE_MAX_SIZE
    everything: bool = False  # --all: remove every entry
    wait: float = 0.0  # seconds to wait for running commands to release the cache
    dry_run: bool = False  # say what would go; remove nothing
