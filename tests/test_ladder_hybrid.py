"""Detection power of the hybrid ladder (verify/ladders/cpu-hybrid.yaml) on real vLLM for CPU.

The demo base serves servimg's tiny hybrids (generated in the image) with prefix caching in vLLM's align
mode, where a cache hit must restore the recurrent state at the 256-token block edge. TEST-ONLY overlays
plant defects, and the ladder's cached arms must FAIL on each while the control stays clean. Two plant the
seed's mechanism into vLLM's KV cache manager, seen on the GDN hybrid (Qwen3Next):

- `planted-attention-hit-stands`: the full-attention group's local hit stands as the model-wide computed
  prefix (vLLM's behaviour before vllm-project/vllm#48425). The probe family d0 sends 850 tokens cold (the
  attention caches three blocks, the recurrent layers a state at 768 only) and then 600 of them + 150
  others: attention holds 512 of it, the recurrent layers nothing, so the correct hit is 0.
- `planted-state-from-wrong-block`: a hit restores the recurrent state of the block before the hit's
  (the nested families' third prompt hits 512 and gets the state at 256).

and one is the demo's own Mamba2 fix with its prefill checkpoint writes skipped, seen on the Mamba2 hybrid
(NemotronH): the state a hit restores was never stored. With a random-weight model that defect once moved
the logprobs by only 2.2e-05 and no token: the ladder compares bit-exactly.

Each derived ladder has one family's control, cold and warm arms, eager (the compile cache is not what
these test; eager saves about a minute per server start): 2 server starts per planted image.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import HYBRID_LADDER, build_image
from servimg.cli import main

pytestmark = [pytest.mark.vllm, pytest.mark.docker, pytest.mark.root]

HITS = [{"metric": "prefix_cache_hits", "op": ">", "value": 0}]


def family_ladder(repo: Path, name: str, family: str) -> Path:
    """The hybrid ladder with one model family's control, cold and warm arms only (same probes and
    thresholds)."""
    doc = yaml.safe_load((repo / HYBRID_LADDER).read_text())
    doc["name"] = name
    doc["server"]["args"] = [*doc["server"]["args"], "--enforce-eager"]
    model = ["--model", f"/models/{family}"]
    # the family's pre-registered run variables (the Mamba2 arms' ISA cap), as the real ladder sets them
    env = next(a.get("env", {}) for a in doc["arms"] if a["id"] == f"{family}-control")
    doc["arms"] = [
        {"id": f"{family}-control", "model_family": family, "role": "control",
         "args": [*model, "--no-enable-prefix-caching"], "env": env},
        {"id": f"{family}-cold", "model_family": family, "role": "cold",
         "args": [*model, "--enable-prefix-caching"], "env": env, "exercise": HITS},
        {"id": f"{family}-warm", "model_family": family, "role": "warm", "server": f"reuse:{family}-cold",
         "exercise": HITS},
    ]  # fmt: skip
    path = repo / "verify" / "ladders" / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def run_ladder(image: Any, ladder: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    code = main(
        [
            "ladder",
            str(image.images[0].image.config_digest),
            "--ladder",
            str(ladder),
            "--out",
            str(out),
            "--json",
        ]
    )
    capsys.readouterr()
    doc: dict[str, Any] = json.loads((out / "receipt.json").read_text())
    assert (code == 0) == (doc["verdict"] == "PASS")
    return doc


# (overlay, model family, the cached arm and prompt where the defect shows). Measured 2026-12-04 (see
# docs/ladder.md, "Detection power"): the first two plants were predicted to show on the cold arm; the
# wrong-block plant did not (cold stayed bit-identical) and showed on the warm arm's diverging prompt,
# whose 640-token hit lies on a 128-token hash block inside the 256-token block. Either way the ladder FAILs.
PLANTS = [
    # the prompt only the planted hit can reach wrongly: d0-p1 (attention 512, recurrent state none)
    ("planted-attention-hit-stands", "gdn", "gdn-cold", "d0-p1"),
    ("planted-state-from-wrong-block", "gdn", "gdn-warm", "d0-p1"),
    # the first hit of all: the second nested prompt restores the state at 256, never written
    ("planted-checkpoint-writes-skipped", "mamba2", "mamba2-cold", "n0-p1"),
]


@pytest.mark.parametrize(("planted", "family", "shows_on", "diverging"), PLANTS)
def test_a_planted_hybrid_defect_fails_a_cached_arm_with_the_control_clean(
    planted: str,
    family: str,
    shows_on: str,
    diverging: str,
    cpu_ladder_repo: Path,
    store: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    image = build_image(cpu_ladder_repo, planted, store)
    ladder = family_ladder(cpu_ladder_repo, f"{planted}-check", family)
    doc = run_ladder(image, ladder, tmp_path / planted, capsys)
    assert doc["verdict"] == "FAIL", doc["verdict_reasons"]
    arms = {a["id"]: a for a in doc["arms"]}
    control = arms[f"{family}-control"]
    assert control["verdict"] == "PASS" and control["corrupted"] == 0
    arm = arms[shows_on]
    assert arm["verdict"] == "FAIL", arm["reasons"]
    assert all(g["ok"] for g in arm["gates"]), "the arm was exercised (prefix-cache hits)"
    rows = {r["prompt_id"]: r for r in arm["comparison"]["requests"]}
    assert rows[diverging]["divergent"] or rows[diverging]["max_logprob_delta"] > 0, rows[diverging]
    # the serving process ran the planted code: the witness saw it load the patched module
    modules = {r["module"] for r in arm["witness"]["records"] if r["patched_code_ran"]}
    assert modules, arm["witness"]
