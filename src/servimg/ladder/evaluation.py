"""The ladder's judgement, as pure functions over frozen values: metrics parsing, detectors, flips, gates,
verdict. No I/O here; the runner (`servimg.ladder.runner`) feeds in what the servers answered.

Vocabulary:
- a request is *ok* when no detector fires and its output starts with the probe's expected tokens;
- *corrupted* = not ok; a *forward flip* is a request the control got right and the arm got wrong, a
  *reverse flip* the opposite; noise flips both ways, a defect flips forward;
- *divergent* = the arm's greedy tokens differ from the control's (correct or not); the *noise floor*
  arm (a repeat of the control on a fresh server) measures how often that happens with no cache at all;
- *logprob delta* = the largest |logprob(arm) − logprob(control)| over the tokens both emitted alike.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from servimg.core.findings import FAIL, NOT_EXERCISED, PASS, WARN, Finding, Findings, Status
from servimg.ladder.definition import CACHED_ROLES, Detectors, Gate, LadderDefinition, Thresholds
from servimg.ladder.probeset import Expect

# ------------------------------------------------------------------------------------------ metrics


@dataclass(frozen=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


def parse_prometheus(text: str) -> tuple[Sample, ...]:
    """Samples of the Prometheus text exposition format (0.0.4); comments and malformed lines skipped."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        labels = tuple(
            (m.group(1), m.group(2).replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\"))
            for m in _LABEL.finditer(match.group(3) or "")
        )
        try:
            value = float(match.group(4))
        except ValueError:
            continue
        out.append(Sample(match.group(1), tuple(sorted(labels)), value))
    return tuple(out)


@dataclass(frozen=True)
class MetricsAdapter:
    """Maps the ladder's metric names to an engine's Prometheus names (first alias present wins)."""

    engine: str
    aliases: Mapping[str, tuple[str, ...]]

    def names(self, extra: Sequence[str] = ()) -> tuple[str, ...]:
        return tuple(sorted({*self.aliases, *extra}))

    def value(self, samples: Sequence[Sample], metric: str) -> float | None:
        """Sum over label sets (engines, models) of the metric; a raw name (with `:`) is taken as is.
        None when the server does not export it: absent is not zero."""
        candidates = self.aliases.get(metric, (metric,))
        for name in candidates:
            found = [s.value for s in samples if s.name == name]
            if found:
                return math.fsum(found)
        return None

    def snapshot(self, samples: Sequence[Sample], extra: Sequence[str] = ()) -> dict[str, float | None]:
        return {name: self.value(samples, name) for name in self.names(extra)}


ADAPTERS: Mapping[str, MetricsAdapter] = {
    "vllm": MetricsAdapter(
        "vllm",
        {
            "prefix_cache_queries": (
                "vllm:prefix_cache_queries_total",
                "vllm:gpu_prefix_cache_queries_total",
            ),
            "prefix_cache_hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
            "external_prefix_cache_queries": ("vllm:external_prefix_cache_queries_total",),
            "external_prefix_cache_hits": ("vllm:external_prefix_cache_hits_total",),
            "prompt_tokens": ("vllm:prompt_tokens_total",),
            "generation_tokens": ("vllm:generation_tokens_total",),
            "requests_finished": ("vllm:request_success_total",),
            "preemptions": ("vllm:num_preemptions_total",),
        },
    ),
}


def delta(before: Mapping[str, float | None], after: Mapping[str, float | None]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for key in sorted(set(before) | set(after)):
        a, b = before.get(key), after.get(key)
        out[key] = None if a is None or b is None else b - a
    return out


# ------------------------------------------------------------------------------------------ requests


@dataclass(frozen=True)
class Output:
    """One greedy completion: text, token ids and the logprob of each emitted token."""

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str | None = None
    prompt_token_ids: tuple[int, ...] = ()  # as the server tokenized a text prompt (when it says)


@dataclass(frozen=True)
class DetectorResult:
    name: str
    value: float
    limit: float
    fired: bool


def replacement_chars(text: str) -> int:
    return text.count("\ufffd")


def out_of_script_fraction(text: str, allowed: Sequence[str]) -> float:
    """Fraction of letters whose Unicode name does not start with an allowed script (LATIN, …)."""
    letters = [ch for ch in text if unicodedata.category(ch).startswith("L")]
    if not letters:
        return 0.0
    foreign = sum(1 for ch in letters if unicodedata.name(ch, "UNKNOWN").split(" ")[0] not in allowed)
    return foreign / len(letters)


def longest_block_repeat(text: str, min_chars: int, limit: int = 1500) -> int:
    """Most consecutive repeats of any block of at least `min_chars` characters (1 = no repeat), over the
    first `limit` characters. For each block size s, a run of L positions with text[i] == text[i+s] is a
    block of s characters repeated L // s + 1 times: O(n) per size."""
    text = text[:limit]
    n = len(text)
    best = 1
    for size in range(min_chars, n // 2 + 1):
        run = 0
        for i in range(n - size):
            if text[i] == text[i + size]:
                run += 1
                best = max(best, run // size + 1)
            else:
                run = 0
    return best


def ngram_repetition(token_ids: Sequence[int], n: int) -> float:
    """1 − distinct/total over the token n-grams (0 when there are none)."""
    grams = [tuple(token_ids[i : i + n]) for i in range(len(token_ids) - n + 1)]
    return 0.0 if not grams else 1 - len(set(grams)) / len(grams)


def detect(output: Output, detectors: Detectors) -> tuple[DetectorResult, ...]:
    out = []
    if detectors.replacement_char_max is not None:
        value = replacement_chars(output.text)
        out.append(
            DetectorResult(
                "replacement_char",
                value,
                detectors.replacement_char_max,
                value > detectors.replacement_char_max,
            )
        )
    if detectors.out_of_script_max_fraction is not None:
        frac = out_of_script_fraction(output.text, detectors.allowed_scripts)
        limit = detectors.out_of_script_max_fraction
        out.append(DetectorResult("out_of_script", round(frac, 6), limit, frac > limit))
    if detectors.repeated_block_max_repeats is not None:
        repeats = longest_block_repeat(output.text, detectors.repeated_block_min_chars)
        limit_r = detectors.repeated_block_max_repeats
        out.append(DetectorResult("repeated_block", repeats, limit_r, repeats > limit_r))
    if detectors.ngram_max_fraction is not None:
        frac = ngram_repetition(output.token_ids, detectors.ngram_n)
        out.append(
            DetectorResult(
                "ngram_repetition",
                round(frac, 6),
                detectors.ngram_max_fraction,
                frac > detectors.ngram_max_fraction,
            )
        )
    return tuple(out)


@dataclass(frozen=True)
class Judgement:
    ok: bool
    reasons: tuple[str, ...]
    detectors: tuple[DetectorResult, ...]
    expected_ok: bool | None  # None: the probe has no expectation


def judge(
    output: Output | None, expect: Expect | None, detectors: Detectors, error: str | None = None
) -> Judgement:
    if output is None:
        return Judgement(False, (f"no output: {error or 'request failed'}",), (), None)
    results = detect(output, detectors)
    reasons = [f"{r.name} {r.value} > {r.limit}" for r in results if r.fired]
    expected_ok: bool | None = None
    if expect is not None and expect.token_ids:
        want = expect.token_ids
        expected_ok = output.token_ids[: len(want)] == want
        if not expected_ok:
            got = list(output.token_ids[: len(want)])
            reasons.append(f"expected tokens {list(want)}, got {got}")
    elif expect is not None:
        expected_ok = output.text.strip().startswith(expect.text.strip())
        if not expected_ok:
            reasons.append(f"expected text {expect.text.strip()!r}, got {output.text.strip()[:40]!r}")
    return Judgement(not reasons, tuple(reasons), results, expected_ok)


# ------------------------------------------------------------------------------------------ arms


@dataclass(frozen=True)
class RequestOutcome:
    prompt_id: str
    family_id: str
    output: Output | None
    judgement: Judgement
    error: str | None = None


@dataclass(frozen=True)
class ArmOutcome:
    """What one arm produced (the runner's facts, nothing judged across arms yet)."""

    arm_id: str
    role: str
    requests: tuple[RequestOutcome, ...]
    metrics_delta: Mapping[str, float | None] = field(default_factory=dict)
    error: str | None = None
    witness_problems: tuple[str, ...] | None = None  # None: no witness in this image
    # overlay modules the arm's engine processes loaded (witness records; None: no witness) and the ones
    # its configuration should reach (`ArmSpec.witness_modules`, default every overlay module of the image)
    witness_loaded: tuple[str, ...] | None = None
    witness_expected: tuple[str, ...] = ()

    def witness_missing(self) -> tuple[str, ...]:
        """Overlay modules the arm should reach that no engine process of it loaded."""
        if self.witness_loaded is None:
            return ()
        return tuple(m for m in self.witness_expected if m not in self.witness_loaded)

    @property
    def corrupted(self) -> int:
        return sum(1 for r in self.requests if not r.judgement.ok)

    def by_prompt(self) -> dict[str, RequestOutcome]:
        return {r.prompt_id: r for r in self.requests}


@dataclass(frozen=True)
class RequestComparison:
    prompt_id: str
    divergent: bool
    first_divergence: int | None
    flip: str | None  # forward | reverse | None
    max_logprob_delta: float


@dataclass(frozen=True)
class Comparison:
    arm: str
    baseline: str
    compared: int
    divergent: int
    forward_flips: int
    reverse_flips: int
    max_logprob_delta: float
    requests: tuple[RequestComparison, ...]


def logprob_delta(a: Output, b: Output) -> tuple[int | None, float]:
    """(first index where the tokens differ or None, max |Δ logprob| over the identical prefix)."""
    first: int | None = None
    worst = 0.0
    for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids, strict=False)):
        if x != y:
            first = i
            break
        if i < len(a.logprobs) and i < len(b.logprobs):
            worst = max(worst, abs(a.logprobs[i] - b.logprobs[i]))
    if first is None and len(a.token_ids) != len(b.token_ids):
        first = min(len(a.token_ids), len(b.token_ids))
    return first, worst


def compare(arm: ArmOutcome, baseline: ArmOutcome) -> Comparison:
    """Per request: token divergence, correctness flip and logprob delta of `arm` against `baseline`."""
    base = baseline.by_prompt()
    rows = []
    for req in arm.requests:
        ref = base.get(req.prompt_id)
        if ref is None:
            continue
        flip = None
        if ref.judgement.ok and not req.judgement.ok:
            flip = "forward"
        elif req.judgement.ok and not ref.judgement.ok:
            flip = "reverse"
        first: int | None
        if req.output is None or ref.output is None:
            divergent, first, worst = req.output is not ref.output, 0, 0.0
        else:
            first, worst = logprob_delta(req.output, ref.output)
            divergent = first is not None
        rows.append(RequestComparison(req.prompt_id, divergent, first, flip, round(worst, 9)))
    return Comparison(
        arm.arm_id,
        baseline.arm_id,
        len(rows),
        sum(r.divergent for r in rows),
        sum(r.flip == "forward" for r in rows),
        sum(r.flip == "reverse" for r in rows),
        max((r.max_logprob_delta for r in rows), default=0.0),
        tuple(rows),
    )


# ------------------------------------------------------------------------------------------ verdict


@dataclass(frozen=True)
class GateResult:
    arm: str
    metric: str
    op: str
    value: float
    observed: float | None
    ok: bool


_OPS = {
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "==": lambda a, b: a == b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
}


def gate(arm_id: str, spec: Gate, metrics_delta: Mapping[str, float | None]) -> GateResult:
    observed = metrics_delta.get(spec.metric)
    ok = observed is not None and bool(_OPS[spec.op](observed, spec.value))
    return GateResult(arm_id, spec.metric, spec.op, spec.value, observed, ok)


@dataclass(frozen=True)
class NoiseFloor:
    measured: bool
    divergent: int
    max_logprob_delta: float


@dataclass(frozen=True)
class ArmVerdict:
    arm: str
    role: str
    result: Status
    reasons: tuple[str, ...]
    corrupted: int
    gates: tuple[GateResult, ...]
    comparison: Comparison | None


def arm_finding(arm: str, role: str, result: Status, reasons: Sequence[str]) -> Finding:
    """One arm's verdict as a finding (the receipt's arms are read back through this too)."""
    return Finding("ARM", result, f"{arm} ({role})", "; ".join(reasons) or "within the pre-registered limits")


@dataclass(frozen=True)
class LadderVerdict(Findings):
    """A ladder run as findings: one per arm, INVALID when the inputs changed, a WARN per deviation.
    Its verdict is the ladder's: FAIL over NOT_EXERCISED over PASS."""

    counted = (PASS, WARN, FAIL, NOT_EXERCISED)
    ladder: str = ""

    def title(self) -> str:
        return f"ladder: {self.ladder}"


def ladder_verdict(
    ladder: str, arms: Sequence[Finding], *, valid: bool = True, deviations: Sequence[str] = ()
) -> LadderVerdict:
    invalid = (
        ()
        if valid
        else (Finding("INVALID", FAIL, ladder, "the pre-registered inputs changed during the run"),)
    )
    warned = tuple(Finding("DEVIATION", WARN, ladder, d) for d in deviations)
    return LadderVerdict((*invalid, *arms, *warned), ladder=ladder)


@dataclass(frozen=True)
class Verdict:
    result: Status
    reasons: tuple[str, ...]
    arms: tuple[ArmVerdict, ...]
    noise: NoiseFloor
    valid: bool
    deviations: tuple[str, ...]


def noise_floor(
    ladder: LadderDefinition, outcomes: Mapping[str, ArmOutcome], model_family: str = ""
) -> NoiseFloor:
    """The model family's noise floor arm against its control (a ladder of one model: family "")."""
    arm = ladder.noise_floor(model_family)
    control = outcomes.get(ladder.control(model_family).id)
    if arm is None or arm.id not in outcomes or control is None or outcomes[arm.id].error:
        return NoiseFloor(False, 0, 0.0)
    c = compare(outcomes[arm.id], control)
    return NoiseFloor(True, c.divergent, c.max_logprob_delta)


def widest(floors: Sequence[NoiseFloor]) -> NoiseFloor:
    """The receipt's one noise floor over several families: measured only if every family's was."""
    return NoiseFloor(
        all(f.measured for f in floors),
        max((f.divergent for f in floors), default=0),
        max((f.max_logprob_delta for f in floors), default=0.0),
    )


def judge_arm(
    ladder: LadderDefinition,
    outcome: ArmOutcome,
    control: ArmOutcome | None,
    noise: NoiseFloor,
) -> ArmVerdict:
    t: Thresholds = ladder.thresholds
    spec = ladder.arm(outcome.arm_id)
    fails: list[str] = []
    if outcome.error:
        fails.append(f"arm error: {outcome.error}")
    if t.max_corrupted is not None and outcome.corrupted > t.max_corrupted:
        fails.append(f"{outcome.corrupted} corrupted request(s) > max_corrupted {t.max_corrupted}")
    if outcome.witness_problems:
        fails.append(
            f"witness: the serving process did not run the patched code ({outcome.witness_problems[0]})"
        )
    comparison = None
    if control is not None and spec.role != "control":
        comparison = compare(outcome, control)
        if spec.role != "noise_floor":
            if comparison.forward_flips > comparison.reverse_flips + t.flip_margin:
                fails.append(
                    f"{comparison.forward_flips} forward flip(s) over control > {comparison.reverse_flips} "
                    f"reverse + margin {t.flip_margin}"
                )
            if t.max_divergent_over_noise is not None:
                limit = noise.divergent + t.max_divergent_over_noise
                if comparison.divergent > limit:
                    fails.append(
                        f"{comparison.divergent} request(s) diverge from control > noise floor "
                        f"{noise.divergent} + {t.max_divergent_over_noise}"
                    )
            if t.max_logprob_delta_over_noise is not None:
                limit_lp = noise.max_logprob_delta + t.max_logprob_delta_over_noise
                if comparison.max_logprob_delta > limit_lp:
                    fails.append(
                        f"logprob delta {comparison.max_logprob_delta:.6g} > noise floor "
                        f"{noise.max_logprob_delta:.6g} + {t.max_logprob_delta_over_noise}"
                    )
    gates = tuple(gate(outcome.arm_id, g, outcome.metrics_delta) for g in spec.exercise)
    unexercised = [
        f"gate {g.metric} {g.op} {g.value:g} not met (observed {_observed(g.observed)})"
        for g in gates
        if not g.ok
    ]
    missing = outcome.witness_missing()
    if spec.role in CACHED_ROLES and missing:
        loaded = ", ".join(outcome.witness_loaded or ()) or "none"
        unexercised.append(
            f"witness: the arm's engine processes never loaded overlay module(s) {', '.join(missing)} "
            f"(loaded: {loaded})"
        )
    if fails:
        return ArmVerdict(
            outcome.arm_id, spec.role, FAIL, tuple(fails + unexercised), outcome.corrupted, gates, comparison
        )
    if unexercised:
        return ArmVerdict(
            outcome.arm_id, spec.role, NOT_EXERCISED, tuple(unexercised), outcome.corrupted, gates, comparison
        )
    return ArmVerdict(outcome.arm_id, spec.role, PASS, (), outcome.corrupted, gates, comparison)


def _observed(value: float | None) -> str:
    return "absent" if value is None else f"{value:g}"


def evaluate(
    ladder: LadderDefinition,
    outcomes: Sequence[ArmOutcome],
    *,
    inputs_unchanged: bool = True,
    deviations: Sequence[str] = (),
) -> Verdict:
    """FAIL if any arm fails (or the run is invalid), else NOT_EXERCISED if any gate was not met, else
    PASS. NOT_EXERCISED is never PASS; an arm that never ran is a FAIL."""
    by_id = {o.arm_id: o for o in outcomes}
    devs = list(deviations)
    floors = {family: noise_floor(ladder, by_id, family) for family in ladder.model_families}
    for family, floor in floors.items():
        if not floor.measured:
            whose = f" for model family {family}" if family else ""
            devs.append(
                f"no noise floor was measured{whose}: divergence and logprob limits are relative to "
                "exact equality"
            )
    arms = []
    reasons: list[str] = []
    for spec in ladder.arms:
        outcome = by_id.get(spec.id)
        if outcome is None:
            arms.append(ArmVerdict(spec.id, spec.role, FAIL, ("the arm did not run",), 0, (), None))
            continue
        control = by_id.get(ladder.control(spec.model_family).id)
        usable = control if control is not None and not control.error else None
        arms.append(judge_arm(ladder, outcome, usable, floors[spec.model_family]))
    noise = widest(list(floors.values()))
    for arm in arms:
        reasons += [f"{arm.arm}: {r}" for r in arm.reasons]
    if not inputs_unchanged:
        reasons.insert(0, "INVALID: the pre-registered inputs changed during the run")
        return Verdict(FAIL, tuple(reasons), tuple(arms), noise, False, tuple(devs))
    result = ladder_verdict(
        ladder.name, [arm_finding(a.arm, a.role, a.result, a.reasons) for a in arms]
    ).verdict
    if result == PASS and not any(a.role in CACHED_ROLES for a in arms):
        devs.append("no cached arm: the ladder compared servers but exercised no cache")
    return Verdict(result, tuple(reasons), tuple(arms), noise, True, tuple(devs))
