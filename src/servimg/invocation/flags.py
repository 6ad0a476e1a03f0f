"""The command line's flags (one function per group of flags, as argparse adds them) and the parsed
arguments turned into each command's typed parameters (`params`). Standard library and `params` only:
`servimg --help` and every parse load this and nothing else of servimg (tests/test_architecture.py).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from servimg.invocation import params


# -- flags ---------------------------------------------------------------------------------------------
def common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable result on stdout")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress output")
    p.add_argument("--cache", type=Path, default=None, help="blob cache directory (default ~/.cache/servimg)")


def runner(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--runner",
        default="auto",
        choices=["auto", "warm", "docker", "chroot"],
        help="who runs the image's interpreter to compile bytecode",
    )


def base_from(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--base-from",
        default=None,
        metavar="REF",
        help="read the base from REF (e.g. oci:DIR) instead of the definition's base.ref; it must have the "
        "pinned digest (the lock and labels keep base.ref)",
    )


def lock_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("definitions", nargs="+", type=Path)
    runner(p)
    base_from(p)


def build_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("definitions", nargs="+", type=Path)
    p.add_argument(
        "--to",
        default=None,
        help="docker | oci:DIR[:TAG] | docker-archive:FILE | HOST[:PORT]/REPO[:TAG] "
        "(default: docker when an engine runs, else oci:out/<name>)",
    )
    runner(p)
    base_from(p)
    p.add_argument("--tag", default=None, help="override the lock-derived tag")
    p.add_argument(
        "--sign",
        type=Path,
        default=None,
        metavar="KEY",
        help="attach signed provenance + verify result (needs --to HOST/REPO or oci:DIR)",
    )
    p.add_argument("--builder-id", default=None, help="provenance builder id (default $SERVIMG_BUILDER_ID)")
    p.add_argument(
        "--platform",
        default=None,
        help="a multi-platform definition built to the Docker Engine: the platform it gets (default: "
        "this host's; the engine stores no index)",
    )
    publish_flags(p)


def publish_flags(p: argparse.ArgumentParser, *, gpg: bool = True) -> None:
    """Where evidence goes beside the digest, in which formats (docs/ecosystem.md)."""
    p.add_argument(
        "--formats",
        default="all",
        help="comma-separated subset of oci (servimg's DSSE referrers), sig (cosign simple signing), "
        "att (cosign .att), bundle (sigstore bundle v0.3 referrers); default all",
    )
    if gpg:
        p.add_argument(
            "--gpg-key",
            default=None,
            metavar="FPR",
            help="also sign the manifest with this GPG key (containers/image simple signing, for "
            "signedBy policies: podman, skopeo, CRI-O)",
        )
        p.add_argument(
            "--lookaside",
            type=Path,
            default=None,
            metavar="DIR",
            help="with --gpg-key: the lookaside directory the signatures are written to",
        )


def policy_export_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, required=True, help="directory to write the files into")
    p.add_argument("--registry", required=True, help="the registry scope: HOST[:PORT] or HOST[:PORT]/REPO")
    p.add_argument(
        "--key",
        type=Path,
        action="append",
        default=[],
        help="public key: an armored GPG key (--signatures gpg) or a PEM (sigstore, Kyverno, "
        "policy-controller); repeatable",
    )
    p.add_argument("--runtime", choices=["containers"], default=None, help="policy.json + registries.d/")
    p.add_argument("--signatures", choices=["gpg", "sigstore"], default="gpg", help="with --runtime")
    p.add_argument("--lookaside", default=None, metavar="URL", help="where GPG signatures are served")
    p.add_argument("--kyverno", action="store_true", help="a Kyverno ClusterPolicy (verifyImages)")
    p.add_argument(
        "--policy-controller", action="store_true", help="a sigstore policy-controller ClusterImagePolicy"
    )
    p.add_argument("--policy", type=Path, default=None, help="the policy file `servimg check --policy` reads")
    p.add_argument("--require-ladder", action="append", default=[], metavar="NAME", help="repeatable")


def policy_export(a: argparse.Namespace) -> params.PolicyExport:
    return params.PolicyExport(
        a.out,
        a.registry,
        tuple(a.key),
        a.runtime,
        a.signatures,
        a.lookaside,
        a.kyverno,
        a.policy_controller,
        a.policy,
        tuple(a.require_ladder),
    )


def publish(a: argparse.Namespace) -> params.Publish:
    return params.Publish(a.formats, getattr(a, "gpg_key", None), getattr(a, "lookaside", None))


def rebase_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("definition", type=Path, help="images/<name>.yaml")
    p.add_argument(
        "--base",
        default=None,
        metavar="REF",
        help="the new base: docker-daemon:, oci:DIR[:TAG], docker-archive:FILE or HOST/REPO:TAG",
    )
    p.add_argument(
        "--package",
        dest="packages",
        action="append",
        default=[],
        metavar="NAME==VERSION",
        help="instead of --base, for a definition on a base servimg builds (servimg base NAME): move this "
        "top-level requirement, re-resolve the base's wheel pins, build it and rebase onto it (repeatable)",
    )
    p.add_argument(
        "--digest",
        default=None,
        help="the new base's manifest (or index) digest it must have (default: "
        "the digest REF has now, pinned as read)",
    )
    p.add_argument(
        "--version",
        dest="versions",
        action="append",
        default=[],
        metavar="NAME=VERSION",
        help="the version a package must have in the new base (default: the one it installs)",
    )
    p.add_argument("--drop-absorbed", action="store_true", help="leave absorbed overlays out of the stack")
    p.add_argument(
        "--write",
        action="store_true",
        help="replace the definition and its lock in place (default: "
        "<name>.rebased.yaml and <name>.rebased.lock.json beside them); with --package also the wheel "
        "pins and the base lock, and every other definition on that base is re-locked",
    )
    runner(p)


# How every IMAGE argument is read (backends/resolve.py): as docker reads it, or with its transport.
IMAGE_HELP = (
    "engine name or (short) image ID (the engine's image when it has it, else the registry's), "
    "HOST/REPO:TAG, docker://HOST/REPO:TAG, docker-daemon:NAME, oci:DIR[:TAG] or docker-archive:FILE"
)


def verify_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("images", nargs="+", help=IMAGE_HELP)
    p.add_argument("--audit", action="store_true", help="also audit every pyc of the declared packages")
    platform_flag(p, "one platform of a multi-platform index (default: every one)")


def platform_flag(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--platform", default=None, help=f"linux/amd64 | linux/arm64: {what}")


def witness_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("containers", nargs="+", help="container name or ID (running or stopped)")
    p.add_argument(
        "--out", type=Path, default=None, help="directory for the files (default witness/CONTAINER)"
    )


def ladder_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("image", help=f"the image under test (its arms run as containers): {IMAGE_HELP}")
    platform_flag(p, "which platform of a multi-platform index (default: this host's; never emulated)")
    p.add_argument("--ladder", type=Path, default=None, help="ladder YAML (default: the image's bundled one)")
    p.add_argument(
        "--gpus",
        default=None,
        help="all | 0,1,… (docker device requests; none by default); --on k8s: N per Job",
    )
    p.add_argument("--out", type=Path, default=None, help="receipt directory (default ladder-out/<ladder>)")
    p.add_argument("--var", action="append", default=[], metavar="NAME=VALUE", help="a ladder variable")
    p.add_argument("--endpoint", default=None, help="run every arm against this existing server URL")
    p.add_argument("--attach", default=None, metavar="REPO", help="attach the receipt (test-result) there")
    p.add_argument("--key", type=Path, default=None, help="private key to sign the attestation with")
    p.add_argument(
        "--on",
        choices=("local", "slurm", "k8s"),
        default="local",
        help="slurm: each chain of arms as one Slurm job (IMAGE is then HOST/REPO@sha256:… or :TAG in a "
        "registry; --out must be on a filesystem the nodes share); k8s: write one Kubernetes Job manifest "
        "per chain into --emit DIR (--out is then the results volume's path, on the pods too)",
    )
    p.add_argument("--partition", default=None, help="--on slurm: the partition")
    p.add_argument("--gres", default=None, help="--on slurm: generic resources per job, e.g. gpu:1")
    p.add_argument("--nodes-max", type=int, default=None, help="--on slurm: at most N chains at once")
    p.add_argument(
        "--time-limit", default=None, help="--on slurm|k8s: per job (sbatch --time; activeDeadlineSeconds)"
    )
    p.add_argument("--sbatch-arg", action="append", default=[], help="--on slurm: one more sbatch argument")
    p.add_argument("--emit", type=Path, default=None, help="--on k8s: write the manifests into DIR (new)")
    p.add_argument("--force", action="store_true", help="--on k8s: replace a non-empty --emit DIR")
    p.add_argument("--namespace", default="default", help="--on k8s: the Jobs' namespace")
    p.add_argument("--gpu-resource", default="nvidia.com/gpu", help="--on k8s: the GPU extended resource")
    p.add_argument("--results-claim", default=None, help="--on k8s: the PVC holding the results directory")
    p.add_argument(
        "--results-host-path", default=None, help="--on k8s: or the results directory on each node (hostPath)"
    )
    p.add_argument("--python", default=None, help="--on k8s: the image's interpreter (default: the server's)")
    p.add_argument(
        "--collect",
        type=Path,
        default=None,
        metavar="RESULTS",
        help="judge what emitted Kubernetes Jobs wrote into RESULTS and write the receipt there",
    )
    p.add_argument(
        "--k8s-jobs", type=Path, default=None, help="with --collect: `kubectl get jobs -o json` output"
    )


def base_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", choices=params.BASES)
    p.add_argument(
        "--to",
        action="append",
        default=None,
        help="where to publish (repeatable; default: docker when an engine runs)",
    )
    p.add_argument(
        "--repin",
        action="store_true",
        help="resolve the base's packages on the live Debian archive and rewrite its pins, its pinned "
        "digest and the definitions (and locks) built on it",
    )
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument(
        "--platform",
        default=None,
        help="comma-separated platforms (linux/amd64, linux/arm64; default linux/amd64): one base each, "
        "built from its own pins (verify/bases/NAME.ARCH.*) under qemu emulation where the host differs; "
        "several give a multi-platform index too",
    )


def key_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, required=True, help="directory for the pair")
    p.add_argument("--name", default="servimg", help="file name stem (default servimg)")
    p.add_argument("--force", action="store_true", help="replace an existing pair")
    p.add_argument(
        "--algorithm",
        choices=params.KEY_ALGORITHMS,
        default="ed25519",
        help="ed25519 (default) or ecdsa-p256 (cosign's default; what every sigstore verifier reads)",
    )


def overlay_flags(save: bool) -> Callable[[argparse.ArgumentParser], None]:
    def flags(p: argparse.ArgumentParser) -> None:
        p.add_argument("definition", type=Path, help="images/NAME.yaml")
        p.add_argument("package", help="the import name under `packages:` (vllm, lmcache)")
        p.add_argument("--dir", type=Path, required=True, help="the directory of the package's files")
        if save:
            p.add_argument("--id", required=True, help="the overlay's id: writes overlays/PACKAGE/ID.patch")
            p.add_argument(
                "--description",
                default=None,
                help="what the overlay fixes and why (without it: a placeholder that lock and build refuse)",
            )
            p.add_argument(
                "--fixes",
                action="append",
                default=[],
                metavar="ID",
                help="what it fixes: OWNER/REPO#N, CVE-…, GHSA-… (repeatable; proven by its sentinels)",
            )
            p.add_argument(
                "--upstream",
                action="append",
                default=[],
                metavar="REF",
                help="upstream reference (repeatable)",
            )
        else:
            p.add_argument(
                "--with-stack", action="store_true", help="as the definition's overlays leave them"
            )
            platform_flag(
                p,
                "a multi-platform definition: whose files (default: this host's when it builds it, else "
                "its first; save uses the same, and lock proves the overlay on every platform)",
            )

    return flags


def overlay_drop_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("definition", type=Path, help="images/NAME.yaml")
    p.add_argument("id", help="the overlay's id (as under `overlays:`)")


def init_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base", required=True, help=f"the base to start from: {IMAGE_HELP}")
    p.add_argument("--name", required=True, help="the image's name: writes images/NAME.yaml")
    p.add_argument("--repository", default=None, help="where builds go (default servimg/NAME)")
    p.add_argument(
        "--out", type=Path, default=None, help="the definition to write (default images/NAME.yaml)"
    )
    p.add_argument("--force", action="store_true", help="replace an existing definition")


def cache_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repair", action="store_true", help="remove them (the next read fetches them again)")


def prune_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--max-size",
        default=None,
        help="keep the most recently used entries up to this size (20G; default: SERVIMG_CACHE_MAX_SIZE)",
    )
    p.add_argument("--all", action="store_true", help="remove every entry")
    p.add_argument(
        "--wait",
        type=float,
        default=0.0,
        help="seconds to wait for running servimg commands to release the cache (default: refuse at once)",
    )
    p.add_argument("--dry-run", action="store_true", help="list what would be removed; remove nothing")


def push_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("image", help=IMAGE_HELP)
    p.add_argument("dest", help="HOST[:PORT]/REPO[:TAG] or oci:DIR[:TAG]")
    p.add_argument("--key", type=Path, default=None, help="private key to sign with (unsigned without)")
    p.add_argument("--report", type=Path, default=None, help="a `servimg verify --json` report to attach")
    p.add_argument("--builder-id", default=None, help="provenance builder id (default $SERVIMG_BUILDER_ID)")
    p.add_argument(
        "--unsigned",
        action="store_true",
        help="without --key, attach unsigned attestations even where the digest already has signed ones",
    )
    publish_flags(p)


REF_HELP = (
    "engine name or (short) ID (the engine's image when it has it, else the registry's), HOST/REPO:TAG, "
    "HOST/REPO@DIGEST, docker://HOST/REPO:TAG, oci:DIR[:TAG]"
)


def attest_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("ref", help=REF_HELP)
    p.add_argument("--predicate-type", required=True, help="test-result | provenance | vsa | a URI")
    p.add_argument("--file", type=Path, required=True, help="ladder receipt, predicate or statement JSON")
    p.add_argument("--key", type=Path, default=None, help="private key to sign with (unsigned without)")
    p.add_argument("--repo", default=None, help="where a local image without RepoDigests was pushed")
    p.add_argument("--remote", action="store_true", help="the registry's image, not a pulled copy")
    publish_flags(p, gpg=False)


def lookup_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--key", type=Path, action="append", default=[], help="trusted public key (repeatable)")
    p.add_argument("--repo", default=None, help="where a local image without RepoDigests was pushed")
    p.add_argument("--remote", action="store_true", help="the registry's image, not a pulled copy")


def policy_flags(p: argparse.ArgumentParser) -> None:
    lookup_flags(p)
    p.add_argument("--policy", type=Path, default=None, help="policy file (YAML/JSON)")
    p.add_argument("--require-ladder", action="append", default=[], metavar="NAME", help="repeatable")
    p.add_argument("--builder", action="append", default=[], help="trusted builder id (replaces defaults)")
    p.add_argument("--threshold", type=int, default=None, help="distinct trusted keys that must sign")
    p.add_argument("--allow-unsigned", action="store_true", help="unsigned mode: accept, but report, it")
    p.add_argument("--deep", action="store_true", help="also pull the image and re-run the probe in it")
    p.add_argument("--lock", type=Path, default=None, help="the image must be built from exactly this lock")
    p.add_argument(
        "--require-fix",
        action="append",
        default=[],
        metavar="ID",
        help="a fix the evidence must prove: OWNER/REPO#N, CVE-…, GHSA-… (repeatable)",
    )
    p.add_argument("--rebuilds", type=int, default=None, metavar="N", help="matching rebuild attestations")
    p.add_argument(
        "--tag-binding", choices=["warn", "require"], default=None, help="a tag not bound to a lock"
    )


def check_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("ref", help=REF_HELP)
    policy_flags(p)
    p.add_argument("--rebuild", action="store_true", help="rebuild it here; PASS only if bit-identical")
    p.add_argument(
        "--definition", type=Path, default=None, help="with --rebuild (default images/<name>.yaml)"
    )
    p.add_argument("--attach", action="store_true", help="with --rebuild: attach the signed result (--key)")
    p.add_argument("--rebuilder-id", default=None, help="with --attach: who rebuilt")
    platform_flag(p, "one platform of a multi-platform index (default: every one, and the index)")


def fixes_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("ref", help=REF_HELP)
    lookup_flags(p)
    p.add_argument("--policy", type=Path, default=None, help="policy file (its keys and predicate types)")


def fixes(a: argparse.Namespace) -> params.Fixes:
    return params.Fixes(a.ref, a.policy, lookup(a))


def vex_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("ref", help=REF_HELP)
    p.add_argument(
        "--out", type=Path, default=None, metavar="FILE", help="write the OpenVEX document (trivy --vex FILE)"
    )
    lookup_flags(p)
    p.add_argument("--policy", type=Path, default=None, help="policy file (its keys and predicate types)")


def vex(a: argparse.Namespace) -> params.Vex:
    return params.Vex(a.ref, a.out, a.policy, lookup(a))


def matrix_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "repository", help="HOST/REPO (a registry repository) or oci:DIR (a layout): every tag in it"
    )
    p.add_argument("--markdown", action="store_true", help="a Markdown table instead of text")
    lookup_flags(p)
    p.add_argument("--policy", type=Path, default=None, help="policy file (its keys and predicate types)")


def matrix(a: argparse.Namespace) -> params.Matrix:
    return params.Matrix(a.repository, a.markdown, a.policy, lookup(a))


def promote_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("ref", help=REF_HELP)
    p.add_argument("--tag", required=True, help="the promotion tag, e.g. qualified")
    p.add_argument("--sign", type=Path, default=None, metavar="KEY", help="private key to sign the VSA")
    p.add_argument("--verifier-id", default=None, help="VSA verifier id")
    policy_flags(p)
    publish_flags(p)


def show_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("ref")
    p.add_argument("--markdown", action="store_true", help="Markdown instead of text")
    lookup_flags(p)
    platform_flag(p, "which platform of a multi-platform index")


def diff_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", help=f"with --files: {IMAGE_HELP}; else {REF_HELP}")
    p.add_argument("b")
    p.add_argument(
        "--files",
        action="store_true",
        help="compare the images themselves: config keys, then layer by layer, the paths that differ",
    )
    p.add_argument("--limit", type=int, default=40, help="with --files: changes shown per layer (default 40)")
    lookup_flags(p)


# -- arguments → parameters -----------------------------------------------------------------------------
def lookup(a: argparse.Namespace) -> params.Lookup:
    return params.Lookup(tuple(a.key), a.repo, a.remote)


def policy(a: argparse.Namespace) -> params.PolicyFlags:
    return params.PolicyFlags(
        a.policy,
        tuple(a.require_ladder),
        tuple(a.builder),
        a.threshold,
        a.allow_unsigned,
        a.deep,
        a.rebuilds,
        a.tag_binding,
        a.lock,
        tuple(a.require_fix),
    )


def check(a: argparse.Namespace) -> params.Check:
    asked = a.rebuild or a.definition or a.attach or a.rebuilder_id
    rebuild = params.RebuildFlags(a.definition, a.attach, a.rebuilder_id, a.rebuild) if asked else None
    return params.Check(a.ref, policy(a), lookup(a), rebuild, a.platform)


def ladder(a: argparse.Namespace) -> params.Ladder:
    options = params.Slurm(a.partition, a.gres, a.nodes_max, a.time_limit, tuple(a.sbatch_arg))
    kube = None
    gpus = a.gpus
    if a.on == "k8s":
        kube = params.K8s(
            a.namespace,
            a.gpu_resource,
            a.gpus,
            a.results_claim,
            a.results_host_path,
            a.time_limit,
            a.python,
            a.force,
        )
        gpus = None  # the pod is given the GPUs; nothing for an engine to request
    return params.Ladder(
        a.image,
        a.ladder,
        gpus,
        a.out,
        tuple(a.var),
        a.endpoint,
        a.attach,
        a.key,
        a.on,
        options,
        kube,
        a.emit,
        a.collect,
        a.k8s_jobs,
        a.platform,
    )


def rebase(a: argparse.Namespace) -> params.Rebase:
    return params.Rebase(
        a.definition,
        a.base,
        a.digest,
        tuple(a.versions),
        a.drop_absorbed,
        a.write,
        a.runner,
        tuple(a.packages),
    )


def base(a: argparse.Namespace) -> params.Base:
    return params.Base(a.name, tuple(a.to) if a.to is not None else None, a.repin, a.workdir, a.platform)


def promote(a: argparse.Namespace) -> params.Promote:
    return params.Promote(a.ref, a.tag, a.sign, a.verifier_id, policy(a), lookup(a), publish(a))


def attest(a: argparse.Namespace) -> params.Attest:
    lookup = params.Lookup(repo=a.repo, remote=a.remote)
    return params.Attest(a.ref, a.predicate_type, a.file, a.key, lookup, publish(a))
