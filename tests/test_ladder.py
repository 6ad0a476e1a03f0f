"""The ladder's schema, metrics parsing, detectors, flip counting, verdict logic and receipt (no docker)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import REPO
from servimg.core import canonical
from servimg.core.errors import LadderError
from servimg.ladder import receipt
from servimg.ladder.definition import LadderDefinition, substitute
from servimg.ladder.evaluation import (
    ADAPTERS,
    FAIL,
    NOT_EXERCISED,
    PASS,
    ArmOutcome,
    Output,
    RequestOutcome,
    compare,
    delta,
    detect,
    evaluate,
    judge,
    longest_block_repeat,
    ngram_repetition,
    out_of_script_fraction,
    parse_prometheus,
)
from servimg.ladder.loading import load
from servimg.ladder.probeset import ProbeSet, probe_problems, send_keys

CPU_LADDER = REPO / "verify" / "ladders" / "cpu-smoke.yaml"


def cpu_doc() -> dict[str, Any]:
    doc = yaml.safe_load(CPU_LADDER.read_text())
    assert isinstance(doc, dict)
    return doc


def parse(doc: dict[str, Any]) -> LadderDefinition:
    return LadderDefinition.parse(yaml.safe_dump(doc))


# ------------------------------------------------------------------------------------------ schema


def test_the_shipped_ladders_load_with_their_pinned_probes() -> None:
    loaded = load(CPU_LADDER)
    assert loaded.definition.control().id == "control"
    assert loaded.definition.noise_floor() is not None
    assert len(loaded.probes.prompts) == 9
    gpu = LadderDefinition.parse((REPO / "verify" / "ladders" / "gpu-hybrid-lmcache.yaml").read_bytes())
    assert {a.role for a in gpu.arms} == {"control", "noise_floor", "cold", "warm", "restart"}


def test_every_problem_is_reported_at_once() -> None:
    doc = cpu_doc()
    doc["arms"][0]["role"] = "cold"  # no control left; and a cold arm without a gate
    doc["arms"][3]["server"] = "reuse:nope"
    doc["sampling"]["temperature"] = 0.7
    doc["server"]["args"].append("${undeclared}")
    with pytest.raises(LadderError) as err:
        parse(doc)
    text = " ".join(err.value.problems)
    assert "exactly one arm must have role control" in text
    assert "reuse:nope must name an earlier arm" in text
    assert "needs an exercise gate" in text
    assert "temperature must be 0" in text
    assert "${undeclared} is used but not declared" in text


def test_unknown_keys_and_duplicate_keys_are_refused() -> None:
    doc = cpu_doc()
    doc["arms"][1]["colour"] = "red"
    with pytest.raises(LadderError, match="problem"):
        parse(doc)
    with pytest.raises(LadderError, match="duplicate key"):
        LadderDefinition.parse(CPU_LADDER.read_text() + "name: again\n")


def test_reuse_arms_cannot_change_the_server_and_retain_needs_an_earlier_user() -> None:
    doc = cpu_doc()
    doc["arms"][3]["args"] = ["--x"]
    doc["arms"][4]["caches"] = {"vllm": "retain-from:warm"}
    with pytest.raises(LadderError) as err:
        parse(doc)
    text = " ".join(err.value.problems)
    assert "cannot change its args" in text
    assert "retain-from:warm must name an earlier arm using it" in text


def test_a_probe_set_whose_prompts_share_less_than_a_block_cannot_exercise(tmp_path: Path) -> None:
    ladder = load(CPU_LADDER)
    doc = json.loads(ladder.probes_bytes)
    for family in doc["families"]:
        for i, prompt in enumerate(family["prompts"]):
            prompt["token_ids"] = [i + 4, *prompt["token_ids"][1:]]  # prefixes diverge at token 0
    probes = ProbeSet.parse(json.dumps(doc).encode())
    problems = probe_problems(ladder.definition, probes)
    assert problems and "less than one cache block" in problems[0]


def test_a_probe_set_that_does_not_match_its_pin_is_refused(tmp_path: Path) -> None:
    (tmp_path / "verify" / "ladders").mkdir(parents=True)
    (tmp_path / "verify" / "probes").mkdir()
    (tmp_path / "verify" / "ladders" / "x.yaml").write_bytes(CPU_LADDER.read_bytes())
    data = (REPO / "verify" / "probes" / "cpu-copy.json").read_bytes()
    (tmp_path / "verify" / "probes" / "cpu-copy.json").write_bytes(data.replace(b'"cpu-copy"', b'"cpu-cop2"'))
    with pytest.raises(LadderError, match="the ladder pins"):
        load(tmp_path / "verify" / "ladders" / "x.yaml")


def test_substitute_refuses_a_missing_variable() -> None:
    assert substitute("${a}/b", {"a": "x"}) == "x/b"
    with pytest.raises(LadderError, match="no value"):
        substitute("${a}", {})


# What the ladder readers accept and how they coerce it: pydantic's lax mode, which the schema was
# written in until the readers replaced it (every `expected` here is what pydantic 2.14 gave).
COERCED: list[tuple[tuple[str | int, ...], Any, Any]] = [
    (("server", "port"), "8000", 8000),
    (("server", "port"), " 8000 ", 8000),
    (("server", "port"), 8000.0, 8000),
    (("server", "port"), "8_000", 8000),
    (("server", "port"), "8000.0", 8000),
    (("server", "port"), True, 1),
    (("server", "mounts", 0, "read_only"), "yes", True),
    (("server", "mounts", 0, "read_only"), "OFF", False),
    (("server", "mounts", 0, "read_only"), 0, False),
    (("server", "mounts", 0, "target"), "/x\n", "/x\n"),
    (("server", "startup_timeout_s"), "1e3", 1000.0),
    (("server", "startup_timeout_s"), 5, 5.0),
    (("arms", 2, "exercise", 0, "value"), 1, 1.0),
    (("arms", 2, "exercise", 0, "value"), "0.5", 0.5),
    (("arms", 2, "exercise", 0, "value"), True, 1.0),
    (("sampling", "max_tokens"), "8", 8),
    (("sampling", "temperature"), "0", 0.0),
    (("ladder_version",), True, 1),
    (("ladder_version",), 1.0, 1),
    (("description",), b"bytes", "bytes"),
    (("thresholds", "detectors", "ngram_max_fraction"), 1, 1.0),
    (("thresholds", "max_corrupted"), None, None),
]
REFUSED: list[tuple[tuple[str | int, ...], Any, str]] = [
    (("name",), "cpu-smoke\n", "name: should be an id"),
    (("server", "port"), 0, "server.port: should be >= 1"),
    (("server", "port"), 65536, "server.port: should be <= 65535"),
    (("server", "port"), "0x10", "server.port: should be an integer"),
    (("server", "port"), "٣", "server.port: should be an integer"),
    (("sampling", "max_tokens"), 8.5, "fractional part"),
    (("server", "startup_timeout_s"), 0, "server.startup_timeout_s: should be > 0"),
    (("server", "startup_timeout_s"), float("nan"), "server.startup_timeout_s: should be > 0"),
    (("server", "mounts", 0, "read_only"), 2, "read_only: should be true or false"),
    (("server", "mounts", 0, "read_only"), " yes", "read_only: should be true or false"),
    (("ladder_version",), 1.5, "ladder_version: should be 1"),
    (("ladder_version",), "1", "ladder_version: should be 1"),
    (("engine",), b"vllm", "engine: should be one of 'vllm'"),
    (("description",), 5, "description: should be a string, not an integer"),
    (("description",), b"\xff", "description: should be a string"),
    (("server", "command"), [], "server.command: should have at least 1 item"),
    (("server", "args"), "--x", "server.args: should be a list, not a string"),
    (("server", "env"), {"A": 1}, "server.env.A: should be a string"),
    (("caches", "vllm", "target"), "rel", "caches.vllm.target: should be an absolute path"),
    (("thresholds", "detectors", "ngram_max_fraction"), 1.5, "ngram_max_fraction: should be <= 1"),
    (("thresholds", "flip_margin"), None, "flip_margin: should be an integer, not null"),
    (("arms", 0, "role"), "boss", "arms[0].role: should be one of"),
    (("image",), {"ref": "x", "digest": "md5:x"}, "image.digest: "),
    (("probes", "sha256"), "A" * 64, "probes.sha256: should be a sha256"),
    (("model",), "tiny", "model: should be a mapping"),
]


def _edited(path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    doc = cpu_doc()
    parent: Any = doc
    for part in path[:-1]:
        parent = parent[part]
    parent[path[-1]] = value
    return doc


@pytest.mark.parametrize(("path", "value", "expected"), COERCED)
def test_the_readers_coerce_what_the_lax_schema_coerced(
    path: tuple[str | int, ...], value: Any, expected: Any
) -> None:
    got: Any = parse(_edited(path, value)).as_json()
    for part in path:
        got = got[part]
    assert got == expected and type(got) is type(expected), (got, expected)


@pytest.mark.parametrize(("path", "value", "fragment"), REFUSED)
def test_the_readers_refuse_what_the_lax_schema_refused(
    path: tuple[str | int, ...], value: Any, fragment: str
) -> None:
    with pytest.raises(LadderError) as err:
        parse(_edited(path, value))
    assert any(fragment in p for p in err.value.problems), err.value.problems


def test_parsed_ladders_are_frozen_values() -> None:
    ladder = load(CPU_LADDER).definition
    with pytest.raises(dataclasses.FrozenInstanceError):
        ladder.arms[0].role = "cold"  # type: ignore[misc]
    assert ladder == LadderDefinition.parse(CPU_LADDER.read_bytes())


def test_missing_and_unknown_keys_are_named_with_their_paths() -> None:
    doc = cpu_doc()
    del doc["sampling"], doc["arms"][2]["role"]
    doc["thresholds"]["detectors"]["colour"] = "red"
    with pytest.raises(LadderError) as err:
        parse(doc)
    assert set(err.value.problems) >= {
        "sampling: required key is missing",
        "arms[2].role: required key is missing",
        "thresholds.detectors.colour: unknown key (check the spelling; see docs/ladder.md)",
    }


def test_a_broken_arm_hides_none_of_the_rules_across_arms() -> None:
    doc = cpu_doc()
    doc["arms"][1]["args"] = [5]  # the noise arm does not validate: the others are still checked
    doc["arms"][4]["caches"] = {"vllm": "retain-from:warm"}
    doc["arms"][0]["role"] = "cold"
    with pytest.raises(LadderError) as err:
        parse(doc)
    assert err.value.problems == (
        "arms[1].args[0]: should be a string, not an integer",
        "arms: exactly one arm must have role control (the reference every arm is compared with)",
        "arms[0].exercise (control): a cold arm needs an exercise gate (NOT_EXERCISED is never PASS), "
        "e.g. exercise: [{metric: prefix_cache_hits, op: '>', value: 0}]",
        "arms[4].caches (restart): cache 'vllm': retain-from:warm must name an earlier arm using it",
    )


def test_probe_set_rules_report_every_problem() -> None:
    doc = json.loads((REPO / "tests" / "fixtures" / "ladder" / "toy-probes.json").read_bytes())
    family = doc["families"][0]
    family["prompts"][1]["id"] = family["prompts"][0]["id"]
    family["prompts"][0]["expect"] = {"text": " "}
    with pytest.raises(LadderError) as err:
        ProbeSet.parse(json.dumps(doc).encode())
    text = "\n".join(err.value.problems)
    assert "families[0].prompts[0].expect: give the expected token_ids or text" in text
    del family["prompts"][0]["expect"]
    with pytest.raises(LadderError, match="ids must be unique"):
        ProbeSet.parse(json.dumps(doc).encode())


def test_parsed_ladders_serialise_exactly_as_the_schema_library_did() -> None:
    """The receipt records an arm's spec, the thresholds and the sampling, and pre-registers the
    thresholds' sha256: `canonical.plain` must give pydantic's `model_dump(mode="json")` bytes
    (pinned in the fixture before pydantic was taken off: floats stay floats, defaults included)."""
    pinned = json.loads((REPO / "tests" / "fixtures" / "ladder" / "pydantic-dumps.json").read_text())
    for name, want in pinned.items():
        data = (REPO / name).read_bytes()
        if name.endswith(".json"):
            got = hashlib.sha256(canonical.dumps(ProbeSet.parse(data).as_json())).hexdigest()
            assert got == want["canonical_sha256"], name
            continue
        ladder = LadderDefinition.parse(data)
        assert ladder.canonical_bytes().decode() == want["canonical"], name
        assert ladder.thresholds_sha256 == want["thresholds_sha256"], name
        assert [canonical.dumps(canonical.plain(a)).decode() for a in ladder.arms] == want["arms"], name
        assert canonical.dumps(canonical.plain(ladder.sampling)).decode() == want["sampling"], name
    assert len(pinned) == 6


# ------------------------------------------------------------------------------------------ metrics

METRICS = """# HELP vllm:prefix_cache_hits Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="tiny-copy"} 256.0
vllm:prefix_cache_hits_created{engine="0",model_name="tiny-copy"} 1.7e+09
vllm:prefix_cache_hits_total{engine="1",model_name="tiny-copy"} 128.0
vllm:prefix_cache_queries_total{engine="0",model_name="a \\"quoted\\" name"} 405
garbage line without value
"""


def test_prometheus_text_is_parsed_and_summed_over_label_sets() -> None:
    samples = parse_prometheus(METRICS)
    vllm = ADAPTERS["vllm"]
    assert vllm.value(samples, "prefix_cache_hits") == 384.0
    assert vllm.value(samples, "prefix_cache_queries") == 405.0
    assert vllm.value(samples, "vllm:prefix_cache_hits_total") == 384.0  # a raw name
    assert vllm.value(samples, "external_prefix_cache_hits") is None  # absent is not zero
    quoted = next(s for s in samples if s.name == "vllm:prefix_cache_queries_total")
    assert dict(quoted.labels)["model_name"] == 'a "quoted" name'


def test_metric_deltas_keep_absent_metrics_absent() -> None:
    assert delta({"a": 1.0, "b": None}, {"a": 4.0, "b": 2.0}) == {"a": 3.0, "b": None}


# ------------------------------------------------------------------------------------------ detectors


def test_detectors() -> None:
    detectors = load(CPU_LADDER).definition.thresholds.detectors
    fine = Output(" bema bite bifi bafe", (10, 11, 12, 13), (0.0, 0.0, 0.0, 0.0))
    assert not any(d.fired for d in detect(fine, detectors))
    broken = Output("ab\ufffd", (1, 2), (0.0, 0.0))
    assert {d.name for d in detect(broken, detectors) if d.fired} == {"replacement_char"}
    assert out_of_script_fraction("abc жжж", ("LATIN",)) == 0.5
    assert longest_block_repeat("x" + "68 68 68 " * 5, 3) == 15  # "68 " fifteen times
    assert longest_block_repeat("x" + "68 68 68 " * 5, 8) == 5  # "68 68 68 " (9 chars) five times
    assert longest_block_repeat("abcdefgh ijklmnop", 4) == 1
    assert ngram_repetition([68, 68, 68, 68, 68], 2) == 0.75
    loop = Output(" 68" * 20, (68,) * 8, (0.0,) * 8)
    assert {d.name for d in detect(loop, detectors) if d.fired} == {"repeated_block", "ngram_repetition"}


# ------------------------------------------------------------------------------------------ verdict

LADDER = load(CPU_LADDER)
PROMPTS = [(f.id, p) for f, p in LADDER.probes.prompts]


def arm(
    arm_id: str, wrong: set[str] = frozenset(), hits: float | None = 128.0, lp: float = 0.0
) -> ArmOutcome:
    """An arm whose answers are right except for `wrong` prompts (answered with the token 4 repeated)."""
    detectors = LADDER.definition.thresholds.detectors
    role = LADDER.definition.arm(arm_id).role
    out = []
    for family, prompt in PROMPTS:
        assert prompt.expect is not None
        ids = tuple(prompt.expect.token_ids)
        if prompt.id in wrong:
            ids = (4, *ids[1:])
        output = Output(" ".join(f"w{i}" for i in ids), ids, (lp,) * len(ids))
        out.append(RequestOutcome(prompt.id, family, output, judge(output, prompt.expect, detectors)))
    metrics = {"prefix_cache_hits": hits, "prefix_cache_queries": 900.0}
    if arm_id.startswith("lmcache-"):  # served through LMCache's connector: its external metrics too
        metrics |= {"external_prefix_cache_hits": hits, "external_prefix_cache_queries": 900.0}
    return ArmOutcome(arm_id, role, tuple(out), metrics)


def clean() -> list[ArmOutcome]:
    return [
        arm("control", hits=0.0),
        arm("noise", hits=0.0),
        *(
            arm(a)
            for a in (
                "cold",
                "warm",
                "restart",
                "lmcache-cold",
                "lmcache-warm",
                "lmcache-restart",
                "lmcache-interleaved",
            )
        ),
    ]


def test_identical_outputs_with_cache_hits_pass() -> None:
    verdict = evaluate(LADDER.definition, clean())
    assert verdict.result == PASS, verdict.reasons
    assert verdict.noise.measured and verdict.noise.divergent == 0


def test_forward_flips_on_cached_arms_fail() -> None:
    outcomes = clean()
    outcomes[2] = arm("cold", wrong={"f0-p2", "f1-p2"})
    verdict = evaluate(LADDER.definition, outcomes)
    assert verdict.result == FAIL
    cold = next(a for a in verdict.arms if a.arm == "cold")
    assert cold.comparison is not None and cold.comparison.forward_flips == 2
    assert cold.comparison.reverse_flips == 0 and cold.comparison.divergent == 2
    assert any("forward flip" in r for r in cold.reasons)


def test_reverse_flips_balance_forward_flips_but_divergence_over_noise_still_counts() -> None:
    outcomes = clean()
    outcomes[0] = arm("control", wrong={"f0-p0"}, hits=0.0)
    outcomes[2] = arm("cold", wrong={"f1-p0"})
    comparison = compare(outcomes[2], outcomes[0])
    assert (comparison.forward_flips, comparison.reverse_flips) == (1, 1)
    verdict = evaluate(LADDER.definition, outcomes)
    reasons = " ".join(verdict.reasons)
    assert "forward flip" not in reasons and "diverge from control" in reasons


def test_noise_floor_raises_the_divergence_limit() -> None:
    doc = cpu_doc()
    doc["thresholds"]["max_corrupted"] = None
    ladder = parse(doc)
    outcomes = clean()
    outcomes[1] = arm("noise", wrong={"f2-p2"}, hits=0.0)
    outcomes[0] = arm("control", hits=0.0)
    outcomes[3] = arm("warm", wrong={"f2-p2"})
    outcomes[3] = ArmOutcome("warm", "warm", outcomes[1].requests, {"prefix_cache_hits": 50.0})
    verdict = evaluate(ladder, outcomes)
    warm = next(a for a in verdict.arms if a.arm == "warm")
    assert verdict.noise.divergent == 1
    assert not any("diverge" in r for r in warm.reasons)


def test_an_arm_without_cache_hits_is_not_exercised_never_pass() -> None:
    outcomes = clean()
    outcomes[3] = arm("warm", hits=0.0)
    verdict = evaluate(LADDER.definition, outcomes)
    assert verdict.result == NOT_EXERCISED
    outcomes[4] = arm("restart", hits=None)  # the server does not export the metric: not zero, absent
    verdict = evaluate(LADDER.definition, outcomes)
    assert verdict.result == NOT_EXERCISED
    assert any("observed absent" in r for r in verdict.reasons)


def test_fail_dominates_not_exercised_and_a_missing_arm_fails() -> None:
    outcomes = clean()
    outcomes[3] = arm("warm", hits=0.0)
    outcomes[4] = arm("restart", wrong={"f0-p1"})
    assert evaluate(LADDER.definition, outcomes).result == FAIL
    assert evaluate(LADDER.definition, clean()[:4]).result == FAIL


def test_logprob_delta_over_the_noise_floor_fails() -> None:
    outcomes = clean()
    outcomes[4] = arm("restart", lp=-0.2)
    verdict = evaluate(LADDER.definition, outcomes)
    assert verdict.result == FAIL and any("logprob delta" in r for r in verdict.reasons)


def test_changed_inputs_make_the_run_invalid() -> None:
    verdict = evaluate(LADDER.definition, clean(), inputs_unchanged=False)
    assert verdict.result == FAIL and not verdict.valid
    assert verdict.reasons[0].startswith("INVALID")


def test_a_witness_that_saw_unpatched_code_fails_the_arm() -> None:
    outcomes = clean()
    cold = outcomes[2]
    outcomes[2] = ArmOutcome(
        "cold", "cold", cold.requests, cold.metrics_delta, None, ("pid 7: stale pyc ran",)
    )
    verdict = evaluate(LADDER.definition, outcomes)
    assert verdict.result == FAIL and any("witness" in r for r in verdict.reasons)


def test_an_arm_error_fails_it() -> None:
    outcomes = clean()
    outcomes[2] = ArmOutcome("cold", "cold", (), {}, error="the server exited before it was healthy")
    verdict = evaluate(LADDER.definition, outcomes)
    assert verdict.result == FAIL and "cold: arm error" in verdict.reasons[0]


# ------------------------------------------------------------------------------------------ receipt


def test_receipt_seal_detects_edits_and_plot_is_deterministic(tmp_path: Path) -> None:
    arm = {
        "id": "cold",
        "role": "cold",
        "verdict": "FAIL",
        "reasons": ["3 corrupted"],
        "corrupted": 3,
        "requests": [{}] * 9,
        "comparison": {"forward_flips": 3, "requests": [{"max_logprob_delta": 0.5, "divergent": True}]},
    }
    doc = receipt.Receipt(
        receipt_version=1,
        run_id="r1",
        ladder={"name": "x", "thresholds": {"max_corrupted": 0, "max_logprob_delta_over_noise": 0.05}},
        image={"config_digest": "sha256:" + "a" * 64},
        inputs={},
        preregistration={},
        valid=True,
        verdict="FAIL",
        verdict_reasons=("cold: 3 corrupted",),
        deviations=(),
        noise_floor={},
        gates=(),
        arms=(receipt.ReceiptArm.from_json(arm),),
        timing={},
        started_at="2026-12-04T00:00:00Z",
        finished_at="2026-12-04T00:01:00Z",
    )
    assert receipt.Receipt.from_json(doc.to_json()) == doc  # the typed receipt reads back what it writes
    path = receipt.write(tmp_path, doc)
    sealed = receipt.load(path)
    assert receipt.check_seal(sealed) and receipt.read(path) == doc.sealed()
    svg = (tmp_path / "receipt.svg").read_text()
    assert svg.startswith("<svg") and "3/9" in svg
    assert receipt.plot_svg(receipt.read(path)) == svg
    # Issue 48 item 5: one name, one hash. What `servimg ladder` prints as receipt_sha256 is what the
    # attached test-result (and so `check` and `show`) names; the seal has a name of its own.
    from servimg.ladder.runner import summary
    from servimg.statements.derived import LadderReceipt

    printed = summary(receipt.read(path), path)
    assert printed["receipt_sha256"] == f"sha256:{LadderReceipt.parse(path.read_bytes()).sha256}"
    assert printed["receipt_seal"] == f"sha256:{doc.sealed().sha256}" != printed["receipt_sha256"]
    tampered = json.loads(path.read_bytes())
    tampered["verdict"] = "PASS"
    path.write_text(json.dumps(tampered))
    with pytest.raises(receipt.ReceiptError, match="does not match"):
        receipt.load(path)


def test_the_receipt_shape_is_what_servimg_attest_reads() -> None:
    from servimg.core.digest import Digest
    from servimg.statements.derived import LadderReceipt, ladder_predicate

    doc = receipt.seal(
        {
            "ladder": {"name": "cpu-smoke"},
            "verdict": "NOT_EXERCISED",
            "image": {"digest": "sha256:" + "b" * 64, "config_digest": "sha256:" + "c" * 64},
            "arms": [{"id": "control", "verdict": "PASS"}, {"id": "warm", "verdict": "NOT_EXERCISED"}],
            "finished_at": "2026-11-30T00:00:00Z",
        }
    )
    parsed = LadderReceipt.parse(json.dumps(doc).encode())
    predicate = ladder_predicate(
        parsed, Digest.parse("sha256:" + "b" * 64), Digest.parse("sha256:" + "c" * 64)
    )
    assert predicate["result"] == "FAILED"  # NOT_EXERCISED is never a pass


# ------------------------------------------------------------------------------------------ lock


def test_a_lock_with_a_ladder_keeps_its_exact_bytes_and_one_without_round_trips() -> None:
    from dataclasses import replace

    from servimg.definitions.lock import Lock

    path = REPO / "images" / "demo.lock.json"
    demo = Lock.load(path)
    assert demo.ladder is not None and demo.ladder.path == "verify/ladders/cpu-smoke.yaml"
    assert json.loads(path.read_bytes()) == demo.to_json()
    assert demo.to_json()["ladder"]["image_dir"] == "/opt/servimg/ladder"
    without = replace(demo, ladder=None)
    again = Lock.from_json(without.to_json())
    assert again == without and again.digest != demo.digest and "ladder" not in again.to_json()


# ------------------------------------------------------------------------------------------ runner helpers


def test_completions_are_parsed_with_or_without_token_ids() -> None:
    from servimg.backends.engine import device_requests
    from servimg.ladder.vllm import parse_completion

    logprobs = {"tokens": ["token_id:7", "token_id:9"], "token_logprobs": [-0.5, None]}
    with_ids = parse_completion({"choices": [{"text": " a b", "token_ids": [7, 9], "logprobs": logprobs}]})
    without = parse_completion(
        {"choices": [{"text": " a b", "logprobs": logprobs, "finish_reason": "length"}]}
    )
    assert with_ids.token_ids == without.token_ids == (7, 9)
    assert without.logprobs[0] == -0.5 and without.finish_reason == "length"
    assert device_requests(None) == []
    assert len(device_requests("0,1")) == 1


def test_text_probes_are_judged_on_text_and_checked_on_characters() -> None:
    doc = yaml.safe_load((REPO / "verify" / "ladders" / "gpu-hybrid-lmcache.yaml").read_text())
    ladder = LadderDefinition.parse(yaml.safe_dump(doc))
    probes = ProbeSet.parse((REPO / "verify" / "probes" / "gpu-needles.json").read_bytes())
    assert probe_problems(ladder, probes) == []
    _, prompt = probes.prompts[0]
    assert prompt.expect is not None and not prompt.token_ids
    detectors = ladder.thresholds.detectors
    right = Output(f" {prompt.expect.text}.\n", (1, 2), (0.0, 0.0))
    assert judge(right, prompt.expect, detectors).ok
    assert not judge(Output(" 12345.", (1, 2), (0.0, 0.0)), prompt.expect, detectors).ok
    frozen = LadderDefinition.parse(yaml.safe_dump({**doc, "probe_tokens": "frozen"}))
    assert any("no token_ids" in p for p in probe_problems(frozen, probes))


def test_pre_registration_sees_an_input_changed_mid_run(tmp_path: Path) -> None:
    from servimg.ladder.prereg import capture_inputs

    (tmp_path / "verify" / "ladders").mkdir(parents=True)
    (tmp_path / "verify" / "probes").mkdir()
    ladder_path = tmp_path / "verify" / "ladders" / "cpu-smoke.yaml"
    ladder_path.write_bytes(CPU_LADDER.read_bytes())
    (tmp_path / "verify" / "probes" / "cpu-copy.json").write_bytes(LADDER.probes_bytes)
    loaded = load(ladder_path)
    before = capture_inputs(loaded, {"model_dir": "/m"}, None)
    assert before.sha256 == capture_inputs(loaded, {"model_dir": "/m"}, None).sha256
    harness = {"servimg/ladder/runner.py", "servimg/ladder/evaluation.py", "servimg/ladder/receipt.py"}
    assert set(before.harness) >= harness
    ladder_path.write_text(ladder_path.read_text().replace("flip_margin: 0", "flip_margin: 9"))
    assert capture_inputs(loaded, {"model_dir": "/m"}, None).sha256 != before.sha256


# ------------------------------------------------------------------------------------------ model families

HYBRID_LADDER = load(REPO / "verify" / "ladders" / "cpu-hybrid.yaml")


def hybrid_arm(arm_id: str, tokens: int = 7, lp: float = -1.0, hits: float = 256.0) -> ArmOutcome:
    """An arm of the hybrid ladder answering every prompt with `tokens` (random models: no expectation)."""
    ladder = HYBRID_LADDER.definition
    out = []
    for family, prompt in HYBRID_LADDER.probes.prompts:
        ids = (tokens,) * 8
        output = Output(" ".join(f"w{i}" for i in ids), ids, (lp,) * len(ids))
        out.append(
            RequestOutcome(prompt.id, family.id, output, judge(output, None, ladder.thresholds.detectors))
        )
    role = ladder.arm(arm_id).role
    return ArmOutcome(arm_id, role, tuple(out), {"prefix_cache_hits": 0.0 if "control" in arm_id else hits})


def hybrid_clean(gdn: int = 7, mamba2: int = 9) -> list[ArmOutcome]:
    """Each family answers its own way (different models): only its own control is the reference."""
    return [
        hybrid_arm(a.id, tokens=gdn if a.model_family == "gdn" else mamba2)
        for a in HYBRID_LADDER.definition.arms
    ]


def test_the_hybrid_ladder_judges_each_arm_against_its_model_familys_control() -> None:
    ladder = HYBRID_LADDER.definition
    assert ladder.model_families == ("gdn", "mamba2")
    assert ladder.control("mamba2").id == "mamba2-control"
    assert [p.expect for _, p in HYBRID_LADDER.probes.prompts] == [None] * 9
    verdict = evaluate(ladder, hybrid_clean())
    assert verdict.result == PASS, verdict.reasons
    assert verdict.noise.measured and verdict.noise.divergent == 0


def test_the_hybrid_ladder_is_bit_exact_a_logprob_moved_by_2e_05_fails() -> None:
    """The size of the wrong state measured with checkpoint writes skipped on a random-weight model."""
    outcomes = hybrid_clean()
    index = [o.arm_id for o in outcomes].index("mamba2-warm")
    outcomes[index] = hybrid_arm("mamba2-warm", tokens=9, lp=-1.0 + 2.2e-05)
    verdict = evaluate(HYBRID_LADDER.definition, outcomes)
    assert verdict.result == FAIL
    assert [r for r in verdict.reasons if "logprob delta" in r] == [
        "mamba2-warm: logprob delta 2.2e-05 > noise floor 0 + 0.0"
    ]


def test_a_failed_mamba2_engine_fails_its_arms_only() -> None:
    outcomes = hybrid_clean()
    index = [o.arm_id for o in outcomes].index("mamba2-cold")
    outcomes[index] = ArmOutcome("mamba2-cold", "cold", (), {}, error="HTTP 500")
    verdict = evaluate(HYBRID_LADDER.definition, outcomes)
    failed = {a.arm for a in verdict.arms if a.result == FAIL}
    assert verdict.result == FAIL and failed == {"mamba2-cold"}


def test_each_model_family_needs_its_own_control_first() -> None:
    doc = yaml.safe_load((REPO / "verify" / "ladders" / "cpu-hybrid.yaml").read_text())
    doc["arms"] = [a for a in doc["arms"] if a["id"] != "mamba2-control"]  # gdn's control is no reference
    with pytest.raises(LadderError) as caught:
        parse(doc)
    assert list(caught.value.problems) == [
        "arms (model_family mamba2): exactly one arm must have role control (the reference every arm is "
        "compared with)"
    ]


def test_an_arm_sends_its_own_prompt_order_and_repeats_keep_their_own_facts(tmp_path: Path) -> None:
    loaded = LADDER
    interleaved = loaded.definition.arm("lmcache-interleaved")
    sent = [prompt.id for _, prompt in loaded.prompts_for(interleaved)]
    assert sent[:3] == ["f0-p2", "f0-p0", "f0-p2"] and len(sent) == 9
    assert [p.id for _, p in loaded.prompts_for(loaded.definition.control())] == [p.id for _, p in PROMPTS]
    assert send_keys(sent[:3]) == ["f0-p2", "f0-p0", "f0-p2@2"]
    # an arm naming a prompt the probe set lacks is refused at load, with the arm named
    doc = cpu_doc()
    doc["arms"][8]["prompts"] = ["f0-p2", "f9-p9"]
    doc["probes"]["path"] = str(REPO / "verify" / "probes" / "cpu-copy.json")
    path = tmp_path / "ladder.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(LadderError) as caught:
        load(path)
    assert list(caught.value.problems) == ["arm lmcache-interleaved: prompts f9-p9 are not in the probe set"]


def test_a_ladder_of_one_model_keeps_its_canonical_bytes() -> None:
    """model_family and prompts are left out of an arm's canonical form when unset."""
    spec = canonical.plain(LADDER.definition.arm("cold"))
    assert isinstance(spec, dict) and "model_family" not in spec and "prompts" not in spec
    assert canonical.plain(HYBRID_LADDER.definition.arm("gdn-cold"))["model_family"] == "gdn"  # type: ignore[index]
