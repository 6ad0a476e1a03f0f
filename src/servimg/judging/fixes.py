"""Which fixes an image carries, and what proves each (`servimg fixes REF`, `check --require-fix ID`).

Pure: the verified evidence `check` gathered (`evidence.Evidence`, and of it only what the policy accepts:
`check.accepted`) in, one `FixProof` per fix out. A fix is proven for this digest when

1. an overlay of the image's own lock says it fixes it (`fixes:` in the definition, carried into the lock),
2. a verified provenance of this image names that overlay's patch by its sha256,
3. a verified `servimg verify` result of this image (its probe spec) passed every sentinel of the
   overlay — the patched code is in the code objects the loader returns — and the overlay has one.

Serving processes in which a ladder's witness saw the overlay's sentinels run (a signed ladder
test-result's `witnessed`) are shown beside the proof; evidence that did not verify (unsigned, an
untrusted key) is named and never counts.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from servimg.core import jsonview as jv
from servimg.core.findings import FAIL, PASS, Finding
from servimg.definitions.lock import OverlayLock
from servimg.judging.evidence import Evidence, Found
from servimg.statements import attest
from servimg.statements import derived as provenance


@dataclass(frozen=True)
class FixProof:
    fix: str
    overlay: str | None  # the overlay of the image's lock that carries it; None: none does
    in_provenance: bool  # a verified provenance names the overlay's patch by its sha256
    sentinels: tuple[str, ...]  # the overlay's sentinels, `module:qualname:name`
    proven: tuple[str, ...]  # of them, those a verified verify result passed
    witnessed: tuple[str, ...]  # ladders whose signed receipt saw every named sentinel run
    not_counted: tuple[str, ...] = ()  # evidence found but not counted, and why

    @property
    def holds(self) -> bool:
        return (
            self.overlay is not None
            and self.in_provenance
            and bool(self.sentinels)
            and set(self.proven) == set(self.sentinels)
        )

    def lacking(self) -> list[str]:
        """What the proof lacks, first what matters most."""
        if self.overlay is None:
            return ["no overlay of this image's lock says it fixes it (`fixes:` in the definition)"]
        out = []
        if not self.in_provenance:
            out.append(f"no verified provenance names overlay {self.overlay}'s patch")
        if not self.sentinels:
            out.append(f"overlay {self.overlay} has no sentinel to prove it by")
        missing = [s for s in self.sentinels if s not in self.proven]
        if missing:
            out.append("no verified verify result passed sentinel(s) " + ", ".join(missing))
        return out + [f"not counted: {why}" for why in self.not_counted]

    def message(self) -> str:
        if not self.holds:
            return f"{self.fix}: not proven: " + "; ".join(self.lacking())
        ladders = ", ".join(self.witnessed)
        ran = f"; ran in the serving processes of ladder(s) {ladders}" if self.witnessed else ""
        return (
            f"{self.fix}: overlay {self.overlay}, named by the signed provenance; its sentinel(s) "
            f"{', '.join(self.proven)} in the loaded code (signed verify result){ran}"
        )

    def finding(self) -> Finding:
        return Finding("FIX", PASS if self.holds else FAIL, f"fix {self.fix}", self.message())

    def as_dict(self) -> dict[str, object]:
        return {
            "fix": self.fix,
            "proven": self.holds,
            "overlay": self.overlay,
            "in_provenance": self.in_provenance,
            "sentinels": list(self.sentinels),
            "sentinels_proven": list(self.proven),
            "witnessed_by_ladders": list(self.witnessed),
            "lacking": [] if self.holds else self.lacking(),
        }


def carried(ev: Evidence) -> list[str]:
    """Every fix the image's own lock says its overlays carry, in overlay order."""
    lock = ev.facts.lock if ev.facts is not None else None
    return list(dict.fromkeys(f for o in (lock.overlays if lock else ()) for f in o.fixes))


def prove(
    ev: Evidence,
    accepted: Sequence[tuple[Found, attest.Statement]],
    fixes: Sequence[str],
    not_counted: Mapping[str, Sequence[str]] | None = None,
) -> list[FixProof]:
    """One proof per fix asked about (`fixes`), from the verified statements alone (`accepted`)."""
    facts = ev.facts
    provs = [s.predicate for _, s in accepted if s.predicate_type == attest.PROVENANCE_V1]
    tests = [s.predicate for _, s in accepted if s.predicate_type == attest.TEST_RESULT_V01]
    passed = verified_sentinels(tests, {facts.spec_sha256} if facts is not None else set())
    ladders = [(provenance.ladder_name(p), provenance.test_config(p) or {}) for p in tests]
    reasons = not_counted or {}
    ignored = tuple(
        dict.fromkeys(why for kind in ("provenance", "test-result") for why in reasons.get(kind, ()))
    )
    out = []
    for fix in fixes:
        overlay = _carrier(facts, fix)
        if overlay is None:
            out.append(FixProof(fix, None, False, (), (), (), ignored))
            continue
        sentinels = sentinels_of(facts.definition, overlay.id) if facts is not None else []
        proven = tuple(key for key, subject in sentinels if subject in passed)
        named = [f"{key.split(':')[0]}:{key.rsplit('=', 1)[-1]}" for key, _ in sentinels if ":name=" in key]
        witnessed = tuple(
            sorted(
                str(name)
                for name, config in ladders
                if name and named and set(named) <= set(_witnessed(config))
            )
        )
        out.append(
            FixProof(
                fix,
                overlay.id,
                any(_names_patch(p, overlay.id, overlay.patch_sha256) for p in provs),
                tuple(key for key, _ in sentinels),
                proven,
                witnessed,
                ignored,
            )
        )
    return out


def _carrier(facts: provenance.ImageFacts | None, fix: str) -> OverlayLock | None:
    for overlay in facts.lock.overlays if facts is not None else ():
        if fix in overlay.fixes:
            return overlay
    return None


def verified_sentinels(tests: Sequence[Mapping[str, object]], specs: Collection[str]) -> set[str]:
    """The sentinel subjects (`module:qualname`) a verify result of one of these probe specs (sha256 hex)
    passed and none failed."""
    verifies = [
        p
        for p in tests
        if provenance.is_verify_result(p) and provenance.sha256_of(provenance.test_config(p) or {}) in specs
    ]
    passed = {name for p in verifies for name in jv.texts(p.get("passedTests") or [], "passedTests")}
    failed = {name for p in verifies for name in jv.texts(p.get("failedTests") or [], "failedTests")}
    return {name.removeprefix("SENTINEL ") for name in passed - failed if name.startswith("SENTINEL ")}


def sentinels_of(definition: Mapping[str, object], overlay_id: str) -> list[tuple[str, str]]:
    """(key, probe subject) of each sentinel a definition (the image's, or the one a provenance names)
    gives the overlay."""
    overlays = jv.seq(definition.get("overlays") or [], "overlays")
    for item in overlays:
        spec = jv.obj(item, "overlays[]")
        if spec.get("id") != overlay_id:
            continue
        out = []
        for raw in jv.seq(spec.get("sentinels") or [], "sentinels"):
            s = jv.obj(raw, "sentinels[]")
            subject = f"{s.get('module')}:{s.get('qualname')}"
            what = f"name={s.get('name')}" if s.get("name") is not None else f"const={s.get('const')}"
            out.append((f"{subject}:{what}", subject))
        return out
    return []


def _names_patch(predicate: Mapping[str, object], overlay_id: str, patch_sha256: str) -> bool:
    for dep in provenance.provenance_dependencies(predicate, provenance.ROLE_PATCH):
        annotations = dep.get("annotations")
        digest = dep.get("digest")
        if (
            isinstance(annotations, dict)
            and annotations.get("overlay") == overlay_id
            and isinstance(digest, dict)
            and digest.get("sha256") == patch_sha256
        ):
            return True
    return False


def _witnessed(config: Mapping[str, object]) -> list[str]:
    annotations = config.get("annotations")
    seen = annotations.get("witnessed") if isinstance(annotations, dict) else None
    return [s for s in seen if isinstance(s, str)] if isinstance(seen, list) else []
