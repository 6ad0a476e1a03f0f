"""The `servimg` command line. No logic of its own: parse, call the library, report OK/FAIL."""

# A table (`COMMANDS`) of subcommands, each naming its library function as a dotted string that is
# loaded (importlib) only when that command runs: `servimg --help` and the parser import the standard
# library and `servimg.commands.params` only, and `servimg build` imports the build pipeline, not the
# provenance stack or the ladder. tests/test_architecture.py checks both: what `import servimg.cli` loads,
# and that every name in the table is a function of the commands layer taking the parameters its entry
# builds. (The docstring above is `servimg --help`'s description.)

from __future__ import annotations

import argparse
import functools
import importlib
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from servimg import __version__
from servimg.commands import params

if TYPE_CHECKING:
    from servimg.builder.seams import Seams
    from servimg.commands.context import Context
    from servimg.commands.outcome import Outcome
    from servimg.core.progress import Log

# What runs a parsed command (the reporter, the context, the exit status): loaded once parsing is done.
SESSION = "servimg.commands.session"


def load(function: str) -> Any:
    """`package.module:function`, imported now."""
    module, _, name = function.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class Bound:
    """A command as the parser calls it: the arguments turned into its typed parameters (`params`), then
    the library function named by `function` (loaded at that moment) called with them."""

    params: Callable[[argparse.Namespace], object]
    function: str  # "servimg.commands.MODULE:FUNCTION"
    # "servimg.commands.MODULE:FUNCTION" answering from the action cache, or None (the command runs).
    replay: str | None = None
    # The command holds its cache while it runs (servimg.core.cachehold), so no prune removes what it
    # uses; False only for the commands that inspect or prune the cache themselves.
    holds_cache: bool = True

    def __call__(self, args: argparse.Namespace, ctx: Context) -> Iterator[Outcome]:
        given = self.params(args)
        return cast("Iterator[Outcome]", load(self.function)(given, ctx))

    def replayed(self, args: argparse.Namespace, cache: Path | None, log: Log) -> list[Outcome] | None:
        """The outcomes the action cache replays for these arguments; None: the command must run."""
        if self.replay is None:
            return None
        return cast("list[Outcome] | None", load(self.replay)(self.params(args), cache, log))


@dataclass(frozen=True)
class Command:
    """One subcommand: its name (two words for `witness collect`, `key generate`), its flags, and the
    library function it calls."""

    name: tuple[str, ...]
    help: str
    flags: Callable[[argparse.ArgumentParser], None]
    run: Bound
    description: str | None = None


# -- flags ---------------------------------------------------------------------------------------------
def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable result on stdout")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress output")
    p.add_argument("--cache", type=Path, default=None, help="blob cache directory (default ~/.cache/servimg)")


def _runner(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--runner",
        default="auto",
        choices=["auto", "warm", "docker", "chroot"],
        help="who runs the image's interpreter to compile bytecode",
    )


def _base_from(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--base-from",
        default=None,
        metavar="REF",
        help="read the base from REF (e.g. oci:DIR) instead of the definition's base.ref; it must have the "
        "pinned digest (the lock and labels keep base.ref)",
    )


def _lock_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("definitions", nargs="+", type=Path)
    _runner(p)
    _base_from(p)


def _build_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("definitions", nargs="+", type=Path)
    p.add_argument(
        "--to",
        default=None,
        help="docker | oci:DIR[:TAG] | docker-archive:FILE | HOST[:PORT]/REPO[:TAG] "
        "(default: docker when an engine runs, else oci:out/<name>)",
    )
    _runner(p)
    _base_from(p)
    p.add_argument("--tag", default=None, help="override the lock-derived tag")
    p.add_argument(
        "--sign",
        type=Path,
        default=None,
        metavar="KEY",
        help="attach signed provenance + verify result (needs --to HOST/REPO or oci:DIR)",
    )
    p.add_argument("--builder-id", default=None, help="provenance builder id (default $SERVIMG_BUILDER_ID)")


def _rebase_flags(p: argparse.ArgumentParser) -> None:
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
    _runner(p)


# How every IMAGE argument is read (backends/resolve.py): as docker reads it, or with its transport.
IMAGE_HELP = (
    "engine name or (short) image ID (the engine's image when it has it, else the registry's), "
    "HOST/REPO:TAG, docker://HOST/REPO:TAG, docker-daemon:NAME, oci:DIR[:TAG] or docker-archive:FILE"
)


def _verify_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("images", nargs="+", help=IMAGE_HELP)
    p.add_argument("--audit", action="store_true", help="also audit every pyc of the declared packages")


def _witness_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("containers", nargs="+", help="container name or ID (running or stopped)")
    p.add_argument(
        "--out", type=Path, default=None, help="directory for the files (default witness/CONTAINER)"
    )


def _ladder_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("image", help=f"the image under test (its arms run as containers): {IMAGE_HELP}")
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


def _base_flags(p: argparse.ArgumentParser) -> None:
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


def _key_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, required=True, help="directory for the pair")
    p.add_argument("--name", default="servimg", help="file name stem (default servimg)")
    p.add_argument("--force", action="store_true", help="replace an existing pair")


def _overlay_flags(save: bool) -> Callable[[argparse.ArgumentParser], None]:
    def flags(p: argparse.ArgumentParser) -> None:
        p.add_argument("definition", type=Path, help="images/NAME.yaml")
        p.add_argument("package", help="the import name under `packages:` (vllm, lmcache)")
        p.add_argument("--dir", type=Path, required=True, help="the directory of the package's files")
        if save:
            p.add_argument("--id", required=True, help="the overlay's id: writes overlays/PACKAGE/ID.patch")
        else:
            p.add_argument(
                "--with-stack", action="store_true", help="as the definition's overlays leave them"
            )

    return flags


def _init_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base", required=True, help=f"the base to start from: {IMAGE_HELP}")
    p.add_argument("--name", required=True, help="the image's name: writes images/NAME.yaml")
    p.add_argument("--repository", default=None, help="where builds go (default servimg/NAME)")
    p.add_argument(
        "--out", type=Path, default=None, help="the definition to write (default images/NAME.yaml)"
    )
    p.add_argument("--force", action="store_true", help="replace an existing definition")


def _cache_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repair", action="store_true", help="remove them (the next read fetches them again)")


def _prune_flags(p: argparse.ArgumentParser) -> None:
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


def _server_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--wait",
        type=float,
        default=30.0,
        help="seconds to wait for the server to answer (start) or end (stop)",
    )


def _server(action: str) -> Callable[[argparse.Namespace], params.Server]:
    return lambda a: params.Server(action, a.wait)


def _push_flags(p: argparse.ArgumentParser) -> None:
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


REF_HELP = (
    "engine name or (short) ID (the engine's image when it has it, else the registry's), HOST/REPO:TAG, "
    "HOST/REPO@DIGEST, docker://HOST/REPO:TAG, oci:DIR[:TAG]"
)


def _attest_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("ref", help=REF_HELP)
    p.add_argument("--predicate-type", required=True, help="test-result | provenance | vsa | a URI")
    p.add_argument("--file", type=Path, required=True, help="ladder receipt, predicate or statement JSON")
    p.add_argument("--key", type=Path, default=None, help="private key to sign with (unsigned without)")
    p.add_argument("--repo", default=None, help="where a local image without RepoDigests was pushed")
    p.add_argument("--remote", action="store_true", help="the registry's image, not a pulled copy")


def _lookup_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--key", type=Path, action="append", default=[], help="trusted public key (repeatable)")
    p.add_argument("--repo", default=None, help="where a local image without RepoDigests was pushed")
    p.add_argument("--remote", action="store_true", help="the registry's image, not a pulled copy")


def _policy_flags(p: argparse.ArgumentParser) -> None:
    _lookup_flags(p)
    p.add_argument("--policy", type=Path, default=None, help="policy file (YAML/JSON)")
    p.add_argument("--require-ladder", action="append", default=[], metavar="NAME", help="repeatable")
    p.add_argument("--builder", action="append", default=[], help="trusted builder id (replaces defaults)")
    p.add_argument("--threshold", type=int, default=None, help="distinct trusted keys that must sign")
    p.add_argument("--allow-unsigned", action="store_true", help="unsigned mode: accept, but report, it")
    p.add_argument("--deep", action="store_true", help="also pull the image and re-run the probe in it")
    p.add_argument("--lock", type=Path, default=None, help="the image must be built from exactly this lock")
    p.add_argument("--rebuilds", type=int, default=None, metavar="N", help="matching rebuild attestations")
    p.add_argument(
        "--tag-binding", choices=["warn", "require"], default=None, help="a tag not bound to a lock"
    )


def _check_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("ref", help=REF_HELP)
    _policy_flags(p)
    p.add_argument("--rebuild", action="store_true", help="rebuild it here; PASS only if bit-identical")
    p.add_argument(
        "--definition", type=Path, default=None, help="with --rebuild (default images/<name>.yaml)"
    )
    p.add_argument("--attach", action="store_true", help="with --rebuild: attach the signed result (--key)")
    p.add_argument("--rebuilder-id", default=None, help="with --attach: who rebuilt")


def _promote_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("ref", help=REF_HELP)
    p.add_argument("--tag", required=True, help="the promotion tag, e.g. qualified")
    p.add_argument("--sign", type=Path, default=None, metavar="KEY", help="private key to sign the VSA")
    p.add_argument("--verifier-id", default=None, help="VSA verifier id")
    _policy_flags(p)


def _show_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("ref")
    p.add_argument("--markdown", action="store_true", help="Markdown instead of text")
    _lookup_flags(p)


def _diff_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", help=f"with --files: {IMAGE_HELP}; else {REF_HELP}")
    p.add_argument("b")
    p.add_argument(
        "--files",
        action="store_true",
        help="compare the images themselves: config keys, then layer by layer, the paths that differ",
    )
    p.add_argument("--limit", type=int, default=40, help="with --files: changes shown per layer (default 40)")
    _lookup_flags(p)


# -- arguments → parameters -----------------------------------------------------------------------------
def _lookup(a: argparse.Namespace) -> params.Lookup:
    return params.Lookup(tuple(a.key), a.repo, a.remote)


def _policy(a: argparse.Namespace) -> params.PolicyFlags:
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
    )


def _check(a: argparse.Namespace) -> params.Check:
    asked = a.rebuild or a.definition or a.attach or a.rebuilder_id
    rebuild = params.RebuildFlags(a.definition, a.attach, a.rebuilder_id, a.rebuild) if asked else None
    return params.Check(a.ref, _policy(a), _lookup(a), rebuild)


def _ladder(a: argparse.Namespace) -> params.Ladder:
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
    )


def _rebase(a: argparse.Namespace) -> params.Rebase:
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


def _base(a: argparse.Namespace) -> params.Base:
    return params.Base(a.name, tuple(a.to) if a.to is not None else None, a.repin, a.workdir)


def _promote(a: argparse.Namespace) -> params.Promote:
    return params.Promote(a.ref, a.tag, a.sign, a.verifier_id, _policy(a), _lookup(a))


def _attest(a: argparse.Namespace) -> params.Attest:
    lookup = params.Lookup(repo=a.repo, remote=a.remote)
    return params.Attest(a.ref, a.predicate_type, a.file, a.key, lookup)


# The one registry of subcommands, in the order `servimg --help` lists them.
COMMANDS: tuple[Command, ...] = (
    Command(
        ("lock",),
        "resolve every input of a definition and write its lock",
        _lock_flags,
        Bound(lambda a: params.Lock(tuple(a.definitions), a.runner), "servimg.commands.build:lock"),
    ),
    Command(
        ("build",),
        "build an image exactly as locked and publish it",
        _build_flags,
        Bound(
            lambda a: params.Build(tuple(a.definitions), a.to, a.runner, a.tag, a.sign, a.builder_id),
            "servimg.commands.build:build",
            replay="servimg.commands.replay:build",
        ),
    ),
    Command(
        ("rebase",),
        "carry a definition's overlays onto a new base: a verdict per overlay, a proposed lock",
        _rebase_flags,
        Bound(_rebase, "servimg.commands.rebase:rebase"),
    ),
    Command(
        ("verify",),
        "run the in-image probe: sources, bytecode, imports, sentinels, RECORDs",
        _verify_flags,
        Bound(lambda a: params.Verify(tuple(a.images), a.audit), "servimg.commands.verify:verify"),
    ),
    Command(
        ("witness", "collect"),
        "copy a container's witness files out; FAIL unless the patched code ran",
        _witness_flags,
        Bound(
            lambda a: params.WitnessCollect(tuple(a.containers), a.out),
            "servimg.commands.witness:witness_collect",
        ),
    ),
    Command(
        ("ladder",),
        "run the smoke ladder against an image; write a hashed receipt",
        _ladder_flags,
        Bound(_ladder, "servimg.commands.ladder:ladder"),
    ),
    Command(
        ("base",),
        "build a local base from its pins (verify/bases), or re-pin it deliberately",
        _base_flags,
        Bound(_base, "servimg.commands.base:base"),
        description="Bases: demo (the serving base: vLLM for CPU + LMCache), test-bookworm, test-trixie.",
    ),
    Command(
        ("overlay", "edit"),
        "write a package's installed files from the locked base into --dir, to edit",
        _overlay_flags(save=False),
        Bound(
            lambda a: params.OverlayEdit(a.definition, a.package, a.dir, a.with_stack),
            "servimg.commands.overlay:edit",
        ),
    ),
    Command(
        ("overlay", "save"),
        "turn the edits in --dir into overlays/PACKAGE/ID.patch, add it with a sentinel, lock again",
        _overlay_flags(save=True),
        Bound(
            lambda a: params.OverlaySave(a.definition, a.package, a.dir, a.id),
            "servimg.commands.overlay:save",
        ),
    ),
    Command(
        ("init",),
        "start from your own image: inspect a base and write images/NAME.yaml (interpreter, vllm, lmcache)",
        _init_flags,
        Bound(
            lambda a: params.Init(a.base, a.name, a.repository, a.out, a.force), "servimg.commands.init:init"
        ),
    ),
    Command(
        ("cache", "verify"),
        "re-hash every cached blob; name (and with --repair remove) the ones that do not match their names",
        _cache_flags,
        Bound(lambda a: params.CacheVerify(a.repair), "servimg.commands.cache:cache_verify"),
    ),
    Command(
        ("cache", "status"),
        "what the cache holds, per section; its size cap; the running commands that hold it",
        lambda p: None,
        Bound(lambda a: params.CacheStatus(), "servimg.commands.cache:cache_status", holds_cache=False),
    ),
    Command(
        ("cache", "prune"),
        "remove the least recently used entries until the cache fits --max-size (never while in use)",
        _prune_flags,
        Bound(
            lambda a: params.CachePrune(a.max_size, a.all, a.wait, a.dry_run),
            "servimg.commands.cache:cache_prune",
            holds_cache=False,
        ),
    ),
    Command(
        ("key", "generate"),
        "write an ed25519 pair: NAME.key (0600) and NAME.pub",
        _key_flags,
        Bound(lambda a: params.KeyGenerate(a.out, a.name, a.force), "servimg.commands.keys:key_generate"),
    ),
    *(
        Command(
            ("server", action),
            what,
            _server_flags,
            Bound(_server(action), "servimg.commands.server:server"),
        )
        for action, what in (
            ("start", "start the resident server for this environment (a command then costs no start-up)"),
            ("status", "this user's resident servers: pid, commands served, running"),
            ("stop", "stop this user's resident servers (each after its running commands)"),
        )
    ),
    Command(
        ("push",),
        "push an image with its signed provenance and verify result",
        _push_flags,
        Bound(
            lambda a: params.Push(a.image, a.dest, a.key, a.report, a.builder_id, a.unsigned),
            "servimg.commands.provenance:push",
        ),
    ),
    Command(
        ("attest",),
        "attach a later result (e.g. a ladder receipt) to an image",
        _attest_flags,
        Bound(_attest, "servimg.commands.provenance:attest"),
    ),
    Command(
        ("check",),
        "does this image satisfy the policy? one row per requirement: verdict and why",
        _check_flags,
        Bound(_check, "servimg.commands.provenance:check_ref"),
    ),
    Command(
        ("promote",),
        "move a promotion tag only if the policy passes; attach a VSA",
        _promote_flags,
        Bound(_promote, "servimg.commands.provenance:promote"),
    ),
    Command(
        ("show",),
        "the provenance card (text, or --markdown)",
        _show_flags,
        Bound(lambda a: params.Show(a.ref, a.markdown, _lookup(a)), "servimg.commands.provenance:show"),
    ),
    Command(
        ("diff",),
        "what differs between two images' provenance (--files: their files)",
        _diff_flags,
        Bound(
            lambda a: params.Diff(a.a, a.b, a.files, a.limit, _lookup(a)), "servimg.commands.provenance:diff"
        ),
    ),
)
# The two-word commands' first word.
GROUPS = {
    "witness": "serving-process witness records (images built with witness: true)",
    "key": "signing keys",
    "server": "the resident server that runs servimg commands without a start-up (SERVIMG_SERVER=0: off)",
    "overlay": "author an overlay from an edited copy of an installed package (like patch-package)",
    "cache": "the local cache (~/.cache/servimg, SERVIMG_CACHE): its health, size and pruning",
}


@functools.cache
def parser() -> argparse.ArgumentParser:
    """The whole command line, built once per process (parsing does not change it; ≈20 ms of a served
    command's run otherwise)."""
    top = argparse.ArgumentParser(prog="servimg", description=__doc__)
    top.add_argument("--version", action="version", version=f"servimg {__version__}")
    sub = top.add_subparsers(dest="command", required=True)
    groups: dict[str, argparse._SubParsersAction[argparse.ArgumentParser]] = {}
    for command in COMMANDS:
        where = sub
        if len(command.name) > 1:
            group = command.name[0]
            if group not in groups:
                g = sub.add_parser(group, help=GROUPS[group])
                groups[group] = g.add_subparsers(dest=f"{group}_command", required=True)
            where = groups[group]
        p = where.add_parser(command.name[-1], help=command.help, description=command.description)
        command.flags(p)
        _common(p)
        p.set_defaults(run=command.run)
    return top


def preload() -> None:
    """What a resident server (servimg.resident.server) does once, before it forks a worker per command:
    import the session, the context and every command's module (the third-party packages behind
    `core.lazy` stay unimported until a command asks for them, as in any process), build the parser, and
    run each command module's `warm()` (what every run of it computes the same way in this process)."""
    session = importlib.import_module(SESSION)
    modules = {importlib.import_module(session.CONTEXT)}
    for command in COMMANDS:
        for function in (command.run.function, command.run.replay):
            if function is not None:
                modules.add(importlib.import_module(function.partition(":")[0]))
    parser()
    for module in sorted(modules, key=lambda m: m.__name__):
        warm = getattr(module, "warm", None)
        if callable(warm):
            warm()


def main(argv: Sequence[str] | None = None, *, seams: Seams | None = None) -> int:
    """The CLI. `seams` (base source, runner choice, verifier) are chosen once, when the command runs
    (servimg.commands.session): from the arguments (`--base-from`), or given by an embedding caller (the
    Nix builder, tests' fake base)."""
    args = parser().parse_args(argv)
    execute = cast("Callable[[argparse.Namespace, Seams | None], int]", load(f"{SESSION}:execute"))
    return execute(args, seams)


if __name__ == "__main__":
    sys.exit(main())
