"""The main job, end to end, exactly as README says to run it: `bash scripts/demo.sh`.

One run (conftest's session-scoped `demo_job`, shared with the Slurm test; it runs first in the
session, so from an empty cache it builds the demo base itself) builds the demo base and image, verifies
it, runs its bundled CPU smoke ladder on real vLLM with the witness on (two arms through LMCache's
multi-process connector), pushes it signed with the receipt attached, pulls it back with docker and
checks the pulled tag with `--require-ladder cpu-smoke`.
The tests read what the job wrote. With SERVIMG_DEMO_LOG set, the job's output (with its step times) is
written there too: that is how README's first-run time is measured in CI.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from conftest import REPO
from servimg.definitions.lock import Lock
from test_output import python_reprs

pytestmark = [pytest.mark.demo, pytest.mark.vllm, pytest.mark.docker, pytest.mark.registry, pytest.mark.root]

SCHEDULER = "vllm.v1.core.sched.scheduler"
CONNECTOR = "lmcache.integration.vllm.lmcache_mp_connector"
ARMS = [
    "control",
    "noise",
    "cold",
    "warm",
    "restart",
    "lmcache-cold",
    "lmcache-warm",
    "lmcache-restart",
    "lmcache-interleaved",
]


@pytest.fixture(scope="module")
def job(demo_job: dict[str, Any]) -> dict[str, Any]:
    return demo_job


def test_the_job_ends_with_the_check_passing_and_every_claim_proven(job: dict[str, Any]) -> None:
    stdout = job["stdout"]
    check = json.loads((job["out"] / "check.json").read_text())
    assert check["status"] == "OK"
    claims = [line for line in stdout.splitlines() if line.startswith(("PROVEN", "NOT PROVEN"))]
    assert len(claims) == 12 and all(c.startswith("PROVEN: ") for c in claims), claims
    assert sum(" again: servimg " in line or "again: docker" in line for line in stdout.splitlines()) == 12
    fixes = json.loads((job["out"] / "fixes.json").read_text())
    (fix,) = fixes["fixes"]
    assert fix["fix"] == "vllm-project/vllm#54505" and fix["proven"], fix
    assert fix["overlay"] == "vllm-cpu-mamba2-prefix-caching" and len(fix["sentinels_proven"]) == 2, fix
    assert "cpu-hybrid" in fix["witnessed_by_ladders"], "the hybrid ladder's Mamba2 arms ran the fix"


def test_the_jobs_human_output_has_no_python_repr(job: dict[str, Any]) -> None:
    """Every command the job runs in human form (base, push, ladder, check) prints values as a person
    reads them: no dict or list reprs, no digest cut mid-token (issue 40)."""
    found = python_reprs(job["stdout"] + job["stderr"])
    assert not found, found[:20]


def test_the_ladder_passes_on_the_demo_image_with_every_arm_exercised(job: dict[str, Any]) -> None:
    doc = job["receipt"]
    build = json.loads((job["out"] / "build.json").read_text())
    assert doc["verdict"] == "PASS", doc["verdict_reasons"]
    assert doc["image"]["digest"] == build["digest"]
    assert [a["id"] for a in doc["arms"]] == ARMS
    assert doc["noise_floor"] == {"measured": True, "divergent": 0, "max_logprob_delta": 0.0}
    arms = {a["id"]: a for a in doc["arms"]}
    assert all(g["ok"] for a in doc["arms"] for g in a["gates"])
    assert all(r["ok"] for a in doc["arms"] for r in a["requests"])
    assert arms["control"]["metrics_delta"]["prefix_cache_hits"] == 0
    assert arms["warm"]["server"]["owner_arm"] == "cold"
    assert arms["restart"]["caches"]["vllm"]["mode"] == "retain-from:cold"
    assert doc["inputs"]["ladder"]["sha256"] == doc["ladder"]["sha256"]


def test_lmcache_serves_the_warm_arm_through_the_patched_connector(job: dict[str, Any]) -> None:
    """After /reset_prefix_cache, vLLM's own cache is empty: every reused prefix came back from LMCache."""
    arms = {a["id"]: a for a in job["receipt"]["arms"]}
    warm = arms["lmcache-warm"]
    assert warm["server"]["owner_arm"] == "lmcache-cold"
    assert warm["metrics_delta"]["external_prefix_cache_hits"] > 0
    assert arms["warm"]["metrics_delta"].get("external_prefix_cache_hits", 0) == 0
    for arm in ("lmcache-cold", "lmcache-warm"):
        modules = {r["module"] for r in arms[arm]["witness"]["records"] if r["patched_code_ran"]}
        assert {SCHEDULER, CONNECTOR} <= modules, (arm, modules)


def test_lmcache_serves_a_restart_from_disk_and_a_partial_hit_between_store_and_reuse(
    job: dict[str, Any],
) -> None:
    """A new vLLM + LMCache server over the retained L2 directory gets prefixes back from disk (vLLM's own
    cache is new); with vLLM's prefix cache off, a short prompt hits part of a stored prefix and the long
    one then all of it, from LMCache only. Every answer equals the control's (the ladder PASSed)."""
    arms = {a["id"]: a for a in job["receipt"]["arms"]}
    restart = arms["lmcache-restart"]
    assert restart["caches"]["lmcache_l2"]["mode"] == "retain-from:lmcache-cold"
    assert restart["metrics_delta"]["external_prefix_cache_hits"] > 0
    interleaved = arms["lmcache-interleaved"]
    assert interleaved["metrics_delta"]["prefix_cache_hits"] == 0
    sent = [r["prompt_id"] for r in interleaved["requests"]]
    assert sent[:3] == ["f0-p2", "f0-p0", "f0-p2"]
    hits = [r.get("metrics_delta", {}).get("external_prefix_cache_hits", 0) for r in interleaved["requests"]]
    assert hits[1] > 0 and hits[2] > hits[1], hits  # part of the stored prefix, then all of it


def test_every_demo_overlay_ran_in_a_serving_process(job: dict[str, Any]) -> None:
    """The witness (the image is built with `witness: true`) of each arm's serving processes shows the
    patched scheduler ran everywhere and the patched LMCache connector wherever the connector is on."""
    lock = Lock.load(REPO / "images" / "demo.lock.json")
    assert [o.id for o in lock.overlays] == [
        "vllm-cpu-mamba2-prefix-caching",
        "vllm-computed-tokens-gate",
        "lmcache-aligned-lookup-gate",
    ]
    for arm in job["receipt"]["arms"]:
        witness = arm["witness"]
        assert witness["records"] and not witness["problems"], arm["id"]
        modules = {r["module"] for r in witness["records"]}
        assert SCHEDULER in modules, arm["id"]
        assert (CONNECTOR in modules) == arm["id"].startswith("lmcache-"), (arm["id"], modules)


HYBRID_ARMS = [f"{m}-{a}" for m in ("gdn", "mamba2") for a in ("control", "noise", "cold", "warm", "restart")]
FIX_MODULES = {
    "vllm.model_executor.layers.mamba.ops.cpu.mamba_ssm": "_servimg_chunk_states_cpu",
    "vllm.model_executor.layers.mamba.ops.ssd_checkpoint": "_servimg_store_prefill_checkpoint_cpu",
}


def test_the_hybrid_ladder_passes_bit_exactly_with_the_fix_in_the_serving_processes(
    job: dict[str, Any],
) -> None:
    """Both hybrid families, every cached arm hit the prefix cache and answered exactly as its family's
    control; the Mamba2 arms' serving processes ran the fix (both sentinels in the executed code)."""
    doc = json.loads((job["out"] / "hybrid-ladder" / "receipt.json").read_text())
    build = json.loads((job["out"] / "build.json").read_text())
    assert doc["verdict"] == "PASS", doc["verdict_reasons"]
    assert doc["image"]["digest"] == build["digest"]
    assert [a["id"] for a in doc["arms"]] == HYBRID_ARMS
    assert doc["noise_floor"] == {"measured": True, "divergent": 0, "max_logprob_delta": 0.0}
    for arm in doc["arms"]:
        if arm["role"] in ("cold", "warm", "restart"):
            assert arm["metrics_delta"]["prefix_cache_hits"] > 0, arm["id"]
            assert arm["comparison"]["divergent"] == 0 and arm["comparison"]["max_logprob_delta"] == 0
        if arm["id"].startswith("mamba2-") and arm["role"] != "control" and arm["role"] != "noise_floor":
            ran = {
                r["module"]: set(r["sentinels_ran"])
                for r in arm["witness"]["records"]
                if r["patched_code_ran"]
            }
            for module, sentinel in FIX_MODULES.items():
                assert sentinel in ran.get(module, set()), (arm["id"], ran)
    check = json.loads((job["out"] / "check.json").read_text())
    assert check["status"] == "OK"
