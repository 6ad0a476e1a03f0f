"""The `servimg` command line. No logic of its own: parse, call the library, report OK/FAIL."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from servimg import __version__
from servimg.build.seams import FromRef, Seams
from servimg.core.errors import ServimgError, UsageError, WitnessError
from servimg.ladder.definition import LadderError
from servimg.oci.store import BlobStore
from servimg.render import Reporter


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable result on stdout")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress output")
    p.add_argument("--cache", type=Path, default=None, help="blob cache directory (default ~/.cache/servimg)")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="servimg", description=__doc__)
    top.add_argument("--version", action="version", version=f"servimg {__version__}")
    sub = top.add_subparsers(dest="command", required=True)

    p = sub.add_parser("lock", help="resolve every input of a definition and write its lock")
    p.add_argument("definitions", nargs="+", type=Path)
    p.add_argument("--runner", default="auto", choices=["auto", "docker", "chroot"])
    _base_from(p)
    _common(p)

    p = sub.add_parser("build", help="build an image exactly as locked and publish it")
    p.add_argument("definitions", nargs="+", type=Path)
    p.add_argument(
        "--to",
        default=None,
        help="docker | oci:DIR[:TAG] | docker-archive:FILE | HOST[:PORT]/REPO[:TAG] "
        "(default: docker when an engine runs, else oci:out/<name>)",
    )
    p.add_argument(
        "--runner",
        default="auto",
        choices=["auto", "docker", "chroot"],
        help="who runs the image's interpreter to compile bytecode",
    )
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
    _common(p)

    p = sub.add_parser(
        "verify", help="run the in-image probe: sources, bytecode, imports, sentinels, RECORDs"
    )
    p.add_argument(
        "images", nargs="+", help="engine name/ID, oci:DIR[:TAG], docker-archive:FILE, HOST/REPO:TAG"
    )
    p.add_argument("--audit", action="store_true", help="also audit every pyc of the declared packages")
    _common(p)

    p = sub.add_parser("witness", help="serving-process witness records (images built with witness: true)")
    wsub = p.add_subparsers(dest="witness_command", required=True)
    w = wsub.add_parser(
        "collect", help="copy a container's witness files out; FAIL unless the patched code ran"
    )
    w.add_argument("containers", nargs="+", help="container name or ID (running or stopped)")
    w.add_argument(
        "--out", type=Path, default=None, help="directory for the files (default witness/CONTAINER)"
    )
    _common(w)

    # -- ladder --
    p = sub.add_parser("ladder", help="run the smoke ladder against an image; write a hashed receipt")
    p.add_argument("image", help="engine name/ID of the image under test (its arms run as containers)")
    p.add_argument("--ladder", type=Path, default=None, help="ladder YAML (default: the image's bundled one)")
    p.add_argument("--gpus", default=None, help="all | 0,1,… (docker device requests; none by default)")
    p.add_argument("--out", type=Path, default=None, help="receipt directory (default ladder-out/<ladder>)")
    p.add_argument("--var", action="append", default=[], metavar="NAME=VALUE", help="a ladder variable")
    p.add_argument("--endpoint", default=None, help="run every arm against this existing server URL")
    p.add_argument("--attach", default=None, metavar="REPO", help="attach the receipt (test-result) there")
    p.add_argument("--key", type=Path, default=None, help="private key to sign the attestation with")
    _common(p)

    p = sub.add_parser(
        "base",
        help="build a local base from its pins (verify/bases), or re-pin it deliberately",
        description="Bases: demo, cpu-vllm (real vLLM for CPU), test-bookworm, test-trixie.",
    )
    p.add_argument("name", choices=["demo", "cpu-vllm", "test-bookworm", "test-trixie"])
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
    _common(p)
    _provenance_parsers(sub)
    return top


def _base_from(p: Any) -> None:
    p.add_argument(
        "--base-from",
        default=None,
        metavar="REF",
        help="read the base from REF (e.g. oci:DIR) instead of the definition's base.ref; it must have the "
        "pinned digest (the lock and labels keep base.ref)",
    )


def main(argv: Sequence[str] | None = None, *, seams: Seams | None = None) -> int:
    """The CLI. `seams` (base source, runner choice, verifier) are chosen once here: from the arguments
    (`--base-from`), or given by an embedding caller (the Nix builder, tests' fake base)."""
    args = parser().parse_args(argv)
    reporter = Reporter(quiet=args.quiet, as_json=args.json)
    store = BlobStore(args.cache)
    chosen = seams_from(args, seams or Seams())
    handler: Callable[[Any, Reporter, BlobStore], int] = {
        "lock": lambda a, r, s: _lock(a, r, s, chosen),
        "build": lambda a, r, s: _build(a, r, s, chosen),
        "verify": _verify,
        "witness": _witness,
        "base": _base,
        "ladder": _ladder,
        **_PROVENANCE_HANDLERS,
    }[args.command]
    try:
        return handler(args, reporter, store)
    except KeyboardInterrupt:
        print("FAIL: interrupted; nothing was published", file=sys.stderr)
        return 130


def seams_from(args: Any, given: Seams) -> Seams:
    """The build's seams as the arguments ask: `given` (the defaults, or a caller's), with the base read
    from `--base-from` when that is set."""
    base_from = getattr(args, "base_from", None)
    return dataclasses.replace(given, base_source=FromRef(base_from)) if base_from else given


def _each(targets: Sequence[Path], reporter: Reporter, run: Callable[[Path], dict[str, Any]]) -> int:
    failures = 0
    for target in targets:
        try:
            reporter.ok(str(target), run(target))
        except ServimgError as exc:
            failures += 1
            reporter.fail(str(target), exc)
        except Exception as exc:  # a bug: still one FAIL line, and the traceback on request
            if os.environ.get("SERVIMG_DEBUG"):
                raise
            failures += 1
            hint = "this is a bug in servimg; rerun with SERVIMG_DEBUG=1 for the traceback and report it"
            reporter.fail(
                str(target), ServimgError(f"internal error: {type(exc).__name__}: {exc}", hint=hint)
            )
    return 1 if failures else 0


def _lock(args: Any, reporter: Reporter, store: BlobStore, seams: Seams) -> int:
    from servimg.build.lock import lock_path_for
    from servimg.build.pipeline import lock

    def run(path: Path) -> dict[str, Any]:
        locked, changed = lock(path, store, reporter.log, args.runner, seams)
        return {"lock": str(lock_path_for(path)), "lock_digest": str(locked.digest), "changed": changed}

    return _each(args.definitions, reporter, run)


def _build(args: Any, reporter: Reporter, store: BlobStore, seams: Seams) -> int:
    from servimg.build.pipeline import build

    def run(path: Path) -> dict[str, Any]:
        if args.sign is not None:
            return _build_signed(path, args, reporter, store, seams)
        result = build(
            path,
            store,
            reporter.log,
            to=args.to,
            runner=args.runner,
            tag=args.tag,
            progress=reporter,
            seams=seams,
        )
        return result.as_dict()

    return _each(args.definitions, reporter, run)


def _verify(args: Any, reporter: Reporter, store: BlobStore) -> int:
    from servimg.build.verify import verify_ref

    failures = 0
    for image in args.images:
        try:
            report = verify_ref(image, store, reporter.log, audit=args.audit)
        except ServimgError as exc:
            failures += 1
            reporter.fail(image, exc)
            continue
        if not args.json and not args.quiet:
            print(report.summary_table())
        if report.ok:
            reporter.ok(image, {"summary": report.counts()} if not args.json else report.as_dict())
        else:
            failures += 1
            reporter.fail(image, VerifyFailed(report))
    return 1 if failures else 0


class VerifyFailed(ServimgError):
    def __init__(self, report: Any) -> None:
        problems = [f"{c.code} {c.subject}: {c.message}" for c in report.failures()]
        super().__init__(
            f"{len(problems)} check(s) failed",
            problems=problems,
            hint=next((c.hint for c in report.failures() if c.hint), ""),
        )
        self.report = report

    def as_dict(self) -> dict[str, object]:
        return {**super().as_dict(), "report": self.report.as_dict()}


def _witness(args: Any, reporter: Reporter, store: BlobStore) -> int:
    from servimg.build.witness import collect

    def run(container: Path) -> dict[str, Any]:
        name = str(container)
        result = collect(name, args.out or Path("witness") / name)
        if not result.records():
            raise WitnessError(
                f"no witness records in {result.directory}: no process imported an overlay module",
                hint="exercise the service first; a module never imported proves nothing",
            )
        if result.problems():
            raise WitnessError("a process ran code that is not the patched code", problems=result.problems())
        return result.as_dict()

    return _each([Path(c) for c in args.containers], reporter, run)


def _ladder(args: Any, reporter: Reporter, store: BlobStore) -> int:
    """`servimg ladder IMAGE`: OK only on PASS; FAIL and NOT_EXERCISED exit 1 (never a pass)."""
    from servimg.ladder import runner
    from servimg.ladder.definition import load

    def run(_: Path) -> dict[str, Any]:
        variables = dict(v.split("=", 1) for v in args.var if "=" in v)
        if len(variables) != len(args.var):
            raise UsageError("--var takes NAME=VALUE", hint="e.g. --var model_dir=/models/tiny")
        out = args.out
        path = args.ladder
        if path is None:
            out = out or Path("ladder-out") / "bundled"
            path = runner.bundled_ladder(args.image, out / "ladder")
        loaded = load(path)
        out = out or Path("ladder-out") / loaded.definition.name
        config = runner.RunConfig(
            None if args.endpoint else args.image, out, variables, args.gpus, args.endpoint, store=store
        )
        doc = runner.run(loaded, config, reporter.log)
        result: dict[str, Any] = {**runner.summary(doc), "receipt": str(out / "receipt.json")}
        if args.attach:
            from servimg.provenance.attach import attest_file
            from servimg.provenance.attest import TEST_RESULT_V01

            attached = attest_file(
                args.image,
                TEST_RESULT_V01,
                out / "receipt.json",
                store,
                reporter.log,
                key=_signing_key(args.key),
                repo=args.attach,
            )
            result["attestation"] = attached.as_dict()
        if doc["verdict"] != "PASS":
            raise LadderError(
                f"ladder {loaded.definition.name}: {doc['verdict']}",
                problems=list(doc["verdict_reasons"])[:20],
                hint=f"see {out / 'receipt.json'} and {out / 'receipt.svg'}",
            )
        return result

    return _each([Path(args.image)], reporter, run)


def _base(args: Any, reporter: Reporter, store: BlobStore) -> int:
    from servimg.bases import catalog as bases

    def run(_: Path) -> dict[str, Any]:
        if args.repin:
            return bases.repin(args.name, store, reporter.log, workdir=args.workdir)
        return bases.build_base(args.name, store, reporter.log, targets=args.to, workdir=args.workdir)

    return _each([Path(f"{args.name}-base")], reporter, run)


# -- provenance: keys, push, attest, check, promote, show, diff ----------------------------
def _build_signed(
    path: Path, args: Any, reporter: Reporter, store: BlobStore, seams: Seams
) -> dict[str, Any]:
    from servimg.provenance.attach import build_and_push

    return build_and_push(
        path,
        store,
        reporter.log,
        to=args.to or "",
        key=_signing_key(args.sign),
        runner=args.runner,
        tag=args.tag,
        builder=args.builder_id,
        progress=reporter,
        seams=seams,
    )


def _provenance_parsers(sub: Any) -> None:
    p = sub.add_parser("key", help="signing keys")
    ksub = p.add_subparsers(dest="key_command", required=True)
    g = ksub.add_parser("generate", help="write an ed25519 pair: NAME.key (0600) and NAME.pub")
    g.add_argument("--out", type=Path, required=True, help="directory for the pair")
    g.add_argument("--name", default="servimg", help="file name stem (default servimg)")
    g.add_argument("--force", action="store_true", help="replace an existing pair")
    _common(g)

    p = sub.add_parser("push", help="push an image with its signed provenance and verify result")
    p.add_argument("image", help="engine name/ID, oci:DIR[:TAG], docker-archive:FILE, HOST/REPO:TAG")
    p.add_argument("dest", help="HOST[:PORT]/REPO[:TAG] or oci:DIR[:TAG]")
    p.add_argument("--key", type=Path, default=None, help="private key to sign with (unsigned without)")
    p.add_argument("--report", type=Path, default=None, help="a `servimg verify --json` report to attach")
    p.add_argument("--builder-id", default=None, help="provenance builder id (default $SERVIMG_BUILDER_ID)")
    _common(p)

    p = sub.add_parser("attest", help="attach a later result (e.g. a ladder receipt) to an image")
    p.add_argument("ref", help="HOST/REPO:TAG, HOST/REPO@DIGEST, a pulled engine image, oci:DIR[:TAG]")
    p.add_argument("--predicate-type", required=True, help="test-result | provenance | vsa | a URI")
    p.add_argument("--file", type=Path, required=True, help="ladder receipt, predicate or statement JSON")
    p.add_argument("--key", type=Path, default=None, help="private key to sign with (unsigned without)")
    p.add_argument("--repo", default=None, help="where a local image without RepoDigests was pushed")
    p.add_argument("--remote", action="store_true", help="the registry's image, not a pulled copy")
    _common(p)

    p = sub.add_parser("check", help="does this image satisfy the policy? a table of what/verdict/why")
    p.add_argument("ref", help="HOST/REPO:TAG, HOST/REPO@DIGEST, a pulled engine image, oci:DIR[:TAG]")
    _policy_flags(p)
    _common(p)

    p = sub.add_parser("promote", help="move a promotion tag only if the policy passes; attach a VSA")
    p.add_argument("ref", help="HOST/REPO:TAG, HOST/REPO@DIGEST, or a pulled engine image")
    p.add_argument("--tag", required=True, help="the promotion tag, e.g. qualified")
    p.add_argument("--sign", type=Path, default=None, metavar="KEY", help="private key to sign the VSA")
    p.add_argument("--verifier-id", default=None, help="VSA verifier id")
    _policy_flags(p)
    _common(p)

    p = sub.add_parser("show", help="the provenance card (text, or --markdown)")
    p.add_argument("ref")
    p.add_argument("--markdown", action="store_true", help="Markdown instead of text")
    _lookup_flags(p)
    _common(p)

    p = sub.add_parser("diff", help="what differs between two images' provenance (--files: their files)")
    p.add_argument("a", help="with --files: engine name/ID, oci:DIR[:TAG], docker-archive:FILE, HOST/REPO")
    p.add_argument("b")
    p.add_argument(
        "--files",
        action="store_true",
        help="compare the images themselves: config keys, then layer by layer, the paths that differ",
    )
    p.add_argument("--limit", type=int, default=40, help="with --files: changes shown per layer (default 40)")
    _lookup_flags(p)
    _common(p)


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


def _guarded(
    target: str, reporter: Reporter, run: Callable[[], dict[str, Any]], *, quiet_ok: bool = False
) -> int:
    """One target, one OK/FAIL line (as `_each`, for targets that are not paths)."""
    try:
        details = run()
        if not quiet_ok:
            reporter.ok(target, details)
    except ServimgError as exc:
        reporter.fail(target, exc)
        return 1
    except Exception as exc:  # a bug: still one FAIL line, and the traceback on request
        if os.environ.get("SERVIMG_DEBUG"):
            raise
        hint = "this is a bug in servimg; rerun with SERVIMG_DEBUG=1 for the traceback and report it"
        reporter.fail(target, ServimgError(f"internal error: {type(exc).__name__}: {exc}", hint=hint))
        return 1
    return 0


def _signing_key(path: Path | None) -> Any:
    from servimg.provenance.keys import load_signing

    return load_signing(path) if path is not None else None


def _policy(args: Any) -> Any:
    from servimg.provenance.check import Policy

    base = Policy.load(args.policy) if args.policy is not None else Policy()
    return base.merged(
        ladders=args.require_ladder,
        keys=args.key,
        builders=args.builder,
        threshold=args.threshold,
        allow_unsigned=args.allow_unsigned,
    )


def _key(args: Any, reporter: Reporter, store: BlobStore) -> int:
    from servimg.provenance.keys import generate

    def run() -> dict[str, Any]:
        return generate(args.out, args.name, force=args.force).as_dict()

    return _guarded(str(args.out), reporter, run)


def _push(args: Any, reporter: Reporter, store: BlobStore) -> int:
    from servimg.build.verify import VerifyReport
    from servimg.provenance.attach import push

    def run() -> dict[str, Any]:
        report = None
        if args.report is not None:
            report = VerifyReport.from_json(json.loads(args.report.read_bytes()))
        pushed = push(
            args.image,
            args.dest,
            store,
            reporter.log,
            key=_signing_key(args.key),
            report=report,
            builder=args.builder_id,
            progress=reporter,
        )
        return pushed.as_dict()

    return _guarded(args.image, reporter, run)


def _attest(args: Any, reporter: Reporter, store: BlobStore) -> int:
    from servimg.provenance.attach import attest_file
    from servimg.provenance.check import predicate_type

    def run() -> dict[str, Any]:
        kind = predicate_type(args.predicate_type)
        key = _signing_key(args.key)
        attached = attest_file(
            args.ref, kind, args.file, store, reporter.log, key=key, repo=args.repo, remote=args.remote
        )
        return attached.as_dict()

    return _guarded(args.ref, reporter, run)


def _check(args: Any, reporter: Reporter, store: BlobStore) -> int:
    from servimg.provenance.check import CheckFailed, check

    def run() -> dict[str, Any]:
        policy = _policy(args)
        report, _ = check(
            args.ref, store, reporter.log, policy, deep=args.deep, repo=args.repo, remote=args.remote
        )
        if not args.json and not args.quiet:
            print(report.table())
        if not report.ok:
            raise CheckFailed(report)
        return report.as_dict() if args.json else {"digest": report.digest, "summary": report.counts()}

    return _guarded(args.ref, reporter, run)


def _promote(args: Any, reporter: Reporter, store: BlobStore) -> int:
    from servimg.provenance.attach import promote

    def run() -> dict[str, Any]:
        promoted = promote(
            args.ref,
            args.tag,
            store,
            reporter.log,
            _policy(args),
            key=_signing_key(args.sign),
            verifier=args.verifier_id,
            deep=args.deep,
            repo=args.repo,
            remote=args.remote,
        )
        if not args.json and not args.quiet:
            print(promoted.report.table())
        return promoted.as_dict() if args.json else {"tag": promoted.tag, "vsa": promoted.vsa.artifact}

    return _guarded(args.ref, reporter, run)


def _evidence(ref: str, args: Any, store: BlobStore, reporter: Reporter) -> Any:
    from servimg.provenance.check import collect, locate
    from servimg.provenance.keys import load_trusted

    located = locate(ref, store, reporter.log, repo=args.repo, remote=args.remote)
    return collect(located, store, reporter.log, trusted=load_trusted(args.key))


def _show(args: Any, reporter: Reporter, store: BlobStore) -> int:
    from servimg.provenance.card import card

    def run() -> dict[str, Any]:
        shown = card(_evidence(args.ref, args, store, reporter))
        if args.json:
            return shown.as_dict()
        print(shown.markdown() if args.markdown else shown.text(), end="")
        return {"digest": shown.digest}

    # --markdown is a document on stdout: no OK line after it (a FAIL line still says what went wrong)
    return _guarded(args.ref, reporter, run, quiet_ok=args.markdown)


def _diff(args: Any, reporter: Reporter, store: BlobStore) -> int:
    from servimg.provenance.card import card, diff

    if args.files:
        from servimg.backends.transport import fetch
        from servimg.oci.treediff import ImagesDiffer, diff_images, explain

        def files() -> dict[str, Any]:
            a = fetch(args.a, store, reporter.log)
            b = fetch(args.b, store, reporter.log)
            result = diff_images(a, b, store)
            if result.identical:
                return result.as_dict() if args.json else {"identical": True, "digest": str(result.a)}
            if not args.json and not args.quiet:
                print("\n".join(explain(result, args.limit)))
            raise ImagesDiffer(result, args.limit)

        return _guarded(f"{args.a} {args.b}", reporter, files)

    def run() -> dict[str, Any]:
        a = card(_evidence(args.a, args, store, reporter))
        b = card(_evidence(args.b, args, store, reporter))
        result = diff(a, b)
        if args.json:
            return result.as_dict()
        print(result.text(), end="")
        return {"identical": result.identical, "differences": len(result.differences)}

    return _guarded(f"{args.a} {args.b}", reporter, run)


_PROVENANCE_HANDLERS: dict[str, Callable[[Any, Reporter, BlobStore], int]] = {
    "key": _key,
    "push": _push,
    "attest": _attest,
    "check": _check,
    "promote": _promote,
    "show": _show,
    "diff": _diff,
}


if __name__ == "__main__":
    sys.exit(main())
