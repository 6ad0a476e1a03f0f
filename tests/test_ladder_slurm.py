"""`servimg ladder --on slurm`: chains as jobs of a job array on a real single-node Slurm (scripts/slurm.sh),
the image pulled by digest from the real registry, per-arm records collected into the local run's receipt.

Fast part (no Slurm): the chain plan, parsing Slurm's answers, record round trips, failure mapping.
Slurm part: a toy completion server (tests/fixtures/ladder/toy_engine.py, NOT a model) in the test base
image, so the scheduling path runs in seconds. Real vLLM through Slurm: the demo image's whole CPU
smoke ladder, compared with the main job's local run of it (the session's `demo_job`).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import REPO, _require, docker_available
from fakebase import on_host
from servimg.backends.target import Target
from servimg.ladder import receipt
from servimg.ladder.evaluation import ArmOutcome, Output, RequestOutcome, judge
from servimg.ladder.loading import load
from servimg.ladder.plan import chains
from servimg.ladder.receipt import ArmRecord, Placement
from servimg.ladder.server import RunConfig
from servimg.placement import remote, slurm

TOY = REPO / "tests" / "fixtures" / "ladder"
CPU_LADDER = REPO / "verify" / "ladders" / "cpu-smoke.yaml"


# ------------------------------------------------------------------------------------------ pure


def test_chains_follow_server_reuse_and_retained_caches() -> None:
    plan = chains(load(CPU_LADDER).definition)
    assert [c.arms for c in plan] == [
        ("control",),
        ("noise",),
        ("cold", "warm", "restart"),
        ("lmcache-cold", "lmcache-warm", "lmcache-restart"),
        ("lmcache-interleaved",),
    ]
    assert [c.index for c in plan] == [0, 1, 2, 3, 4]
    toy = chains(load(TOY / "toy.yaml").definition)
    assert [c.arms for c in toy] == [("control",), ("noise",), ("cold", "warm")]


def test_scontrol_and_sacct_answers_are_parsed() -> None:
    text = (
        "JobId=7 ArrayJobId=5 ArrayTaskId=2 JobName=x JobState=TIMEOUT Reason=TimeLimit Dependency=(null) "
        "ExitCode=0:15 NodeList=gpu-3\n"
        "JobId=5 ArrayJobId=5 ArrayTaskId=0-1%1 JobState=PENDING Reason=JobArrayTaskLimit ExitCode=0:0 "
        "NodeList=(null)\n"
    )
    states = {t.task: t for t in slurm.parse_scontrol(text)}
    assert states[2] == slurm.TaskState(2, "5_2", "TIMEOUT", "TimeLimit", "0:15", "gpu-3")
    assert states[0].state == states[1].state == "PENDING" and states[1].job_id == "5_1"
    assert states[0].phase == "pending" and states[2].phase == "done" and not states[2].active
    sacct = "5_0|CANCELLED by 0|0:0|n1|None\n5_1|COMPLETED|0:0|n2|None\n5|FAILED|1:0|n1|x\n"
    assert [(t.task, t.state) for t in slurm.parse_sacct(sacct)] == [(0, "CANCELLED"), (1, "COMPLETED")]


def test_sbatch_argv_is_one_throttled_array_running_the_node_side_module(tmp_path: Path) -> None:
    argv = slurm.sbatch_argv(
        "n", tmp_path, 3, slurm.SlurmOptions("gpu", "gpu:1", 2, "1:00:00", ("--mem=8G",))
    )
    assert "--array=0-2%2" in argv and "--partition=gpu" in argv and "--gres=gpu:1" in argv
    assert "--time=1:00:00" in argv and "--mem=8G" in argv
    assert argv[-1].startswith("--wrap=exec ") and "-m servimg.placement.remote" in argv[-1]
    assert argv[-1].endswith('"$SLURM_ARRAY_TASK_ID"')
    with pytest.raises(slurm.SlurmError, match="at least 1"):
        slurm.SlurmOptions(nodes_max=0)


def _record(loaded: Any, arm: str, token_ids: tuple[int, ...]) -> ArmRecord:
    spec = loaded.definition.arm(arm)
    requests = []
    for family, prompt in loaded.probes.prompts:
        output = Output("ab", token_ids, (-0.25, float("nan")), "length", prompt.token_ids)
        judgement = judge(output, prompt.expect, loaded.definition.thresholds.detectors)
        requests.append(RequestOutcome(prompt.id, family.id, output, judgement))
    outcome = ArmOutcome(spec.id, spec.role, tuple(requests), {"prefix_cache_hits": 4.0}, None, ())
    return ArmRecord(spec, outcome, {"server": {"kind": "docker"}})


def test_a_record_round_trips_and_is_judged_again_by_the_reader() -> None:
    loaded = load(TOY / "toy.yaml")
    record = _record(loaded, "cold", (10, 11))
    doc = json.loads(json.dumps(remote.record_json(record)))
    back = remote.read_record(doc, loaded)
    got, sent = back.outcome.requests[0].output, record.outcome.requests[0].output
    assert got is not None and sent is not None
    assert (got.token_ids, got.text, got.prompt_token_ids) == (
        sent.token_ids,
        sent.text,
        sent.prompt_token_ids,
    )
    assert got.logprobs[0] == -0.25 and math.isnan(got.logprobs[1])  # exact, NaN kept
    assert [r.judgement for r in back.outcome.requests] == [r.judgement for r in record.outcome.requests]
    doc["requests"][0]["output"]["token_ids"] = [1, 2]  # a node cannot make a wrong answer pass
    assert not remote.read_record(doc, loaded).outcome.requests[0].judgement.ok


def test_arms_of_a_job_that_did_not_complete_fail_with_slurms_reason(tmp_path: Path) -> None:
    loaded = load(TOY / "toy.yaml")
    plan = chains(loaded.definition)
    for arm in ("control", "noise", "cold"):  # cold's record was written before the time limit hit
        path = remote.arm_path(tmp_path, arm)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(remote.record_json(_record(loaded, arm, (10, 11)))))
    for chain in plan[:2]:
        status = remote.status_path(tmp_path, chain)
        status.parent.mkdir(parents=True, exist_ok=True)
        status.write_text(json.dumps({"state": "done", "inputs_unchanged": True}))
    states = [
        slurm.TaskState(0, "9_0", "COMPLETED", "None", "0:0", "n1"),
        slurm.TaskState(1, "9_1", "COMPLETED", "None", "0:0", "n2"),
        slurm.TaskState(2, "9_2", "TIMEOUT", "TimeLimit", "0:15", "n1"),
    ]
    records, unchanged, placement = slurm.collect(loaded, tmp_path, plan, states, "9")
    by_id = {r.spec.id: r for r in records}
    assert [r.spec.id for r in records] == ["control", "noise", "cold", "warm"] and unchanged
    assert by_id["control"].outcome.error is None
    for arm in ("cold", "warm"):
        assert "slurm job 9_2 TIMEOUT, reason TimeLimit" in str(by_id[arm].outcome.error)
    assert placement.arms["warm"] == {"job_id": "9_2", "node": "n1"}
    assert placement.to_json()["array_job_id"] == "9" and [j.chain for j in placement.jobs] == [0, 1, 2]
    assert Placement.from_json(placement.to_json()) == placement  # the receipt's placement reads back
    from servimg.ladder.evaluation import evaluate

    verdict = evaluate(loaded.definition, [r.outcome for r in records])
    assert verdict.result == "FAIL" and {a.arm: a.result for a in verdict.arms}["warm"] == "FAIL"


def test_a_node_whose_inputs_differ_is_reported_by_key() -> None:
    registered = {"harness": {"a.py": "1", "b.py": "2"}, "vars": {"x": "1"}}
    here = {"harness": {"a.py": "1", "b.py": "3"}, "vars": {"x": "1"}}
    assert remote.input_differences(registered, here) == ["harness.b.py"]


def _run_receipt(out: str, ref: str, cache_bytes: int, files: int = 34) -> dict[str, Any]:
    """The parts of a receipt that two runs of one ladder write differently by construction."""
    return {
        "run_id": out,
        "image": {"ref": ref, "digest": "sha256:" + "a" * 64, "config_digest": "sha256:" + "b" * 64},
        "inputs": {"ladder": {"path": f"{out}/ladder/cpu.yaml", "sha256": "1" * 64}, "vars": {"x": "1"}},
        "preregistration": {"registered_at": out, "sha256": out * 8},
        "arms": [
            {
                "id": "restart",
                "caches": {
                    "vllm": {
                        "host": f"{out}/caches/cold-vllm",
                        "bytes_at_start": cache_bytes,
                        "files_at_start": files,
                        "mode": "retain-from:cold",
                    }
                },
            }
        ],
    }


def test_comparable_receipts_leave_out_where_each_run_put_things_and_nothing_else() -> None:
    """Seen on the demo image's ladder, local against Slurm: the bundled ladder extracted into each run's
    directory (its host path, and the pre-registration digest binding it), the image's name (an engine
    tag, REPO@digest) and a torch.compile cache 9 bytes apart are not outputs; a changed input's sha256,
    digest, file count or an empty cache are."""
    local = _run_receipt("/tmp/a", "servimg/vllm:demo", 1935316)
    on_slurm = _run_receipt("/srv/b", "127.0.0.1:5000/servimg/vllm@sha256:" + "a" * 64, 1935325)
    assert receipt.differences(receipt.comparable(on_slurm), receipt.comparable(local)) == []
    for path, value in (
        (("inputs", "ladder", "sha256"), "2" * 64),
        (("image", "digest"), "sha256:" + "c" * 64),
        (("arms", 0, "caches", "vllm", "files_at_start"), 33),
        (("arms", 0, "caches", "vllm", "bytes_at_start"), 0),
    ):
        changed = _run_receipt("/srv/b", "x", 1935325)
        node: Any = changed
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        assert receipt.differences(receipt.comparable(changed), receipt.comparable(local)), path


# ------------------------------------------------------------------------------------------ real Slurm


def slurm_running() -> bool:
    if shutil.which("sbatch") is None:
        return False
    done = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, check=False)
    return done.returncode == 0 and any(s.startswith(("idle", "mix", "alloc")) for s in done.stdout.split())


PRIVATE_CONF = Path(os.environ.get("SERVIMG_SLURM_DIR", "/var/lib/servimg/slurm")) / "slurm.conf"


@pytest.fixture(scope="session")
def slurm_cluster() -> None:
    """The private cluster scripts/slurm.sh runs (its own SLURM_CONF, munge and ports), unless SLURM_CONF
    already names a cluster to use. servimg's `--on slurm` reaches it through the same variable."""
    os.environ.setdefault("SLURM_CONF", str(PRIVATE_CONF))
    if not slurm_running() and os.geteuid() == 0 and shutil.which("sbatch"):
        subprocess.run(["bash", str(REPO / "scripts" / "slurm.sh"), "start"], check=False)
    _require(slurm_running(), "needs the single-node Slurm cluster (bash scripts/slurm.sh start)")


@pytest.fixture(scope="session")
def toy_image(store: Any, registry: Any, slurm_cluster: None) -> str:
    """The test base (python3, cached) pushed to the registry: HOST/REPO@sha256:… ."""
    _require(os.geteuid() == 0 and shutil.which("mmdebstrap") is not None, "needs root and mmdebstrap")
    _require(docker_available(), "needs a running Docker Engine")
    from servimg.backends import engine
    from servimg.backends import registry as reg
    from servimg.bases import catalog

    base = catalog.build_base(
        catalog.pinned_recipe("test-bookworm"), on_host(store), targets=[Target.engine()]
    )
    image = engine.read_engine(str(base["config_digest"]), store)
    pushed = reg.push(image, f"{registry.host}/issue16-ladder-toy:bookworm", on_host(store))
    return f"{registry.host}/issue16-ladder-toy@{pushed.rpartition('@')[2]}"


def _cli(*argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    from servimg.cli import main

    code = main(["ladder", *argv, "--json"])
    lines = capsys.readouterr().out.strip().splitlines()
    return code, json.loads(lines[-1]) if lines else {}


@pytest.mark.slurm
@pytest.mark.docker
@pytest.mark.registry
def test_chains_run_as_slurm_jobs_and_the_receipt_equals_the_local_one(
    toy_image: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    var = f"toy_dir={TOY}"
    ladder = str(TOY / "toy.yaml")
    code, result = _cli(
        toy_image,
        "--ladder",
        ladder,
        "--var",
        var,
        "--on",
        "slurm",
        "--out",
        str(tmp_path / "s"),
        capsys=capsys,
    )
    on_slurm = receipt.load(tmp_path / "s" / "receipt.json")
    assert code == 0 and on_slurm["verdict"] == "PASS", on_slurm["verdict_reasons"]
    code, _ = _cli(toy_image, "--ladder", ladder, "--var", var, "--out", str(tmp_path / "l"), capsys=capsys)
    local = receipt.load(tmp_path / "l" / "receipt.json")
    assert code == 0 and local["placement"]["scheduler"] == "local"
    assert not receipt.differences(receipt.comparable(on_slurm), receipt.comparable(local))
    placement = on_slurm["placement"]
    assert placement["scheduler"] == "slurm" and result["placement"] == placement
    jobs = placement["jobs"]
    assert [j["arms"] for j in jobs] == [["control"], ["noise"], ["cold", "warm"]]
    assert all(j["state"] == "COMPLETED" and j["node"] for j in jobs)
    assert len({j["job_id"] for j in jobs}) == 3
    assert placement["arms"]["warm"] == placement["arms"]["cold"]
    assert on_slurm["image"]["digest"] == toy_image.rpartition("@")[2]
    # every node re-checked the pre-registration before its first arm
    statuses = [json.loads((tmp_path / "s" / "jobs" / f"chain-{i}.json").read_text()) for i in range(3)]
    assert {s["inputs_sha256"] for s in statuses} == {on_slurm["preregistration"]["sha256"]}


@pytest.mark.slurm
@pytest.mark.docker
@pytest.mark.registry
def test_a_cancelled_job_fails_its_arms_with_slurms_reason(toy_image: str, tmp_path: Path) -> None:
    loaded = load(TOY / "toy.yaml")
    config = RunConfig(None, tmp_path / "out", {"toy_dir": str(TOY)})
    lines: list[str] = []
    cancelled: list[str] = []

    def log(line: str) -> None:  # cancel chain-2 (cold → warm) once it runs: Slurm records why it ended
        lines.append(line)
        if "chain-2 RUNNING" in line and not cancelled:
            array = line.split()[1].rstrip(":")
            subprocess.run(["scancel", f"{array}_2"], check=True)
            cancelled.append(array)

    doc = slurm.run(loaded, toy_image, config, slurm.SlurmOptions(nodes_max=1), log).to_json()
    arms = {a["id"]: a for a in doc["arms"]}
    assert doc["verdict"] == "FAIL" and [a["id"] for a in doc["arms"]] == ["control", "noise", "cold", "warm"]
    assert arms["control"]["verdict"] == arms["noise"]["verdict"] == "PASS"
    for arm in ("cold", "warm"):
        assert arms[arm]["verdict"] == "FAIL" and "CANCELLED" in arms[arm]["error"], arms[arm]["error"]
    assert any("pending 2" in line or "pending 1" in line for line in lines), lines  # throttled: 1 at once


@pytest.mark.slurm
@pytest.mark.docker
@pytest.mark.registry
def test_ctrl_c_cancels_the_submitted_jobs(toy_image: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    main = "import sys; from servimg.cli import main; sys.exit(main())"
    argv = [sys.executable, "-c", main, "ladder", toy_image, "--ladder", str(TOY / "toy.yaml")]
    argv += ["--var", f"toy_dir={TOY}", "--on", "slurm", "--nodes-max", "1", "--out", str(tmp_path / "o")]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    array = None
    for line in proc.stdout:
        if "submitted job array" in line:
            array = line.split("submitted job array ")[1].split(":")[0]
            break
    assert array is not None
    time.sleep(1)
    proc.send_signal(signal.SIGINT)
    rest = proc.communicate(timeout=60)[0]
    assert proc.returncode != 0 and "cancelled Slurm job array" in rest, rest
    deadline = time.monotonic() + 90  # a cancelled running task is COMPLETING for a moment
    states = slurm.SlurmCli().tasks(array, 3)
    while any(t.active for t in states) and time.monotonic() < deadline:
        time.sleep(1)
        states = slurm.SlurmCli().tasks(array, 3)
    assert all(not t.active for t in states) and any(t.state == "CANCELLED" for t in states), states
    assert not (tmp_path / "o" / "receipt.json").exists()


# ------------------------------------------------------------------------------------------ real vLLM


@pytest.mark.slurm
@pytest.mark.vllm
@pytest.mark.demo
@pytest.mark.docker
@pytest.mark.registry
@pytest.mark.root
def test_the_demo_images_cpu_ladder_through_slurm_agrees_with_the_main_jobs_local_run(
    demo_job: dict[str, Any], slurm_cluster: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The whole CPU smoke ladder bundled in the demo image (9 arms, 5 chains, two of them through
    LMCache), through Slurm with the image pulled by digest from the registry the main job pushed it to,
    against the main job's own local run of the same ladder (scripts/demo.sh, step 5): same verdict,
    same receipt apart from placement, timing and how the image was named."""
    out = demo_job["out"]
    digest = json.loads((out / "build.json").read_text())["digest"]
    repository = json.loads((out / "pull.json").read_text())["ref"].rpartition(":")[0]
    ref = f"{repository}@{digest}"
    started = time.monotonic()
    code, result = _cli(ref, "--on", "slurm", "--out", str(tmp_path / "slurm"), capsys=capsys)
    slurm_s = time.monotonic() - started
    on_slurm, local = receipt.load(tmp_path / "slurm" / "receipt.json"), demo_job["receipt"]
    local_s = local["timing"]["run_wall_s"]
    print(f"cpu-smoke (9 arms) on the demo image: local {local_s:.1f}s (main job), slurm {slurm_s:.1f}s")
    assert code == 0 and on_slurm["verdict"] == local["verdict"] == "PASS", on_slurm["verdict_reasons"]
    assert result["placement"] == on_slurm["placement"] and local["placement"]["scheduler"] == "local"
    # The nodes name the image by digest in the registry, the main job by its tag in the engine: both
    # know it is the built manifest (comparable receipts leave the name aside, never the digests).
    assert on_slurm["image"]["digest"] == local["image"]["digest"] == digest
    differing = receipt.differences(receipt.comparable(on_slurm), receipt.comparable(local))
    assert not differing, differing
    jobs = on_slurm["placement"]["jobs"]
    assert [j["arms"] for j in jobs] == [
        ["control"],
        ["noise"],
        ["cold", "warm", "restart"],
        ["lmcache-cold", "lmcache-warm", "lmcache-restart"],
        ["lmcache-interleaved"],
    ]
    assert all(j["state"] == "COMPLETED" for j in jobs), jobs
    spans = [(j["started_at"], j["finished_at"]) for j in jobs]
    assert any(s1 < e2 and s2 < e1 for i, (s1, e1) in enumerate(spans) for s2, e2 in spans[i + 1 :]), (
        f"no two chains ran at once: {spans}"
    )


# ------------------------------------------------------------------------------------------ witness per arm


def _witnessed(role: str, loaded: tuple[str, ...] | None, expected: tuple[str, ...]) -> Any:
    from servimg.ladder.evaluation import NoiseFloor, judge_arm

    definition = load(CPU_LADDER).definition
    arm = next(a for a in definition.arms if a.role == role)
    outcome = ArmOutcome(arm.id, role, (), {"prefix_cache_hits": 8.0}, None, (), loaded, expected)
    return judge_arm(definition, outcome, None, NoiseFloor(True, 0, 0.0))


def test_a_cached_arm_whose_processes_never_loaded_an_overlay_module_is_not_exercised() -> None:
    lm = "lmcache.v1.cache_engine"
    sched = "vllm.v1.core.sched.scheduler"
    verdict = _witnessed("warm", (sched,), (sched, lm))
    assert verdict.result == "NOT_EXERCISED"
    assert f"never loaded overlay module(s) {lm} (loaded: {sched})" in verdict.reasons[0]
    assert _witnessed("warm", (), (lm,)).reasons[0].endswith("(loaded: none)")
    assert _witnessed("warm", (sched, lm), (sched, lm)).result == "PASS"
    assert _witnessed("control", (), (lm,)).result == "PASS"  # only cached arms must reach the overlays
    assert _witnessed("warm", None, (lm,)).result == "PASS"  # no witness in the image: nothing to check


def test_an_arm_may_name_the_overlay_modules_its_configuration_reaches() -> None:
    from servimg.ladder.definition import LadderDefinition

    doc = yaml.safe_load(CPU_LADDER.read_text())
    doc["arms"][2]["witness_modules"] = ["lmcache.v1.cache_engine"]
    parsed = LadderDefinition.parse(yaml.safe_dump(doc))
    assert parsed.arms[2].witness_modules == ("lmcache.v1.cache_engine",)
    assert parsed.arms[0].witness_modules is None
    doc["arms"][2]["witness_modules"] = ["not a module"]
    with pytest.raises(Exception, match="witness_modules"):
        LadderDefinition.parse(yaml.safe_dump(doc))


def test_definitions_that_carry_a_ladder_ship_the_witness_by_default() -> None:
    from servimg.definitions.definition import ImageDefinition

    base = {
        "name": "x",
        "repository": "r/x",
        "base": {"ref": "oci:/b:t", "digest": "sha256:" + "0" * 64},
        "packages": {"vllm": {"distribution": "vllm", "version": "0.32.0"}},
    }
    assert ImageDefinition.from_mapping({**base, "ladder": "verify/ladders/cpu-smoke.yaml"}).witness
    assert not ImageDefinition.from_mapping(base).witness
    explicit = {**base, "ladder": "verify/ladders/cpu-smoke.yaml", "witness": False}
    assert not ImageDefinition.from_mapping(explicit).witness


def test_the_overlay_modules_are_read_from_the_witness_spec_stream() -> None:
    import io
    import tarfile

    from servimg.ladder.server import overlay_modules

    data = json.dumps({"modules": [{"module": "b.m"}, {"module": "a.m"}, {"module": "a.m"}]}).encode()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("witness-spec.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    assert overlay_modules(buffer.getvalue()) == ("a.m", "b.m")


class _FlakyScheduler:
    """A Scheduler whose first query fails (slurmctld busy): the wait retries instead of ending early."""

    def __init__(self) -> None:
        self.calls = 0

    def submit(self, argv: Any) -> str:
        return "1"

    def tasks(self, array_id: str, count: int) -> list[slurm.TaskState]:
        self.calls += 1
        if self.calls == 1:
            raise slurm.SlurmError("scontrol failed: Socket timed out")
        state = "RUNNING" if self.calls == 2 else "COMPLETED"
        return [slurm.TaskState(i, f"{array_id}_{i}", state) for i in range(count)]

    def cancel(self, array_id: str) -> None:
        pass


def test_the_wait_retries_a_failing_query_and_logs_each_change() -> None:
    lines: list[str] = []
    states = slurm.wait(_FlakyScheduler(), "1", 2, 0.01, lines.append)
    assert [t.state for t in states] == ["COMPLETED", "COMPLETED"]
    assert "retrying" in lines[0] and "running 2" in lines[1] and "done 2" in lines[2]
