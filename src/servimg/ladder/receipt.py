"""The ladder receipt: canonical JSON with its own content sha256, and a small SVG plot beside it.

`seal` adds `sha256` = sha256 of the canonical JSON of everything else, so any edit is detectable
(`check_seal`). The shape is what `servimg attest --predicate-type test-result --file receipt.json`
(`provenance.LadderReceipt`) reads: `ladder.name`, `verdict`, `image.{digest,config_digest}`,
`arms[].{id,verdict}`, `finished_at`. The plot is hand-written SVG (no plotting dependency): per arm,
corrupted requests and forward flips against the pre-registered limits, and each request's logprob delta
against the noise-floor limit. Deterministic for a given receipt.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any

from servimg.core import canonical
from servimg.core import jsonview as jv
from servimg.core.atomic import atomic_write
from servimg.core.digest import sha256_hex
from servimg.core.errors import ServimgError
from servimg.core.findings import Status
from servimg.ladder.definition import ArmSpec
from servimg.ladder.evaluation import (
    ArmOutcome,
    ArmVerdict,
    Comparison,
    LadderVerdict,
    RequestOutcome,
    Verdict,
    arm_finding,
    ladder_verdict,
)
from servimg.ladder.loading import LoadedLadder
from servimg.ladder.prereg import Inputs, now
from servimg.ladder.probeset import send_keys


class ReceiptError(ServimgError):
    """A ladder receipt is unreadable, malformed, or does not match its seal."""


RECEIPT_VERSION = 1


@dataclass(frozen=True)
class ReceiptArm:
    """One arm of a receipt: who it is, its verdict and reasons; `facts` holds the rest as recorded
    (spec, gates, comparison, requests, server, caches, witness, timing …)."""

    id: str
    role: str
    verdict: str
    reasons: tuple[str, ...]
    facts: Mapping[str, object] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {
            **self.facts,
            "id": self.id,
            "role": self.role,
            "verdict": self.verdict,
            "reasons": list(self.reasons),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, object]) -> ReceiptArm:
        own = ("id", "role", "verdict", "reasons")
        return cls(
            jv.text(doc.get("id"), "arms[].id"),
            jv.text(doc.get("role"), "arms[].role"),
            jv.text(doc.get("verdict"), "arms[].verdict"),
            tuple(jv.texts(doc.get("reasons") or [], "arms[].reasons")),
            {k: v for k, v in doc.items() if k not in own},
        )


@dataclass(frozen=True)
class Receipt:
    """A ladder receipt (`receipt.json`) as typed values. `to_json` is the document `seal` hashes (its
    canonical JSON), `from_json` reads one back: every key a reader relies on is typed here, the facts
    an arm or the image recorded stay JSON (`ReceiptArm.facts`, `image`, `inputs`)."""

    receipt_version: int
    run_id: str
    ladder: Mapping[str, object]  # name, engine, sha256, thresholds, sampling
    image: Mapping[str, object]
    inputs: Mapping[str, object]
    preregistration: Mapping[str, object]
    valid: bool
    verdict: str
    verdict_reasons: tuple[str, ...]
    deviations: tuple[str, ...]
    noise_floor: Mapping[str, object]
    gates: tuple[Mapping[str, object], ...]
    arms: tuple[ReceiptArm, ...]
    timing: Mapping[str, object]
    started_at: str
    finished_at: str
    placement: Placement | None = None
    sha256: str | None = None  # set once sealed

    @property
    def name(self) -> str:
        return jv.text(self.ladder.get("name"), "ladder.name")

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "receipt_version": self.receipt_version,
            "run_id": self.run_id,
            "ladder": dict(self.ladder),
            "image": dict(self.image),
            "inputs": dict(self.inputs),
            "preregistration": dict(self.preregistration),
            "valid": self.valid,
            "verdict": self.verdict,
            "verdict_reasons": list(self.verdict_reasons),
            "deviations": list(self.deviations),
            "noise_floor": dict(self.noise_floor),
            "gates": [dict(g) for g in self.gates],
            "arms": [a.to_json() for a in self.arms],
            "timing": dict(self.timing),
            "started_at": self.started_at,
            "finished_at": self.finished_at,
        }
        if self.placement is not None:
            out["placement"] = self.placement.to_json()
        if self.sha256 is not None:
            out["sha256"] = self.sha256
        return out

    @classmethod
    def from_json(cls, doc: Mapping[str, object]) -> Receipt:
        placement = doc.get("placement")
        return cls(
            jv.integer(doc.get("receipt_version"), "receipt_version"),
            jv.text(doc.get("run_id"), "run_id"),
            jv.obj(doc.get("ladder"), "ladder"),
            jv.obj(doc.get("image"), "image"),
            jv.obj(doc.get("inputs"), "inputs"),
            jv.obj(doc.get("preregistration"), "preregistration"),
            jv.flag(doc.get("valid"), "valid"),
            jv.text(doc.get("verdict"), "verdict"),
            tuple(jv.texts(doc.get("verdict_reasons"), "verdict_reasons")),
            tuple(jv.texts(doc.get("deviations"), "deviations")),
            jv.obj(doc.get("noise_floor"), "noise_floor"),
            tuple(jv.objs(doc.get("gates"), "gates")),
            tuple(ReceiptArm.from_json(a) for a in jv.objs(doc.get("arms"), "arms")),
            jv.obj(doc.get("timing"), "timing"),
            jv.text(doc.get("started_at"), "started_at"),
            jv.text(doc.get("finished_at"), "finished_at"),
            None if placement is None else Placement.from_json(jv.obj(placement, "placement")),
            jv.optional_text(doc.get("sha256"), "sha256"),
        )

    def sealed(self) -> Receipt:
        """This receipt with its seal: sha256 of the canonical JSON of everything else."""
        return dataclasses.replace(self, sha256=seal_of(self.to_json()))


def seal_of(doc: Mapping[str, object]) -> str:
    """The seal of a receipt document: sha256 of the canonical JSON of everything but its `sha256`."""
    return sha256_hex(canonical.dumps({k: v for k, v in doc.items() if k != "sha256"}))


def seal(doc: Mapping[str, object]) -> dict[str, object]:
    return {**{k: v for k, v in doc.items() if k != "sha256"}, "sha256": seal_of(doc)}


def check_seal(doc: Mapping[str, object]) -> bool:
    claimed = doc.get("sha256")
    return isinstance(claimed, str) and claimed == seal_of(doc)


def load(path: Path) -> dict[str, object]:
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise ReceiptError(f"cannot read receipt {path}: {exc}") from None
    if not isinstance(doc, dict) or not check_seal(doc):
        raise ReceiptError(f"{path}: the receipt's sha256 does not match its content (edited or truncated)")
    return doc


def read(path: Path) -> Receipt:
    """The sealed receipt at `path` as typed values (`load` checks the seal)."""
    doc = load(path)
    try:
        return Receipt.from_json(doc)
    except jv.JsonShapeError as exc:
        raise ReceiptError(f"{path}: not a receipt of this servimg version: {exc.message}") from None


def verdict(doc: Receipt) -> LadderVerdict:
    """A receipt's verdict as findings (one per arm), for the table `servimg ladder` prints."""
    arms = [arm_finding(a.id, a.role, Status(a.verdict), a.reasons) for a in doc.arms]
    return ladder_verdict(doc.name, arms, valid=doc.valid, deviations=doc.deviations)


def write(out: Path, doc: Receipt) -> Path:
    """Write `receipt.json` (canonical, sealed) and `receipt.svg` atomically into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    sealed = doc.sealed()
    path = out / "receipt.json"
    _atomic(path, canonical.dumps_pretty(sealed.to_json()))
    _atomic(out / "receipt.svg", plot_svg(sealed).encode())
    return path


def _atomic(path: Path, data: bytes) -> None:
    atomic_write(path, data, 0o644)  # a receipt is for reading


# ------------------------------------------------------------------------------------------- plot

_W, _ROW, _LEFT, _PLOT = 760, 26, 120, 280
_COLORS = {"PASS": "#2e7d32", "FAIL": "#c62828", "NOT_EXERCISED": "#ef6c00"}


def _el(tag: str, text: str | None = None, **attrs: object) -> str:
    """One SVG element; attribute names use `_` for `-` (stroke_dasharray → stroke-dasharray)."""
    parts = " ".join(
        f'{k.rstrip("_").replace("_", "-")}="{escape(f"{v:.1f}" if isinstance(v, float) else str(v))}"'
        for k, v in attrs.items()
    )
    return f"<{tag} {parts}/>" if text is None else f"<{tag} {parts}>{escape(text)}</{tag}>"


def plot_svg(sealed: Receipt) -> str:
    """Two panels: counts per arm (corrupted, forward flips) vs limits; logprob deltas vs the limit."""
    receipt = sealed.to_json()
    arms = jv.objs(receipt.get("arms") or [], "arms")
    thresholds = jv.obj(jv.member(receipt, "ladder", "thresholds") or {}, "ladder.thresholds")
    noise = jv.obj(receipt.get("noise_floor") or {}, "noise_floor")
    panel_h = max(len(arms), 1) * _ROW
    top, x0 = 48, _LEFT + 40
    height = top + 2 * panel_h + 120
    name = jv.member(receipt, "ladder", "name")
    config = str(jv.member(receipt, "image", "config_digest") or "")
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{height}" '
        f'viewBox="0 0 {_W} {height}" font-family="sans-serif" font-size="12">',
        _el("rect", width=_W, height=height, fill="white"),
        _el(
            "text", f"ladder {name} — {receipt.get('verdict')}", x=10, y=20, font_size=15, font_weight="bold"
        ),
        _el("text", f"receipt seal {str(receipt.get('sha256', ''))[:16]}…  image {config[:19]}…", x=10, y=38),
    ]
    requests = max((len(jv.seq(a.get("requests") or [])) for a in arms), default=1) or 1
    max_corrupted = thresholds.get("max_corrupted")
    out.append(
        _el("text", "requests corrupted (bar) / forward flips (◆)", x=10, y=top + 4, font_weight="bold")
    )
    y0 = top + 14
    scale = _PLOT / requests
    for i, arm in enumerate(arms):
        y = y0 + i * _ROW
        color = _COLORS.get(str(arm.get("verdict")), "#555")
        corrupted = jv.integer(arm.get("corrupted") or 0, "arms[].corrupted")
        total = len(jv.seq(arm.get("requests") or []))
        out.append(_el("text", f"{arm.get('id')} ({arm.get('role')})", x=10, y=y + 14))
        bar = float(corrupted * scale)
        out.append(_el("rect", x=x0, y=y + 3, width=bar, height=14, fill=color, opacity=0.7))
        out.append(_el("text", f"{corrupted}/{total}", x=x0 + 5 + bar, y=y + 14))
        comparison = arm.get("comparison")
        if comparison:
            x = x0 + jv.integer(jv.obj(comparison).get("forward_flips") or 0) * scale
            out.append(_el("path", d=f"M{x:.1f} {y + 4} l5 6 l-5 6 l-5 -6 z", fill="black"))
        out.append(_el("text", str(arm.get("verdict", "")), x=x0 + 20 + _PLOT, y=y + 14, fill=color))
    if max_corrupted is not None:
        x = x0 + jv.number(max_corrupted, "max_corrupted") * scale
        out.append(_el("line", x1=x, y1=y0, x2=x, y2=y0 + panel_h, stroke="#c62828", stroke_dasharray="4 3"))
    top2 = y0 + panel_h + 30
    limit = thresholds.get("max_logprob_delta_over_noise")
    noise_lp = jv.number(noise.get("max_logprob_delta") or 0.0)
    out.append(
        _el(
            "text", "per-request max |Δ logprob| vs control (log scale)", x=10, y=top2 + 4, font_weight="bold"
        )
    )
    y1 = top2 + 14

    def xpos(v: float) -> float:
        v = min(max(v, 1e-6), 10.0)
        return x0 + (math.log10(v) + 6) / 7 * _PLOT

    for i, arm in enumerate(arms):
        y = y1 + i * _ROW
        out.append(_el("text", str(arm.get("id")), x=10, y=y + 14))
        out.append(_el("line", x1=x0, y1=y + 10, x2=x0 + _PLOT, y2=y + 10, stroke="#ddd"))
        for row in jv.objs(jv.member(arm, "comparison", "requests") or []):
            v = jv.number(row.get("max_logprob_delta") or 0.0)
            fill = "#c62828" if row.get("divergent") else "#1565c0"
            out.append(_el("circle", cx=xpos(v), cy=y + 10, r=3.5, fill=fill, opacity=0.7))
    if limit is not None:
        x = xpos(noise_lp + jv.number(limit, "max_logprob_delta_over_noise"))
        out.append(_el("line", x1=x, y1=y1, x2=x, y2=y1 + panel_h, stroke="#c62828", stroke_dasharray="4 3"))
    for exp in range(-6, 2):
        out.append(_el("text", f"1e{exp}", x=xpos(10.0**exp), y=y1 + panel_h + 14, text_anchor="middle"))
    legend = "dashed: pre-registered limit; red: tokens diverged from control (Δ over the common prefix)"
    out.append(_el("text", legend, x=10, y=height - 12, fill="#555"))
    out.append("</svg>")
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------- comparing

# What differs between two runs of the same ladder on the same image by construction: where and when they
# ran (placement, timing, ids, ports, a server's exit status after `docker stop`, host paths of caches,
# witness copies and of the ladder/probe files, whose sha256 stay compared; the name the image was given
# (engine ID or registry ref), whose digests stay compared; process ids), and the seals over all of it.
# Everything else (verdict, outputs, metric deltas, gates, input hashes) must be equal whether the arms
# ran locally or as Slurm jobs.
# "preregistration" is its time and a digest that binds the inputs' host paths (see `comparable`).
RUN_FIELDS = ("run_id", "started_at", "finished_at", "timing", "placement", "sha256", "preregistration")
ARM_RUN_FIELDS = ("timing", "logs")
SERVER_RUN_FIELDS = ("container", "port", "healthy_after_s", "logs_sha256", "exit_code")
CACHE_RUN_FIELDS = ("host", "bytes_at_start")


def comparable(doc: Mapping[str, object]) -> dict[str, object]:
    """The receipt without its run-specific fields (`RUN_FIELDS` …): equal for equal outputs.

    Where each run put its files is run-specific too: the ladder and probe files' host paths (a bundled
    ladder is extracted into each run's own directory; their sha256 stay), and so the pre-registration
    digest, which binds those paths (the inputs it covers are compared one by one instead); and the name
    the image was given (its manifest and config digests stay)."""
    out = {k: v for k, v in doc.items() if k not in RUN_FIELDS}
    image, inputs = doc.get("image"), doc.get("inputs")
    if isinstance(image, Mapping):  # the name it was given (an engine tag, REPO@digest) aside
        out["image"] = {k: v for k, v in image.items() if k != "ref"}
    if isinstance(inputs, Mapping):
        out["inputs"] = {
            name: ({k: v for k, v in value.items() if k != "path"} if isinstance(value, Mapping) else value)
            for name, value in inputs.items()
        }
    out["arms"] = [_comparable_arm(a) for a in jv.objs(doc.get("arms") or [], "arms")]
    return out


def _comparable_arm(arm: Mapping[str, object]) -> dict[str, object]:
    out = {k: v for k, v in arm.items() if k not in ARM_RUN_FIELDS}
    server = {k: v for k, v in jv.obj(arm.get("server") or {}).items() if k not in SERVER_RUN_FIELDS}
    if "mounts" in server:  # keyed by host path (caches live under each run's own directory)
        server["mounts"] = sorted(jv.obj(server["mounts"]).values(), key=str)
    out["server"] = server
    # A retained cache's file count is the run's evidence; its exact size is not an output: a compile
    # cache written by two identical cold arms differs by a few bytes (seen: torch.compile's, 9 bytes of
    # 1.9 MB, local against Slurm), so only whether it held anything is compared.
    out["caches"] = {
        n: {
            **{k: v for k, v in c.items() if k not in CACHE_RUN_FIELDS},
            "empty_at_start": not c.get("bytes_at_start"),
        }
        for n, c in ((n, jv.obj(c)) for n, c in jv.obj(arm.get("caches") or {}).items())
    }
    out["requests"] = [
        {k: v for k, v in r.items() if k != "seconds"} for r in jv.objs(arm.get("requests") or [])
    ]
    if arm.get("witness") is not None:
        witness = {k: v for k, v in jv.obj(arm["witness"]).items() if k not in ("container", "files")}
        witness["records"] = [
            {k: v for k, v in r.items() if k != "pid"} for r in jv.objs(witness.get("records") or [])
        ]
        out["witness"] = witness
    return out


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two JSON values differ, as dotted paths with both values (for `comparable` receipts)."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return [d for k in sorted(set(a) | set(b)) for d in differences(a.get(k), b.get(k), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [
            d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{path}[{i}]")
        ]
    return [] if a == b else [f"{path or '.'}: {json.dumps(a)[:160]} != {json.dumps(b)[:160]}"]


# ------------------------------------------------------------------------------------------ assembly


@dataclass
class ArmRecord:
    """One arm as the harness saw it: its outcome (judged later) and the facts for the receipt."""

    spec: ArmSpec
    outcome: ArmOutcome
    facts: dict[str, object]


def build_receipt(
    loaded: LoadedLadder,
    image: Mapping[str, object],
    inputs: Inputs,
    prereg: Mapping[str, object],
    records: Sequence[ArmRecord],
    verdict: Verdict,
    started_at: str,
    run_id: str,
) -> Receipt:
    """The receipt (before sealing): the ladder, image, pre-registered inputs, verdict, every arm."""
    ladder = loaded.definition
    by_arm = {a.arm: a for a in verdict.arms}
    arms = [_arm_json(record, by_arm[record.spec.id]) for record in records]
    timings = [jv.obj(a["timing"], "arm.timing") for a in arms if "timing" in a]
    wall = sum(jv.number(t["wall_s"], "timing.wall_s") for t in timings)
    harness = sum(jv.number(t["harness_s"], "timing.harness_s") for t in timings)
    return Receipt(
        RECEIPT_VERSION,
        run_id,
        {
            "name": ladder.name,
            "engine": ladder.engine,
            "sha256": inputs.ladder_sha256,
            "thresholds": canonical.plain(ladder.thresholds),
            "sampling": canonical.plain(ladder.sampling),
        },
        dict(image),
        inputs.as_json(),
        {"sha256": prereg["sha256"], "registered_at": prereg["registered_at"]},
        verdict.valid,
        verdict.result,
        tuple(verdict.reasons),
        tuple(verdict.deviations),
        {
            "measured": verdict.noise.measured,
            "divergent": verdict.noise.divergent,
            "max_logprob_delta": verdict.noise.max_logprob_delta,
        },
        tuple({"arm": a["id"], **g} for a in arms for g in jv.objs(a["gates"])),
        tuple(ReceiptArm.from_json(a) for a in arms),
        {
            "arms_wall_s": round(wall, 3),
            "harness_s": round(harness, 3),
            "harness_fraction": round(harness / wall, 4) if wall else None,
        },
        started_at,
        now(),
    )


def _arm_json(record: ArmRecord, v: ArmVerdict) -> dict[str, object]:
    """One arm of the receipt: its verdict and reasons, gates, comparison, requests and facts."""
    facts = dict(record.facts)
    request_facts = jv.obj(facts.pop("request_facts", {}), "request_facts")
    requests = record.outcome.requests
    return {
        "id": record.spec.id,
        "role": record.spec.role,
        "verdict": v.result,
        "reasons": list(v.reasons),
        "error": record.outcome.error,
        "spec": canonical.plain(record.spec),
        "corrupted": v.corrupted,
        "metrics_delta": dict(record.outcome.metrics_delta),
        "gates": [
            {"metric": g.metric, "op": g.op, "value": g.value, "observed": g.observed, "ok": g.ok}
            for g in v.gates
        ],
        "comparison": _comparison_json(v.comparison) if v.comparison is not None else None,
        "requests": [
            _request_json(r, jv.obj(request_facts.get(key, {})))
            for r, key in zip(requests, send_keys([r.prompt_id for r in requests]), strict=True)
        ],
        **facts,
    }


def _request_json(r: RequestOutcome, extra: Mapping[str, object]) -> dict[str, object]:
    return {
        "prompt_id": r.prompt_id,
        "family": r.family_id,
        "ok": r.judgement.ok,
        "reasons": list(r.judgement.reasons),
        "expected_ok": r.judgement.expected_ok,
        "error": r.error,
        "output": None
        if r.output is None
        else {
            "text": r.output.text,
            "token_ids": list(r.output.token_ids),
            "logprobs": [round(x, 6) for x in r.output.logprobs],
            "finish_reason": r.output.finish_reason,
        },
        "detectors": {d.name: d.value for d in r.judgement.detectors},
        **extra,
    }


def _comparison_json(c: Comparison) -> dict[str, object]:
    return {
        "baseline": c.baseline,
        "compared": c.compared,
        "divergent": c.divergent,
        "forward_flips": c.forward_flips,
        "reverse_flips": c.reverse_flips,
        "max_logprob_delta": c.max_logprob_delta,
        "requests": [
            {
                "prompt_id": r.prompt_id,
                "divergent": r.divergent,
                "first_divergence": r.first_divergence,
                "flip": r.flip,
                "max_logprob_delta": r.max_logprob_delta,
            }
            for r in c.requests
        ],
    }


# -- placement: where the arms ran ---------------------------------------------------------------------
@dataclass(frozen=True)
class PlacedJob:
    """One chain's job as the receipt's placement lists it: its arms, the scheduler's own fields for the
    job (Slurm: job_id, node, state, reason, exit_code; Kubernetes: job_name, node, kubernetes), what the
    harness in it said (state, start, finish) and why its arms cannot pass (None: it ran to the end)."""

    chain: int
    arms: tuple[str, ...]
    scheduler_fields: Mapping[str, object]
    job_status: str | None
    started_at: str | None
    finished_at: str | None
    error: str | None

    def to_json(self) -> dict[str, object]:
        return {
            "chain": self.chain,
            "arms": list(self.arms),
            **self.scheduler_fields,
            "job_status": self.job_status,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "error": self.error,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, object]) -> PlacedJob:
        own = ("chain", "arms", "job_status", "started_at", "finished_at", "error")
        return cls(
            jv.integer(doc.get("chain"), "placement.jobs[].chain"),
            tuple(jv.texts(doc.get("arms"), "placement.jobs[].arms")),
            {k: v for k, v in doc.items() if k not in own},
            jv.optional_text(doc.get("job_status"), "placement.jobs[].job_status"),
            jv.optional_text(doc.get("started_at"), "placement.jobs[].started_at"),
            jv.optional_text(doc.get("finished_at"), "placement.jobs[].finished_at"),
            jv.optional_text(doc.get("error"), "placement.jobs[].error"),
        )


@dataclass(frozen=True)
class Placement:
    """Where a run's arms ran, as its receipt records it: the scheduler (`local`, `slurm`, `k8s`), what
    names the run there (`host`; `array_job_id`; `namespace`), one row per chain's job, and per arm where
    it ran (its job and node)."""

    scheduler: str
    context: Mapping[str, object] = field(default_factory=dict)
    jobs: tuple[PlacedJob, ...] = ()
    arms: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"scheduler": self.scheduler, **self.context}
        if self.jobs or self.arms:
            out.update(jobs=[j.to_json() for j in self.jobs], arms={a: dict(w) for a, w in self.arms.items()})
        return out

    @classmethod
    def from_json(cls, doc: Mapping[str, object]) -> Placement:
        arms = jv.obj(doc.get("arms") or {}, "placement.arms")
        return cls(
            jv.text(doc.get("scheduler"), "placement.scheduler"),
            {k: v for k, v in doc.items() if k not in ("scheduler", "jobs", "arms")},
            tuple(PlacedJob.from_json(j) for j in jv.objs(doc.get("jobs") or [], "placement.jobs")),
            {a: {k: jv.text(v) for k, v in jv.obj(w).items()} for a, w in arms.items()},
        )

    @property
    def last_finish(self) -> str | None:
        """When the last of its jobs finished (what the jobs recorded), if any did."""
        ends = [j.finished_at for j in self.jobs if j.finished_at]
        return max(ends) if ends else None
