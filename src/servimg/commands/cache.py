"""`servimg cache verify [--repair]`: the blob store's health check (docs/reliability.md); `servimg cache
status|prune`: what the cache holds and keeping it to a size (docs/architecture.md "The cache")."""

from __future__ import annotations

import os
from collections.abc import Iterator

from servimg.cache import hold as cachehold
from servimg.cache import layout as cachelayout
from servimg.cache import state as cachestate
from servimg.cache.bases import cached_bases
from servimg.core.errors import StoreError, UsageError
from servimg.invocation import params
from servimg.invocation.context import Context
from servimg.invocation.outcome import Outcome, attempt


def cache_verify(p: params.CacheVerify, ctx: Context) -> Iterator[Outcome]:
    """Re-hash every blob and uncompressed layer copy in the store against its name; FAIL naming each one
    that does not match, unless `--repair` removed them (the next read fetches them again)."""

    def run() -> Outcome:
        audit = ctx.store.audit(repair=p.repair)
        bad = [
            f"{b.kind}/{b.name}: its {b.size} bytes hash to {b.actual}"
            + (" (removed)" if audit.repaired else "")
            for b in audit.bad
        ]
        fields = {
            "checked": audit.checked,
            "corrupt": len(bad),
            **({"removed": len(bad)} if audit.repaired and bad else {}),
            "store": str(audit.root),
        }
        if not audit.ok:
            error = StoreError(
                f"{len(bad)} of {audit.checked} cached file(s) do not match their names",
                problems=bad,
                hint="`servimg cache verify --repair` removes them; the next command that needs one reads "
                "it again from its source",
            )
            return Outcome("cache", fields, {**fields, "problems": bad}, error=error)
        return Outcome("cache", fields, {**fields, "problems": bad})

    yield attempt("cache", run)


def cache_status(p: params.CacheStatus, ctx: Context) -> Iterator[Outcome]:
    """What the cache holds, per section, its size cap, and the running commands that hold it."""

    def run() -> Outcome:
        root = ctx.store.root
        usage = cachestate.usage(root)
        running = cachehold.holders(root)
        cap, source = _env_cap()
        rows = [
            f"  {s.name:<13}{s.entries:>7} {cachelayout.format_size(s.size):>11}  {s.what}"
            for s in usage.sections
        ]
        held = [f"  pid {h.pid}: {h.command}" for h in running]
        bases = cached_bases(root)
        per_base = [
            f"  {cachelayout.format_size(b.total):>11} = {cachelayout.format_size(b.layers):>11} layers"
            f" + {cachelayout.format_size(b.warm_root):>11} warm root  {b.manifest}  {b.title}".rstrip()
            for b in bases
        ]
        document = "\n".join(
            [f"{root}", f"  {'section':<13}{'entries':>7} {'size':>11}", *rows]
            + (["what each base costs (its layers + its extracted warm root):", *per_base] if bases else [])
            + (["running commands holding it:", *held] if held else [])
        )
        fields: dict[str, object] = {
            "size": cachelayout.format_size(usage.size),
            "entries": usage.entries,
            "max_size": f"{cachelayout.format_size(cap) if cap is not None else 'none'} ({source})",
            "held_by": len(running),
        }
        as_json = {
            "cache": str(root),
            "size_bytes": usage.size,
            "entries": usage.entries,
            "max_size_bytes": cap,
            "sections": {s.name: {"entries": s.entries, "size_bytes": s.size} for s in usage.sections},
            "bases": [b.as_dict() for b in bases],
            "held_by": [{"pid": h.pid, "command": h.command} for h in running],
        }
        return Outcome("cache", fields, as_json, document=document + "\n")

    yield attempt("cache", run)


def cache_prune(p: params.CachePrune, ctx: Context) -> Iterator[Outcome]:
    """Remove least recently used entries until the cache fits its size (--max-size, --all, or
    SERVIMG_CACHE_MAX_SIZE); never while another command holds the cache (servimg.cache.hold)."""

    def run() -> Outcome:
        root = ctx.store.root
        cap = _cap(p)
        with cachehold.exclusive(root, wait=p.wait):
            pruned = cachestate.prune(root, cap, dry_run=p.dry_run)
        verb = "would remove" if p.dry_run else "removed"
        fields = {
            verb: f"{len(pruned.removed)} entr{'y' if len(pruned.removed) == 1 else 'ies'}",
            "freed": cachelayout.format_size(pruned.freed),
            "size": f"{cachelayout.format_size(pruned.before)} -> {cachelayout.format_size(pruned.after)}",
            "max_size": cachelayout.format_size(cap),
        }
        as_json = {
            "cache": str(root),
            "dry_run": p.dry_run,
            "max_size_bytes": cap,
            "before_bytes": pruned.before,
            "after_bytes": pruned.after,
            "removed": [
                {"section": e.section, "path": str(e.path), "size_bytes": e.size} for e in pruned.removed
            ],
        }
        listing = "".join(f"  {verb} {e.section}: {e.path}\n" for e in pruned.removed) if p.dry_run else ""
        return Outcome("cache", fields, as_json, document=listing)

    yield attempt("cache", run)


def _env_cap() -> tuple[int | None, str]:
    try:
        return cachelayout.max_size(os.environ)
    except ValueError as exc:
        raise UsageError(
            f"{cachelayout.MAX_SIZE_ENV}: {exc}", hint="unset it, give a size such as 20G, or none"
        ) from None


def _cap(p: params.CachePrune) -> int:
    """The size to prune to: 0 for --all, else --max-size, else the cache's bound (SERVIMG_CACHE_MAX_SIZE,
    else the default)."""
    if p.everything:
        if p.max_size is not None:
            raise UsageError("--all and --max-size contradict each other", hint="give one of them")
        return 0
    if p.max_size is not None:
        try:
            return cachelayout.parse_size(p.max_size)
        except ValueError as exc:
            raise UsageError(f"--max-size: {exc}", hint="e.g. `servimg cache prune --max-size 20G`") from None
    cap, _ = _env_cap()
    if cap is None:
        raise UsageError(
            f"prune to what size? {cachelayout.MAX_SIZE_ENV}=none lifts the bound and no --max-size or "
            "--all was given",
            hint="`servimg cache prune --max-size 20G` keeps the 20 GiB used most recently; "
            "`--all` empties it; `servimg cache status` shows what it holds",
        )
    return cap
