"""A sentinel's verdict on a base: the stable key that names each sentinel, the base's sources of the
sentinel modules, and whether the base's own code already holds each sentinel (compiled on the host, or
asked of the image's interpreter), or holds it under another qualname (where upstream moved it)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import CodeType

from servimg.core.errors import VerifyError
from servimg.definitions.definition import Sentinel
from servimg.definitions.lock import Lock
from servimg.inimage import probe
from servimg.patching.bytecode import Runner, lookup_in_image


def sentinel_key(sentinel: Sentinel) -> str:
    """A stable name for one sentinel: `module:qualname:name=X` or `module:qualname:const=<json>`.

    These keys name base verdicts (`base_has` below; `OverlayLock.sentinels_absent_in_base` lists the keys
    of the sentinels verified absent from the base)."""
    what = f"name={sentinel.name}" if sentinel.name is not None else f"const={json.dumps(sentinel.const)}"
    return f"{sentinel.module}:{sentinel.qualname}:{what}"


def base_sources(
    lock: Lock, sentinels: Iterable[Sentinel], read: Callable[[str], bytes | None]
) -> dict[str, bytes]:
    """The BASE's source of each sentinel module, for `base_sentinel_verdicts`: `read(absolute path)`
    reads the base image's files (e.g. `lambda p: fs.read_or_none(p.lstrip("/"))` over the base layers).
    Each module is looked up as `<module path>.py`, then `<module path>/__init__.py`, in every locked
    package's site-packages; a module found nowhere is left out (absent from the base)."""
    sites = list(dict.fromkeys(p.site_packages for p in lock.packages))
    return module_sources(sites, {s.module for s in sentinels}, read)


def module_sources(
    sites: Sequence[str], modules: Iterable[str], read: Callable[[str], bytes | None]
) -> dict[str, bytes]:
    """The source of each module found in one of `sites` (absolute site-packages paths), by name."""
    out: dict[str, bytes] = {}
    for module in sorted(set(modules)):
        rel = module.replace(".", "/")
        for site in sites:
            data = read(f"{site}/{rel}.py")
            if data is None:
                data = read(f"{site}/{rel}/__init__.py")
            if data is not None:
                out[module] = data
                break
    return out


def base_sentinel_verdicts(sources: Mapping[str, bytes], sentinels: Iterable[Sentinel]) -> dict[str, bool]:
    """For each sentinel, whether the BASE's code already holds it: `sources` maps a module name to the
    base's source bytes of that module (a module missing from it is absent from the base). Compiled on the
    host, never executed; a qualname the base lacks means the sentinel is absent. Keys: `sentinel_key`."""
    return {key: hits > 0 for key, (hits, _) in base_sentinel_lookups(sources, sentinels).items()}


def base_sentinel_verdicts_in_image(
    runner: Runner, interpreter: str, sources: Mapping[str, bytes], sentinels: Iterable[Sentinel]
) -> dict[str, bool]:
    """`base_sentinel_verdicts`, answered by the image's own interpreter through `runner` (what a lock
    and a build use: facts about the image come from the image, as compile and probe do)."""
    lookups: dict[str, list[dict[str, object]]] = {}
    for sentinel in sentinels:
        lookups.setdefault(sentinel.module, []).append(
            {
                "key": sentinel_key(sentinel),
                "qualname": sentinel.qualname,
                "name": sentinel.name,
                "const": sentinel.const,
            }
        )
    found = lookup_in_image(runner, interpreter, {m: s for m, s in sources.items() if m in lookups}, lookups)
    return {key: hits > 0 for key, (hits, _) in found.items()}


def base_sentinel_lookups(
    sources: Mapping[str, bytes], sentinels: Iterable[Sentinel]
) -> dict[str, tuple[int, int]]:
    """For each sentinel (by `sentinel_key`): how many code objects named its qualname hold it, and how
    many code objects have that qualname at all (0: the qualname, or its module, is not in `sources`)."""
    compiled: dict[str, CodeType] = {}
    out: dict[str, tuple[int, int]] = {}
    for sentinel in sentinels:
        key = sentinel_key(sentinel)
        source = sources.get(sentinel.module)
        if source is None:
            out[key] = (0, 0)
            continue
        if sentinel.module not in compiled:
            compiled[sentinel.module] = _compile_base(sentinel.module, source)
        hits, objects, _ = probe.find_in_qualname(
            compiled[sentinel.module], sentinel.qualname, sentinel.name, sentinel.const
        )
        out[key] = (hits, objects)
    return out


def _compile_base(module: str, source: bytes) -> CodeType:
    try:
        return compile(source, f"<base {module}>", "exec", dont_inherit=True, optimize=0)
    except (SyntaxError, ValueError) as exc:
        raise VerifyError(
            f"the base's {module} does not compile on this host: {exc}",
            hint="run servimg with a Python at least as new as the image's interpreter",
        ) from None


def sentinel_elsewhere(sources: Mapping[str, bytes], sentinel: Sentinel) -> tuple[str, ...]:
    """The other qualnames of the sentinel's module whose code holds its name/const, as a name or a
    constant (nested code included; the innermost holders): where upstream put the same thing (vLLM
    0.28.0 moved the seed gate's `supports_divergent_local_hybrid_hits` from `Scheduler.schedule` into
    `Scheduler._get_local_prefix_cache_hit`)."""
    source = sources.get(sentinel.module)
    if source is None:
        return ()
    code = _compile_base(sentinel.module, source)
    # Upstream writes the same thing its own way: the overlay's `getattr(x, "name")` (a const) is
    # upstream's `x.name` (a name), and the other way round. Evidence only: the ladder is the proof.
    words = {w for w in (sentinel.name, sentinel.const) if isinstance(w, str) and w.isidentifier()}

    def holds(code: CodeType) -> bool:
        return probe.code_has(code, sentinel.name, sentinel.const) or any(
            probe.code_has(code, w) or probe.code_has(code, None, w) for w in words
        )

    found = [
        q
        for q, objects in probe.qualnames(code).items()
        if q != sentinel.qualname and any(holds(o) for o in objects)
    ]
    # a holder's enclosing functions hold it too (nested code): keep the innermost
    inner = [
        q
        for q in found
        if not any(other.startswith(q + ".") or (q == "<module>" and other != q) for other in found)
    ]
    return tuple(sorted(inner))
