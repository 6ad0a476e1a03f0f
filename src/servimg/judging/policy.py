"""What `servimg check` requires, as data: a policy file (YAML or JSON) or the command line's flags.

A policy names the evidence an image must carry and whom to believe for each kind of it (docs/policy.md):

- `require`: provenance | verify | vsa | sbom | a predicate type URI;
- `keys`: trusted public keys, either one list (trusted for every predicate type) or a mapping from a
  predicate type (`provenance`, `test-result`, `vsa`, `rebuild`, a URI, or `all`) to its keys;
- `ladders`: required ladders, a list of names (verdict PASS) or a mapping name → verdict(s) accepted;
- `rebuilds`: how many independent rebuild attestations (distinct trusted keys, each a bit-identical
  match) the image must have;
- `tag_binding`: `warn` (a tag not made from the tag template is reported "not bound to a lock") or
  `require` (such a tag FAILs); a template-shaped tag naming another lock always FAILs;
- `lock`: a repository lock file the image must have been built from exactly;
- `unsigned`: `ignore` (default: an unsigned envelope is reported, "ignored", and not counted, like every
  piece of evidence that does not verify) or `forbid` (an unsigned envelope FAILs: the strict case);
- `builders`, `predicates`, `threshold`, `allow_unsigned` as the flags of the same names
  (`allow_unsigned: true` is unsigned mode: unsigned envelopes are accepted as evidence, and reported).

Loading is validation: every problem is collected with its YAML path and raised once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from servimg.core import fields, fixid
from servimg.core.errors import ServimgError
from servimg.core.strictyaml import StrictLoader
from servimg.definitions.lock import Lock
from servimg.signing.dsse import VerifyKey
from servimg.signing.keys import load_trusted
from servimg.statements import attest
from servimg.statements import derived as provenance

REBUILD_V1 = attest.REBUILD_V1
KIND_NAMES = {kind: uri for uri, kind in attest.KINDS.items()}
REQUIREMENTS = ("provenance", "verify", "vsa", "sbom")
ALL_TYPES = "all"
TAG_BINDINGS = ("warn", "require")
KEYS = (
    "require, keys, ladders, rebuilds, tag_binding, lock, builders, predicates, threshold, unsigned, "
    "allow_unsigned"
)
UNSIGNED_MODES = ("ignore", "forbid")


class PolicyError(ServimgError):
    """A policy file that cannot be used (unreadable, not YAML/JSON, or with problems, all listed)."""


UNKNOWN_KEY = "unknown key (check the spelling; see docs/policy.md)"


def predicate_type(name: str) -> str:
    """`provenance`, `test-result`, `vsa`, `rebuild`, or a predicate type URI as is."""
    return KIND_NAMES.get(name, name)


VERDICTS = ("PASS", "FAIL", "NOT_EXERCISED")
BUILDERS_BY_DEFAULT = "servimg's default: no builder was named (--builder, or builders: in a policy)"


def _fix_ids(given: Sequence[str]) -> list[str]:
    """`--require-fix` values, every malformed one refused at once (core.fixid)."""
    bad = [f for f in given if fixid.kind(f) is None]
    if bad:
        raise PolicyError(
            f"--require-fix: {', '.join(repr(b) for b in bad)} is not a fix id",
            hint=f"use {fixid.ACCEPTED}",
        )
    return list(given)


@dataclass(frozen=True)
class _PolicyFile:
    """The file as written (servimg.core.fields readers: every problem with its YAML path)."""

    require: tuple[str, ...] = ("provenance", "verify")
    ladders: tuple[str, ...] | dict[str, str | tuple[str, ...]] = ()
    builders: tuple[str, ...] = (provenance.DEFAULT_BUILDER_ID,)
    predicates: tuple[str, ...] = ("provenance", "test-result", "vsa", "rebuild", "sbom", "vex")
    keys: tuple[str, ...] | dict[str, tuple[str, ...]] = ()
    threshold: int = 1
    allow_unsigned: bool = False
    unsigned: str = "ignore"
    rebuilds: int = 0
    tag_binding: str = "warn"
    lock: str | None = None
    require_fixes: tuple[str, ...] = ()


_STRINGS = fields.items(fields.text())
_VERDICT = fields.choice(*VERDICTS)
_VERDICTS = fields.items(_VERDICT)


def _verdicts(value: object, path: str, problems: list[str]) -> str | tuple[str, ...]:
    """A ladder's accepted verdict: one (`PASS`) or a list of them."""
    return _VERDICT(value, path, problems) if isinstance(value, str) else _VERDICTS(value, path, problems)


_READ_FILE = fields.record(
    _PolicyFile,
    {
        "require": _STRINGS,
        "ladders": fields.either(_STRINGS, fields.mapping(fields.text(), _verdicts)),
        "builders": _STRINGS,
        "predicates": _STRINGS,
        "keys": fields.either(_STRINGS, fields.mapping(fields.text(), _STRINGS)),
        "threshold": fields.integer(ge=1),
        "allow_unsigned": fields.boolean,
        "unsigned": fields.choice(*UNSIGNED_MODES),
        "rebuilds": fields.integer(ge=0),
        "tag_binding": fields.choice(*TAG_BINDINGS),
        "lock": fields.optional(fields.text()),
        "require_fixes": fields.items(fields.text()),
    },
    unknown=UNKNOWN_KEY,
)


@dataclass(frozen=True)
class Policy:
    """What `check` requires (see the module docstring). `keys` are trusted for every predicate type;
    `typed_keys` only for theirs. `ladders` maps a required ladder to the verdicts it may have."""

    require: tuple[str, ...] = ("provenance", "verify")
    ladders: tuple[str, ...] = ()
    builders: tuple[str, ...] = (provenance.DEFAULT_BUILDER_ID,)
    predicates: tuple[str, ...] = (
        attest.PROVENANCE_V1,
        attest.TEST_RESULT_V01,
        attest.VSA_V1,
        REBUILD_V1,
        attest.CYCLONEDX_BOM,
        attest.OPENVEX_V020,
    )
    keys: tuple[Path, ...] = ()
    threshold: int = 1
    allow_unsigned: bool = False
    unsigned: str = "ignore"  # ignore | forbid (UNSIGNED_MODES)
    uri: str = "servimg:policy/default"
    typed_keys: tuple[tuple[str, tuple[Path, ...]], ...] = ()  # (predicate type URI, its keys), sorted
    verdicts: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (ladder, verdicts accepted) beyond PASS-only
    rebuilds: int = 0
    tag_binding: str = "warn"
    lock: Path | None = None
    # Who chose `builders` (said by check's builder row): nobody (servimg's placeholder), a policy file, or
    # --builder. Not part of the policy's JSON: it says where the trust came from, not what it is.
    builders_from: str = BUILDERS_BY_DEFAULT
    # Fixes this digest's trusted evidence must prove (core.fixid; `require_fixes:`, `--require-fix`).
    fixes: tuple[str, ...] = ()

    @classmethod
    def load(cls, path: Path) -> Policy:
        """A policy file (YAML or JSON); key and lock paths are relative to the file. Every problem
        at once."""
        try:
            doc = yaml.load(path.read_bytes(), Loader=StrictLoader)
        except OSError as exc:
            raise PolicyError(f"cannot read policy {path}: {exc.strerror}") from None
        except (yaml.YAMLError, ValueError, RecursionError) as exc:
            raise PolicyError(f"{path}: not valid YAML/JSON: {exc}") from None
        parsed = fields.read_all(
            _READ_FILE,
            doc if doc is not None else {},
            lambda problems: PolicyError(
                f"{path}: {len(problems)} problem(s) in the policy", problems=problems, hint=f"keys: {KEYS}"
            ),
        )
        chosen = isinstance(doc, dict) and "builders" in doc
        return replace(
            cls._from_file(parsed, path),
            builders_from=f"the policy {path} (builders:)" if chosen else BUILDERS_BY_DEFAULT,
        )

    @classmethod
    def _from_file(cls, parsed: _PolicyFile, path: Path) -> Policy:
        problems = [
            f"require: unknown requirement {r!r} (use {', '.join(REQUIREMENTS)} or a predicate type URI)"
            for r in parsed.require
            if r not in REQUIREMENTS and ":" not in r
        ]
        problems += [
            f"predicates: unknown predicate type {p!r} (use {', '.join(KIND_NAMES)} or a URI)"
            for p in parsed.predicates
            if p not in KIND_NAMES and ":" not in p
        ]
        here = path.parent
        shared: tuple[Path, ...] = ()
        typed: dict[str, tuple[Path, ...]] = {}
        if isinstance(parsed.keys, dict):
            for name, files in sorted(parsed.keys.items()):
                if name != ALL_TYPES and name not in KIND_NAMES and ":" not in name:
                    problems.append(f"keys.{name}: not a predicate type (use all, {', '.join(KIND_NAMES)})")
                elif name == ALL_TYPES:
                    shared = tuple(here / k for k in files)
                else:
                    typed[predicate_type(name)] = tuple(here / k for k in files)
        else:
            shared = tuple(here / k for k in parsed.keys)
        problems += [
            f"require_fixes: {f!r} is not a fix id: use {fixid.ACCEPTED}"
            for f in parsed.require_fixes
            if fixid.kind(f) is None
        ]
        if parsed.allow_unsigned and parsed.unsigned == "forbid":
            problems.append("unsigned: forbid contradicts allow_unsigned: true (choose one)")
        if problems:
            raise PolicyError(f"{path}: {len(problems)} problem(s) in the policy", problems=problems)
        if isinstance(parsed.ladders, dict):
            names = tuple(sorted(parsed.ladders))
            verdicts = tuple(
                (name, (v,) if isinstance(v, str) else tuple(v)) for name, v in sorted(parsed.ladders.items())
            )
        else:
            names, verdicts = tuple(parsed.ladders), ()
        return cls(
            require=parsed.require,
            ladders=names,
            builders=parsed.builders,
            predicates=tuple(predicate_type(p) for p in parsed.predicates),
            keys=shared,
            threshold=parsed.threshold,
            allow_unsigned=parsed.allow_unsigned,
            unsigned=parsed.unsigned,
            uri=path.resolve().as_uri(),
            typed_keys=tuple(sorted(typed.items())),
            verdicts=verdicts,
            rebuilds=parsed.rebuilds,
            tag_binding=parsed.tag_binding,
            lock=here / parsed.lock if parsed.lock is not None else None,
            fixes=parsed.require_fixes,
        )

    def merged(
        self,
        *,
        ladders: Sequence[str] = (),
        keys: Sequence[Path] = (),
        builders: Sequence[str] = (),
        threshold: int | None = None,
        allow_unsigned: bool = False,
        rebuilds: int | None = None,
        tag_binding: str | None = None,
        lock: Path | None = None,
        fixes: Sequence[str] = (),
    ) -> Policy:
        """Command-line flags on top: ladders and keys add, builders replace, unsigned only loosens; a
        rebuild count, a tag binding mode or a lock file given on the command line replaces the file's."""
        return replace(
            self,
            ladders=tuple(dict.fromkeys([*self.ladders, *ladders])),
            keys=tuple(dict.fromkeys([*self.keys, *keys])),
            builders=tuple(builders) or self.builders,
            builders_from="--builder" if builders else self.builders_from,
            threshold=threshold or self.threshold,
            allow_unsigned=self.allow_unsigned or allow_unsigned,
            rebuilds=self.rebuilds if rebuilds is None else rebuilds,
            tag_binding=tag_binding or self.tag_binding,
            lock=lock or self.lock,
            fixes=tuple(dict.fromkeys([*self.fixes, *_fix_ids(fixes)])),
        )

    def all_keys(self) -> tuple[Path, ...]:
        """Every key file the policy names (signatures are verified against all; the policy then says
        which predicate types each one may vouch for)."""
        return tuple(dict.fromkeys([*self.keys, *(k for _, files in self.typed_keys for k in files)]))

    def keys_for(self, predicate: str) -> tuple[Path, ...] | None:
        """The keys trusted for one predicate type; None when every trusted key is (no typed entry)."""
        typed = dict(self.typed_keys)
        if predicate not in typed:
            return None
        return tuple(dict.fromkeys([*self.keys, *typed[predicate]]))

    def accepted_verdicts(self, ladder: str) -> tuple[str, ...]:
        return dict(self.verdicts).get(ladder, ("PASS",))

    def to_json(self) -> dict[str, object]:
        return {
            "require": list(self.require),
            "ladders": {name: list(self.accepted_verdicts(name)) for name in self.ladders},
            "builders": list(self.builders),
            "predicates": list(self.predicates),
            "keys": [str(k) for k in self.keys],
            "typed_keys": {t: [str(k) for k in files] for t, files in self.typed_keys},
            "threshold": self.threshold,
            "allow_unsigned": self.allow_unsigned,
            "unsigned": self.unsigned,
            "rebuilds": self.rebuilds,
            "tag_binding": self.tag_binding,
            **({"require_fixes": list(self.fixes)} if self.fixes else {}),
            "lock": str(self.lock) if self.lock is not None else None,
            "uri": self.uri,
        }


def keyids_by_type(policy: Policy, keyid_of: Mapping[Path, str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(predicate type, keyids trusted for it) for each typed entry: what `evaluate` checks a verified
    signature against."""
    out = []
    for predicate, _ in policy.typed_keys:
        files = policy.keys_for(predicate) or ()
        out.append((predicate, tuple(sorted({keyid_of[f] for f in files}))))
    return tuple(out)


@dataclass(frozen=True)
class Trust:
    """What a policy's files say, each file read once per command (an index's children share it): the
    keys every signature is verified against, each key file's keyid (which predicate types a key may
    vouch for is judged in `evaluate`), and the `--lock` file when it is one platform's lock."""

    keys: tuple[VerifyKey, ...]
    keyid_of: Mapping[Path, str]
    lock: Lock | None = None

    @classmethod
    def of(cls, policy: Policy, lock: Lock | None = None) -> Trust:
        """Every key file the policy names, read once; `lock`: the `--lock` file as already read (else
        it is read here)."""
        loaded = {path: load_trusted([path])[0] for path in policy.all_keys()}
        if lock is None and policy.lock is not None:
            lock = Lock.load(policy.lock)
        return cls(tuple(dict.fromkeys(loaded.values())), {p: k.keyid for p, k in loaded.items()}, lock)
