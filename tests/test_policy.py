"""Policy as data, tag ↔ lock binding, `--lock` and rebuild verdicts, as pure functions (issue 14).

The same code paths run for real in tests/test_tag_binding.py (registry, engine, a real rebuild); here each
verdict and reason is pinned on synthetic evidence, in milliseconds.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from servimg.core.digest import Digest
from servimg.core.errors import ServimgError
from servimg.definitions.definition import template_regex
from servimg.judging.check import FAIL, PASS, WARN, Policy, evaluate
from servimg.judging.policy import REBUILD_V1, PolicyError, Trust, keyids_by_type
from servimg.judging.rebuild import Rebuilt, rebuild_predicate
from servimg.oci.image import Image
from servimg.signing import dsse, keys
from servimg.statements import attest, binding
from servimg.statements.derived import ImageFacts
from test_provenance import _clean, _envelope, _evidence, _found, _statement, facts, image, key

__all__ = ["facts", "image", "key"]  # fixtures from test_provenance


def _rows(report: object) -> dict[str, tuple[str, str]]:
    return {r.subject: (str(r.status), r.message) for r in report.findings}  # type: ignore[attr-defined]


def _located(ev: object, ref: str) -> object:
    return dataclasses.replace(ev, located=dataclasses.replace(ev.located, ref=ref))  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------------------------ policy file


def test_policy_file_with_every_option(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(
        "require: [provenance, verify]\n"
        "keys: {all: [ci.pub], rebuild: [rebuilder-a.pub, rebuilder-b.pub]}\n"
        "ladders: {smoke: PASS, cold: [PASS, NOT_EXERCISED]}\n"
        "rebuilds: 2\n"
        "tag_binding: require\n"
        "lock: images/tiny.lock.json\n"
        "builders: [https://ci.example/builder]\n"
    )
    policy = Policy.load(path)
    assert policy.keys == (tmp_path / "ci.pub",)
    assert policy.keys_for(REBUILD_V1) == tuple(
        tmp_path / k for k in ("ci.pub", "rebuilder-a.pub", "rebuilder-b.pub")
    )
    assert policy.keys_for(attest.PROVENANCE_V1) is None, "untyped: every shared key"
    assert set(policy.all_keys()) == {tmp_path / k for k in ("ci.pub", "rebuilder-a.pub", "rebuilder-b.pub")}
    assert policy.ladders == ("cold", "smoke") and policy.accepted_verdicts("cold") == (
        "PASS",
        "NOT_EXERCISED",
    )
    assert (
        policy.rebuilds == 2
        and policy.tag_binding == "require"
        and policy.lock == tmp_path / "images/tiny.lock.json"
    )
    as_json = policy.to_json()
    assert as_json["ladders"] == {"cold": ["PASS", "NOT_EXERCISED"], "smoke": ["PASS"]}
    json.dumps(as_json)
    # Flags on top: the command line's count, mode and lock win; keys and ladders add.
    merged = policy.merged(rebuilds=0, tag_binding="warn", ladders=["extra"], keys=[tmp_path / "x.pub"])
    assert merged.rebuilds == 0 and merged.tag_binding == "warn" and "extra" in merged.ladders
    assert merged.keys == (tmp_path / "ci.pub", tmp_path / "x.pub")
    # JSON is a policy too.
    path.write_text(json.dumps({"keys": ["a.pub"], "rebuilds": 1}))
    assert Policy.load(path).rebuilds == 1 and Policy.load(path).keys == (tmp_path / "a.pub",)


def test_policy_problems_are_collected_with_their_paths(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("rebuilds: -1\ntag_binding: sometimes\nladders: {smoke: GREEN}\nkeyz: []\n")
    with pytest.raises(PolicyError) as caught:
        Policy.load(path)
    problems = "\n".join(caught.value.problems)
    for where in ("rebuilds:", "tag_binding:", "ladders", "keyz: unknown key"):
        assert where in problems, problems
    assert "docs/policy.md" in problems
    path.write_text("keys: {sbom-ish: [a.pub]}\npredicates: [provenance, nonsense]\nrequire: [magic]\n")
    with pytest.raises(PolicyError) as caught:
        Policy.load(path)
    assert len(caught.value.problems) == 3, caught.value.problems
    path.write_text("rebuilds: 1\nrebuilds: 2\n")
    with pytest.raises(PolicyError, match="duplicate key"):
        Policy.load(path)
    with pytest.raises(PolicyError, match="cannot read"):
        Policy.load(tmp_path / "missing.yaml")


def test_keys_trusted_for_one_predicate_type_only(
    facts: ImageFacts, image: Image, key: dsse.SigningKey, tmp_path: Path
) -> None:
    """A key trusted only for rebuild statements cannot vouch for the provenance."""
    found = _clean(image, facts, key)
    ev = _evidence(image, facts, found)
    typed = ((attest.PROVENANCE_V1, ("someone-else",)),)
    report = evaluate(Policy(), dataclasses.replace(ev, typed_trust=typed))
    # Ignored (a WARN that names why), so the provenance requirement has nothing verified to rest on.
    warned = [r.message for r in report.findings if r.status == WARN]
    assert any("which the policy does not trust for https://slsa.dev/provenance/v1" in m for m in warned), (
        warned
    )
    assert any("no verified provenance" in r.message for r in report.failures())
    allowed = ((attest.PROVENANCE_V1, (key.keyid,)),)
    assert evaluate(Policy(), dataclasses.replace(ev, typed_trust=allowed)).ok
    policy = Policy(keys=(tmp_path / "a",), typed_keys=((REBUILD_V1, (tmp_path / "b",)),))
    assert keyids_by_type(policy, {tmp_path / "a": "A", tmp_path / "b": "B"}) == ((REBUILD_V1, ("A", "B")),)


# ------------------------------------------------------------------------------------------------ tags


def test_template_shapes() -> None:
    assert binding.named_lock("demo-0.32.0-d457eb08619e", [binding.DEFAULT_TEMPLATE]) == "d457eb08619e"
    assert binding.named_lock("tiny-1.0-0123456789ab", ["{name}-{tinypkg}-{lock12}"]) == "0123456789ab"
    assert binding.named_lock("x-" + "a" * 64, ["{name}-{lock}"]) == "a" * 64
    assert binding.named_lock("latest", [binding.DEFAULT_TEMPLATE]) is None
    assert binding.named_lock("demo-0.32.0-D457EB08619E", [binding.DEFAULT_TEMPLATE]) is None
    assert binding.named_lock("demo-0.32.0", ["{name}-{vllm}"]) is None, "a template without a lock field"
    assert template_regex("{name}-{vllm}") is None
    assert binding.tag_of("reg:5000/a/b:t1") == "t1"
    assert binding.tag_of("reg:5000/a/b@sha256:" + "0" * 64) is None
    assert binding.tag_of("oci:/tmp/x:t2") == "t2" and binding.tag_of("docker-daemon:a/b:t3") == "t3"
    assert binding.templates_of({"tag": "{name}-{lock12}"}) == ("{name}-{lock12}", binding.DEFAULT_TEMPLATE)


def test_tag_rows(facts: ImageFacts, image: Image, key: dsse.SigningKey) -> None:
    ev = _evidence(image, facts, _clean(image, facts, key))
    mine = facts.lock.digest.hex[:12]
    bound = evaluate(Policy(), _located(ev, f"reg.invalid/servimg/vllm:demo-0.32.0-{mine}"))
    assert bound.ok and _rows(bound)["tag"][0] == PASS
    other = "d457eb08619e" if mine != "d457eb08619e" else "0" * 12
    repointed = evaluate(Policy(), _located(ev, f"reg.invalid/servimg/vllm:demo-0.32.0-{other}"))
    status, why = _rows(repointed)["tag"]
    assert status == FAIL and f"names lock {other}" in why and str(facts.lock.digest) in why
    assert [r.subject for r in repointed.failures()] == ["tag"]
    unbound = evaluate(Policy(), _located(ev, "reg.invalid/servimg/vllm:latest"))
    assert (
        unbound.ok and _rows(unbound)["tag"][0] == WARN and "not bound to a lock" in _rows(unbound)["tag"][1]
    )
    strict = evaluate(Policy(tag_binding="require"), _located(ev, "reg.invalid/servimg/vllm:latest"))
    assert _rows(strict)["tag"][0] == FAIL
    by_digest = evaluate(
        Policy(tag_binding="require"), _located(ev, f"reg.invalid/servimg/vllm@{image.digest}")
    )
    assert _rows(by_digest)["tag"][0] == PASS


def test_tag_fails_when_label_lock_and_provenance_disagree() -> None:
    lock = Digest.of_bytes(b"lock")
    sources = binding.LockSources(str(lock), lock, (str(Digest.of_bytes(b"other")),))
    finding = binding.tag_row(f"x-y-{lock.hex[:12]}", [binding.DEFAULT_TEMPLATE], sources, "warn")
    assert (
        finding.status == FAIL and "not one value" in finding.message and "provenance says" in finding.message
    )
    agreeing = binding.LockSources(str(lock), lock, (str(lock),))
    assert (
        binding.tag_row(f"x-y-{lock.hex[:12]}", [binding.DEFAULT_TEMPLATE], agreeing, "warn").status == PASS
    )


def test_push_and_promote_refusal() -> None:
    lock = Digest.of_bytes(b"lock")
    binding.refuse_rebinding(f"demo-1-{lock.hex[:12]}", {}, lock, "push under")
    binding.refuse_rebinding("latest", {}, lock, "push under")
    binding.refuse_rebinding(None, {}, lock, "push under")
    with pytest.raises(binding.TagBindingError, match="names lock 0123456789ab"):
        binding.refuse_rebinding("demo-1-0123456789ab", {}, lock, "push under")
    with pytest.raises(binding.TagBindingError, match="refusing to promote"):
        binding.refuse_rebinding("t-0123456789ab", {"tag": "t-{lock12}"}, lock, "promote")


# ------------------------------------------------------------------------------------------------ --lock


def test_lock_file_rows(facts: ImageFacts, image: Image, key: dsse.SigningKey) -> None:
    ev = _evidence(image, facts, _clean(image, facts, key))
    same = evaluate(Policy(), dataclasses.replace(ev, lock_file=("images/demo.lock.json", facts.lock)))
    assert _rows(same)["lock file"][0] == PASS
    first = facts.lock.overlays[0]
    other = dataclasses.replace(
        facts.lock,
        base=dataclasses.replace(facts.lock.base, manifest_digest=Digest("sha256", "1" * 64)),
        overlays=(dataclasses.replace(first, patch_sha256="2" * 64), *facts.lock.overlays[2:]),
    )
    report = evaluate(Policy(), dataclasses.replace(ev, lock_file=("images/other.lock.json", other)))
    status, why = _rows(report)["lock file"]
    assert status == FAIL and str(other.digest) in why and str(facts.lock.digest) in why
    assert "base.manifest_digest: the lock file has" in why
    assert f"overlay {first.id} patch_sha256: the lock file has" in why
    assert f"overlay {facts.lock.overlays[1].id}: in the image, not in the lock file" in why
    no_lock = binding.lock_row("x.lock.json", facts.lock, binding.LockSources(None, None), None)
    assert no_lock.status == FAIL


def test_lock_file_names_a_label_that_disagrees(facts: ImageFacts) -> None:
    sources = binding.LockSources("sha256:" + "9" * 64, facts.lock.digest)
    finding = binding.lock_row("x.lock.json", facts.lock, sources, facts.lock)
    assert finding.status == FAIL and "label says sha256:9999" in finding.message


# ------------------------------------------------------------------------------------------------ rebuild


def test_rebuild_rows_and_independent_rebuild_attestations(
    facts: ImageFacts, image: Image, key: dsse.SigningKey
) -> None:
    ev = _evidence(image, facts, _clean(image, facts, key))
    match = Rebuilt(image.digest, image.digest, 12.5, "images/demo.yaml", str(facts.lock.digest))
    report = evaluate(Policy(), dataclasses.replace(ev, rebuild=match))
    assert _rows(report)["rebuild"][0] == PASS and "bit-identical" in _rows(report)["rebuild"][1]
    other = Digest.of_bytes(b"rebuilt")
    mismatch = dataclasses.replace(match, rebuilt=other, differences=("layer 1: ~ opt/x.py content",))
    status, why = _rows(evaluate(Policy(), dataclasses.replace(ev, rebuild=mismatch)))["rebuild"]
    assert status == FAIL and "opt/x.py" in why and str(other) in why
    failed = Rebuilt(image.digest, problem="no definition images/demo.yaml here")
    assert _rows(evaluate(Policy(), dataclasses.replace(ev, rebuild=failed)))["rebuild"][0] == FAIL
    # Rebuild attestations: two keys, one mismatch, one about another image.
    second = dsse.SigningKey.generate()
    trusted = [key.public_key, second.public_key]

    def attested(result: Rebuilt, signer: dsse.SigningKey, n: int) -> object:
        predicate = rebuild_predicate(result, f"urn:{n}", "2026-01-01T00:00:00Z")
        envelope = _envelope(_statement(image, REBUILD_V1, predicate), signer)
        return _found(envelope, "rebuild", trusted, n)

    one = [*_clean(image, facts, key), attested(match, key, 5)]
    assert evaluate(Policy(rebuilds=1), dataclasses.replace(ev, found=tuple(one))).ok
    two = evaluate(Policy(rebuilds=2), dataclasses.replace(ev, found=tuple(one)))
    assert _rows(two)["rebuilds"][0] == FAIL and "1 independent" in _rows(two)["rebuilds"][1]
    same_key_twice = [*one, attested(match, key, 6)]
    assert not evaluate(Policy(rebuilds=2), dataclasses.replace(ev, found=tuple(same_key_twice))).ok
    with_mismatch = [*one, attested(mismatch, second, 7)]
    assert not evaluate(Policy(rebuilds=2), dataclasses.replace(ev, found=tuple(with_mismatch))).ok
    both = [*one, attested(match, second, 8)]
    report = evaluate(Policy(rebuilds=2), dataclasses.replace(ev, found=tuple(both)))
    assert report.ok and "urn:5, urn:8" in _rows(report)["rebuilds"][1]


# ------------------------------------------------------------------------------------------------ build --tag


def test_build_refuses_a_template_tag_naming_another_lock(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`servimg build --tag` (or a tag in --to) is a publish too: never another lock's template tag."""
    import fakebase as fb

    base = fb.make_base(tmp_path / "base", [fb.tar(fb.package_members())])
    definition = fb.make_repo(tmp_path / "repo", base)
    cache = str(tmp_path / "cache")
    assert fb.main(["lock", str(definition), "--cache", cache, "--quiet"]) == 0
    out = tmp_path / "out"
    for flags in (["--tag", "tiny-0123456789ab"], []):
        to = f"oci:{out}" if flags else f"oci:{out}:tiny-0123456789ab"
        assert fb.main(["build", str(definition), "--to", to, "--cache", cache, *flags]) == 1
        assert "names lock 0123456789ab" in capsys.readouterr().out
        assert not out.exists(), "nothing published"
    assert fb.main(["build", str(definition), "--to", f"oci:{out}:latest", "--cache", cache, "--quiet"]) == 0


def test_the_policy_files_are_read_once_into_its_trust(tmp_path: Path, facts: ImageFacts) -> None:
    """Issue 49: `check` read every key file twice (once for its keyid, once with all), and an index's
    `--lock` once for the index and again for each child; `Trust` reads each once, and a child check takes
    the caller's."""
    one = keys.generate(tmp_path / "one")
    two = keys.generate(tmp_path / "two")
    policy = Policy(keys=(one.public, two.private, one.public))
    trust = Trust.of(policy)
    assert trust.keyid_of == {one.public: one.keyid, two.private: two.keyid}
    assert sorted(k.keyid for k in trust.keys) == sorted({one.keyid, two.keyid}) and trust.lock is None
    lock_path = tmp_path / "tiny.lock.json"
    with pytest.raises(ServimgError):  # no such file: read when the policy names it and none is given
        Trust.of(dataclasses.replace(policy, lock=lock_path))
    given = Trust.of(dataclasses.replace(policy, lock=lock_path), facts.lock)
    assert given.lock is facts.lock  # as the caller read it: not read again
