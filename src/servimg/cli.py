"""The `servimg` command line. No logic of its own: parse, call the library, report OK/FAIL."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from servimg import __version__
from servimg.errors import ServimgError
from servimg.report import Reporter
from servimg.store import BlobStore


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
    p.add_argument("--tag", default=None, help="override the lock-derived tag")
    _common(p)

    p = sub.add_parser(
        "verify", help="run the in-image probe: sources, bytecode, imports, sentinels, RECORDs"
    )
    p.add_argument(
        "images", nargs="+", help="engine name/ID, oci:DIR[:TAG], docker-archive:FILE, HOST/REPO:TAG"
    )
    p.add_argument("--audit", action="store_true", help="also audit every pyc of the declared packages")
    _common(p)

    p = sub.add_parser("base", help="base images")
    bsub = p.add_subparsers(dest="base_command", required=True)
    d = bsub.add_parser("demo", help="build the demo base (debootstrap + pinned vllm/lmcache wheels)")
    d.add_argument(
        "--to",
        action="append",
        default=None,
        help="where to publish (repeatable; default: docker when an engine runs)",
    )
    d.add_argument("--workdir", type=Path, default=None)
    _common(d)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    reporter = Reporter(quiet=args.quiet, as_json=args.json)
    store = BlobStore(args.cache)
    handler: Callable[[Any, Reporter, BlobStore], int] = {
        "lock": _lock,
        "build": _build,
        "verify": _verify,
        "base": _base,
    }[args.command]
    try:
        return handler(args, reporter, store)
    except KeyboardInterrupt:
        print("FAIL: interrupted; nothing was published", file=sys.stderr)
        return 130


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


def _lock(args: Any, reporter: Reporter, store: BlobStore) -> int:
    from servimg.build import lock
    from servimg.lock import lock_path_for

    def run(path: Path) -> dict[str, Any]:
        locked, changed = lock(path, store, reporter.log, args.runner)
        return {"lock": str(lock_path_for(path)), "lock_digest": str(locked.digest), "changed": changed}

    return _each(args.definitions, reporter, run)


def _build(args: Any, reporter: Reporter, store: BlobStore) -> int:
    from servimg.build import build

    def run(path: Path) -> dict[str, Any]:
        result = build(
            path, store, reporter.log, to=args.to, runner=args.runner, tag=args.tag, progress=reporter
        )
        return result.as_dict()

    return _each(args.definitions, reporter, run)


def _verify(args: Any, reporter: Reporter, store: BlobStore) -> int:
    from servimg.verify import verify_ref

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


def _base(args: Any, reporter: Reporter, store: BlobStore) -> int:
    from servimg.demo import build_demo_base

    def run(_: Path) -> dict[str, Any]:
        return build_demo_base(store, reporter.log, targets=args.to, workdir=args.workdir)

    return _each([Path("demo-base")], reporter, run)


if __name__ == "__main__":
    sys.exit(main())
