"""The ladder receipt: canonical JSON with its own content sha256, and a small SVG plot beside it.

`seal` adds `sha256` = sha256 of the canonical JSON of everything else, so any edit is detectable
(`check_seal`). The shape is what `servimg attest --predicate-type test-result --file receipt.json`
(`provenance.LadderReceipt`) reads: `ladder.name`, `verdict`, `image.{digest,config_digest}`,
`arms[].{id,verdict}`, `finished_at`. The plot is hand-written SVG (no plotting dependency): per arm,
corrupted requests and forward flips against the pre-registered limits, and each request's logprob delta
against the noise-floor limit. Deterministic for a given receipt.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

from servimg.core import canonical
from servimg.core import jsonview as jv
from servimg.core.atomic import atomic_write
from servimg.core.digest import sha256_hex
from servimg.core.errors import ServimgError
from servimg.core.findings import Status
from servimg.ladder.definition import ArmSpec, LoadedLadder
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
from servimg.ladder.prereg import Inputs, now


class ReceiptError(ServimgError):
    """A ladder receipt is unreadable, malformed, or does not match its seal."""


RECEIPT_VERSION = 1


def seal(doc: Mapping[str, object]) -> dict[str, object]:
    body = {k: v for k, v in doc.items() if k != "sha256"}
    return {**body, "sha256": sha256_hex(canonical.dumps(body))}


def check_seal(doc: Mapping[str, object]) -> bool:
    claimed = doc.get("sha256")
    body = {k: v for k, v in doc.items() if k != "sha256"}
    return isinstance(claimed, str) and claimed == sha256_hex(canonical.dumps(body))


def load(path: Path) -> dict[str, object]:
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise ReceiptError(f"cannot read receipt {path}: {exc}") from None
    if not isinstance(doc, dict) or not check_seal(doc):
        raise ReceiptError(f"{path}: the receipt's sha256 does not match its content (edited or truncated)")
    return doc


def verdict(doc: Mapping[str, object]) -> LadderVerdict:
    """A receipt's verdict as findings (one per arm), for the table `servimg ladder` prints."""
    arms = [
        arm_finding(
            str(a.get("id")),
            str(a.get("role")),
            Status(str(a.get("verdict"))),
            jv.texts(a.get("reasons") or []),
        )
        for a in jv.objs(doc.get("arms") or [], "arms")
    ]
    name = str(jv.member(doc, "ladder", "name"))
    return ladder_verdict(
        name,
        arms,
        valid=bool(doc.get("valid")),
        deviations=jv.texts(doc.get("deviations") or [], "deviations"),
    )


def write(out: Path, doc: Mapping[str, object]) -> Path:
    """Write `receipt.json` (canonical, sealed) and `receipt.svg` atomically into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    sealed = seal(doc)
    path = out / "receipt.json"
    _atomic(path, canonical.dumps_pretty(sealed))
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


def plot_svg(receipt: Mapping[str, object]) -> str:
    """Two panels: counts per arm (corrupted, forward flips) vs limits; logprob deltas vs the limit."""
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
        _el(
            "text", f"receipt sha256 {str(receipt.get('sha256', ''))[:16]}…  image {config[:19]}…", x=10, y=38
        ),
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
) -> dict[str, object]:
    """The receipt (before sealing): the ladder, image, pre-registered inputs, verdict, every arm."""
    ladder = loaded.definition
    by_arm = {a.arm: a for a in verdict.arms}
    arms = [_arm_json(record, by_arm[record.spec.id]) for record in records]
    timings = [jv.obj(a["timing"], "arm.timing") for a in arms if "timing" in a]
    wall = sum(jv.number(t["wall_s"], "timing.wall_s") for t in timings)
    harness = sum(jv.number(t["harness_s"], "timing.harness_s") for t in timings)
    return {
        "receipt_version": RECEIPT_VERSION,
        "run_id": run_id,
        "ladder": {
            "name": ladder.name,
            "engine": ladder.engine,
            "sha256": inputs.ladder_sha256,
            "thresholds": canonical.plain(ladder.thresholds),
            "sampling": canonical.plain(ladder.sampling),
        },
        "image": dict(image),
        "inputs": inputs.as_json(),
        "preregistration": {"sha256": prereg["sha256"], "registered_at": prereg["registered_at"]},
        "valid": verdict.valid,
        "verdict": verdict.result,
        "verdict_reasons": list(verdict.reasons),
        "deviations": list(verdict.deviations),
        "noise_floor": {
            "measured": verdict.noise.measured,
            "divergent": verdict.noise.divergent,
            "max_logprob_delta": verdict.noise.max_logprob_delta,
        },
        "gates": [{"arm": a["id"], **g} for a in arms for g in jv.objs(a["gates"])],
        "arms": arms,
        "timing": {
            "arms_wall_s": round(wall, 3),
            "harness_s": round(harness, 3),
            "harness_fraction": round(harness / wall, 4) if wall else None,
        },
        "started_at": started_at,
        "finished_at": now(),
    }


def _arm_json(record: ArmRecord, v: ArmVerdict) -> dict[str, object]:
    """One arm of the receipt: its verdict and reasons, gates, comparison, requests and facts."""
    facts = dict(record.facts)
    request_facts = jv.obj(facts.pop("request_facts", {}), "request_facts")
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
            _request_json(r, jv.obj(request_facts.get(r.prompt_id, {}))) for r in record.outcome.requests
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
