"""`servimg ladder --on k8s --emit DIR` and `--collect RESULTS` (docs/ladder.md, "Kubernetes").

No cluster can start here. What is checked instead, offline:
- every emitted manifest is deserialized into `V1Job` by the official `kubernetes` client's ApiClient
  (required fields, types), and walked key by key against the client's models (`openapi_types` /
  `attribute_map`): an unknown or misspelt key anywhere fails; resource quantities parse
  (`kubernetes.utils.parse_quantity`); the image is pinned by digest. A broken manifest is caught.
- the container's command is parsed by the node entry's own parser (`remote.node_parser`).
- end to end without a cluster: the Jobs' exact commands and environment run here, in this process
  tree, against the toy engine (a stdlib HTTP server, no model) as the "container"; `--collect` then
  writes the receipt. This is the pod's code path (`remote --in-container`) minus the kubelet.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.utils import parse_quantity

from conftest import REPO
from servimg import cli
from servimg.ladder import receipt
from servimg.ladder.loading import LoadedLadder, load
from servimg.ladder.plan import chains
from servimg.ladder.receipt import Placement
from servimg.ladder.runner import image_facts
from servimg.ladder.server import RunConfig
from servimg.placement import k8s, remote

TOY = REPO / "tests" / "fixtures" / "ladder"
DIGEST = "sha256:" + "ab" * 32
CONFIG = "sha256:" + "cd" * 32
REPOSITORY = "registry.example:5000/team/toy"
_PINNED = re.compile(r"^[^@\s]+@sha256:[0-9a-f]{64}$")


# ------------------------------------------------------------------------------------------ validator


def manifest_problems(doc: Any) -> list[str]:
    """Everything wrong with a Job manifest, as the kubernetes client's models see it."""
    problems = walk(doc, "V1Job", "job")
    try:
        job = client.ApiClient().deserialize(json.dumps(doc), "V1Job", "application/json")
    except Exception as exc:  # the client's own validation: required fields, types
        return [*problems, f"V1Job does not deserialize: {exc}"]
    if not isinstance(job, client.V1Job):
        return [*problems, f"deserialized into {type(job).__name__}"]
    if (job.api_version, job.kind) != ("batch/v1", "Job"):
        problems.append(f"apiVersion/kind {job.api_version}/{job.kind}")
    for container in job.spec.template.spec.containers:
        if not _PINNED.match(container.image or ""):
            problems.append(f"container {container.name}: image {container.image} is not pinned by digest")
    return problems


def walk(value: Any, model: str, path: str) -> list[str]:
    """Every key a known field of its model (recursively); quantities parse."""
    cls = getattr(client, model, None)
    if cls is None:
        return [f"{path}: no model {model} in the client"]
    if not isinstance(value, dict):
        return [f"{path}: {model} must be a mapping, not {type(value).__name__}"]
    by_key = {key: attr for attr, key in cls.attribute_map.items()}
    problems = []
    for key, item in value.items():
        if key not in by_key:
            problems.append(f"{path}.{key}: not a field of {model}")
            continue
        kind = cls.openapi_types[by_key[key]]
        problems += check(item, kind, f"{path}.{key}")
        if (model, key) in (("V1ResourceRequirements", "limits"), ("V1ResourceRequirements", "requests")):
            problems += [_quantity(q, f"{path}.{key}.{name}") for name, q in item.items()]
        if (model, key) == ("V1EmptyDirVolumeSource", "sizeLimit"):
            problems.append(_quantity(item, f"{path}.{key}"))
    return [p for p in problems if p]


def check(value: Any, kind: str, path: str) -> list[str]:
    if kind.startswith("List["):
        if not isinstance(value, list):
            return [f"{path}: must be a list"]
        return [p for i, v in enumerate(value) for p in check(v, kind[5:-1], f"{path}[{i}]")]
    if kind.startswith("Dict["):
        if not isinstance(value, dict):
            return [f"{path}: must be a mapping"]
        inner = kind[5:-1].split(", ", 1)[1]
        return [p for k, v in value.items() for p in check(v, inner, f"{path}.{k}")]
    scalars = {"str": str, "int": int, "bool": bool, "float": (int, float)}
    if kind in scalars:
        ok = isinstance(value, scalars[kind]) and not (kind == "int" and isinstance(value, bool))
        return [] if ok else [f"{path}: must be {kind}, not {type(value).__name__}"]
    if kind in ("object", "datetime"):
        return []
    return walk(value, kind, path)


def _quantity(text: Any, path: str) -> str:
    try:
        parse_quantity(text)
    except (ValueError, TypeError) as exc:
        return f"{path}: {text!r} is not a quantity ({exc})"
    return ""


# ------------------------------------------------------------------------------------------ fixtures


def _toy_ladder(where: Path, port: int) -> Path:
    """The toy ladder with its mount target and port inside this test's own directory (the "image")."""
    doc = yaml.safe_load((TOY / "toy.yaml").read_text())
    doc["name"] = "toy-k8s"
    doc["server"]["command"] = [sys.executable, str(where / "image" / "toy" / "toy_engine.py")]
    doc["server"]["args"] = ["--port", str(port)]
    doc["server"]["port"] = port
    doc["server"]["mounts"] = [{"source": "${toy_dir}", "target": str(where / "image" / "toy")}]
    where.mkdir(parents=True, exist_ok=True)
    shutil.copy(TOY / "toy-probes.json", where / "toy-probes.json")
    path = where / "toy-k8s.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _resolver(ref: str, loaded: LoadedLadder) -> tuple[str, dict[str, Any]]:
    """The registry, as a seam: the image facts `slurm.resolve_image` would read."""
    return REPOSITORY, image_facts(ref, DIGEST, CONFIG, {}, loaded.definition)


def _emit(tmp: Path, dest: Path, port: int = 8000, **options: Any) -> tuple[dict[str, Any], Path]:
    loaded = load(_toy_ladder(tmp / "ladder", port))
    results = tmp / "results"
    toy = results / "toy"
    toy.mkdir(parents=True, exist_ok=True)
    shutil.copy(TOY / "toy_engine.py", toy / "toy_engine.py")
    config = RunConfig(None, results, {"toy_dir": str(toy)})
    opts = k8s.K8sOptions(**{"results_claim": "ladder-results", **options})
    return k8s.emit(loaded, f"{REPOSITORY}@{DIGEST}", config, opts, dest, lambda _: None, _resolver), results


def _jobs(dest: Path) -> list[dict[str, Any]]:
    return [yaml.safe_load(p.read_text()) for p in sorted(dest.glob("job-*.yaml"))]


# ------------------------------------------------------------------------------------------ tests


def test_every_emitted_manifest_is_a_valid_job_pinned_by_digest(tmp_path: Path) -> None:
    index, results = _emit(tmp_path, tmp_path / "k8s", gpus="2", namespace="qual", time_limit="1:30:00")
    jobs = _jobs(tmp_path / "k8s")
    loaded = load(Path(remote.read_plan(results).ladder_path))
    assert [j["metadata"]["annotations"]["servimg.io/arms"] for j in jobs] == [
        ",".join(c.arms) for c in chains(loaded.definition)
    ]  # one Job per chain: control | noise | cold,warm
    for job in jobs:
        assert manifest_problems(job) == []
        spec, pod = job["spec"], job["spec"]["template"]["spec"]
        container = pod["containers"][0]
        assert container["image"] == f"{REPOSITORY}@{DIGEST}"
        assert (spec["backoffLimit"], spec["activeDeadlineSeconds"], pod["restartPolicy"]) == (
            0,
            5400,
            "Never",
        )
        assert container["resources"] == {
            "requests": {"nvidia.com/gpu": "2"},
            "limits": {"nvidia.com/gpu": "2"},
        }
        assert job["metadata"]["namespace"] == "qual"
        labels = job["metadata"]["labels"]
        assert (
            labels["servimg.io/ladder"] == "toy-k8s" and labels["servimg.io/image-digest"] == "ab" * 31 + "a"
        )
        assert pod["volumes"][0] == {
            "name": "results",
            "persistentVolumeClaim": {"claimName": "ladder-results"},
        }
        assert container["volumeMounts"][0] == {"name": "results", "mountPath": str(results.resolve())}
        assert len(job["metadata"]["name"]) <= 63
    kustomization = yaml.safe_load((tmp_path / "k8s" / "kustomization.yaml").read_text())
    assert (
        kustomization["resources"]
        == [j["file"] for j in index["jobs"]]
        == sorted(p.name for p in (tmp_path / "k8s").glob("job-*.yaml"))
    )
    assert json.loads((results / k8s.INDEX).read_text()) == index  # what --collect reads


def test_the_jobs_command_is_the_node_entry_as_its_own_parser_reads_it(tmp_path: Path) -> None:
    _, results = _emit(tmp_path, tmp_path / "k8s")
    for chain, job in zip(remote.read_plan(results).chains, _jobs(tmp_path / "k8s"), strict=True):
        command = job["spec"]["template"]["spec"]["containers"][0]["command"]
        assert command[1:3] == ["-m", "servimg.placement.remote"]
        args = remote.node_parser().parse_args(command[3:])
        assert (args.results, args.chain, args.in_container) == (results.resolve(), chain.index, True)
        assert command[0] == sys.executable  # the ladder server's interpreter: the image's python


def test_the_validator_catches_a_broken_manifest(tmp_path: Path) -> None:
    _emit(tmp_path, tmp_path / "k8s")
    good = _jobs(tmp_path / "k8s")[0]
    typo = json.loads(json.dumps(good))
    typo["spec"]["backofLimit"] = typo["spec"].pop("backoffLimit")
    assert manifest_problems(typo) == ["job.spec.backofLimit: not a field of V1JobSpec"]
    tag = json.loads(json.dumps(good))
    tag["spec"]["template"]["spec"]["containers"][0]["image"] = f"{REPOSITORY}:latest"
    assert "is not pinned by digest" in " ".join(manifest_problems(tag))
    nameless = json.loads(json.dumps(good))
    del nameless["spec"]["template"]["spec"]["containers"][0]["name"]
    assert "does not deserialize" in " ".join(manifest_problems(nameless))
    quantity = json.loads(json.dumps(good))
    quantity["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1GG"}}
    assert "is not a quantity" in " ".join(manifest_problems(quantity))
    deep = json.loads(json.dumps(good))
    deep["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claim"] = "x"
    assert "not a field of V1PersistentVolumeClaimVolumeSource" in " ".join(manifest_problems(deep))


def test_emitting_twice_writes_identical_bytes(tmp_path: Path) -> None:
    _emit(tmp_path, tmp_path / "one", results_host_path="/srv/ladder", results_claim=None)
    _emit(tmp_path, tmp_path / "two", results_host_path="/srv/ladder", results_claim=None)
    one, two = sorted((tmp_path / "one").iterdir()), sorted((tmp_path / "two").iterdir())
    assert [p.name for p in one] == [p.name for p in two]
    assert [p.read_bytes() for p in one] == [p.read_bytes() for p in two]
    job = _jobs(tmp_path / "one")[0]
    assert job["spec"]["template"]["spec"]["volumes"][0]["hostPath"] == {
        "path": "/srv/ladder",
        "type": "Directory",
    }


def test_a_non_empty_directory_is_refused_unless_forced_and_nothing_is_half_written(tmp_path: Path) -> None:
    dest = tmp_path / "k8s"
    dest.mkdir()
    (dest / "mine.txt").write_text("keep")
    with pytest.raises(k8s.K8sError, match="not empty") as caught:
        _emit(tmp_path, dest)
    assert "--force" in caught.value.hint and (dest / "mine.txt").read_text() == "keep"
    _emit(tmp_path, dest, force=True)
    assert not (dest / "mine.txt").exists() and (dest / "kustomization.yaml").is_file()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp dir left
    loaded = load(_toy_ladder(tmp_path / "ladder", 8000))
    outside = RunConfig(None, tmp_path / "results", {"toy_dir": str(tmp_path / "elsewhere")})
    with pytest.raises(k8s.K8sError, match="not on the results volume"):  # the pods would not see it
        k8s.emit(
            loaded, "x", outside, k8s.K8sOptions(results_claim="pvc"), tmp_path / "new", print, _resolver
        )
    assert not (tmp_path / "new").exists()


def test_options_are_checked_all_at_once() -> None:
    with pytest.raises(k8s.K8sError) as caught:
        k8s.K8sOptions(namespace="Bad_NS", gpus="two", gpu_resource="gpu", time_limit="soon").check()
    assert len(caught.value.problems) == 5  # namespace, volume, gpus, resource, time limit
    assert k8s.time_limit_s("90") == 5400 and k8s.time_limit_s("1-00:00:30") == 86430
    assert k8s.time_limit_s("2:00:00") == 7200 and k8s.time_limit_s("10:30") == 630
    assert k8s.shm_quantity("64m") == "64Mi" and k8s.shm_quantity("1g") == "1Gi"


def test_a_tag_that_cannot_be_resolved_to_a_digest_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ladder = _toy_ladder(tmp_path / "ladder", 8000)
    port = _free_port()  # nothing listens there: the tag cannot be resolved
    code = cli.main(
        [
            "ladder",
            f"127.0.0.1:{port}/issue16b/toy:v1",
            "--ladder",
            str(ladder),
            "--on",
            "k8s",
            "--emit",
            str(tmp_path / "k8s"),
            "--out",
            str(tmp_path / "results"),
            "--results-claim",
            "pvc",
            "--var",
            f"toy_dir={tmp_path}",
            "--json",
        ]
    )
    out = capsys.readouterr().out
    assert code != 0 and "could not be resolved to a digest" in out and "@sha256" in out
    assert not (tmp_path / "k8s").exists()


def _run_job(job: dict[str, Any]) -> int:
    """What the kubelet would run, here: the container's command with its environment."""
    container = job["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    env["SERVIMG_NODE"] = "test-node"  # the downward API's spec.nodeName
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")}
    done = subprocess.run(container["command"], env={**keep, **env}, capture_output=True, timeout=300)
    return done.returncode


def test_the_jobs_commands_run_the_chains_and_collect_writes_the_receipt(tmp_path: Path) -> None:
    _, results = _emit(tmp_path, tmp_path / "k8s", port=_free_port())
    jobs = _jobs(tmp_path / "k8s")
    assert [_run_job(j) for j in jobs] == [0, 0, 0]
    status = json.loads(remote.status_path(results, remote.read_plan(results).chains[2]).read_text())
    assert status["inputs_unchanged"] is True and status["job_id"] == jobs[2]["metadata"]["name"]
    doc = k8s.collect(results, f"{REPOSITORY}@{DIGEST}", lambda _: None).to_json()
    assert doc["verdict"] == "PASS", doc["verdict_reasons"]
    assert doc == receipt.load(results / "receipt.json")
    placement = doc["placement"]
    assert placement["scheduler"] == "k8s"
    assert placement["arms"]["warm"] == {"job_name": jobs[2]["metadata"]["name"], "node": "test-node"}
    assert {a["server"]["kind"] for a in doc["arms"]} == {"command"}
    assert not any("mounts not applied" in d for d in doc["deviations"])  # mounts were linked
    # the Jobs ran servimg from the results volume: its harness hashes are what was pre-registered
    assert doc["inputs"]["harness"] == remote.read_plan(results).prereg["inputs"]["harness"]

    # the same ladder run here in one process, the same way (servers in "the image"): the same receipt
    from servimg.ladder import runner

    loaded = load(Path(remote.read_plan(results).ladder_path))
    plan = remote.read_plan(results)
    config = RunConfig(CONFIG, tmp_path / "local", plan.variables, command=True, link_mounts=True)
    prepared = runner.prepare(loaded, config, lambda _: None, image=dict(plan.image))
    records, unchanged = runner.run_arms(
        loaded, [a.id for a in loaded.definition.arms], config, prepared, "local", lambda _: None
    )
    local = runner.finish(
        loaded, config.out, prepared, records, unchanged, Placement("local"), 0.0, lambda _: None
    ).to_json()
    assert receipt.differences(receipt.comparable(doc), receipt.comparable(local)) == []

    # a chain whose pod never started, and one killed at its deadline, FAIL with the reason
    shutil.rmtree(results / "jobs")
    (results / "jobs").mkdir()
    chain = remote.read_plan(results).chains
    remote.status_path(results, chain[0]).write_text(json.dumps({"state": "done", "inputs_unchanged": True}))
    remote.status_path(results, chain[2]).write_text(json.dumps({"state": "running", "node": "n2"}))
    states = {
        "kind": "List",
        "items": [
            {
                "metadata": {"name": jobs[0]["metadata"]["name"]},
                "status": {"conditions": [_cond("Complete")]},
            },
            {
                "metadata": {"name": jobs[2]["metadata"]["name"]},
                "status": {"conditions": [_cond("Failed", "DeadlineExceeded", "Job was active longer")]},
            },
        ],
    }
    doc = k8s.collect(results, None, lambda _: None, states).to_json()
    verdicts = {a["id"]: (a["verdict"], a["error"]) for a in doc["arms"]}
    assert doc["verdict"] == "FAIL" and verdicts["control"] == ("PASS", None)
    assert "no status in the results volume" in str(verdicts["noise"][1]) and verdicts["noise"][0] == "FAIL"
    for arm in ("cold", "warm"):
        assert verdicts[arm][0] == "FAIL"
        assert "reason DeadlineExceeded" in str(verdicts[arm][1]) and "reported running" in str(
            verdicts[arm][1]
        )


def _cond(kind: str, reason: str = "", message: str = "") -> dict[str, str]:
    return {"type": kind, "status": "True", "reason": reason, "message": message}


def test_collect_refuses_another_images_results(tmp_path: Path) -> None:
    _, results = _emit(tmp_path, tmp_path / "k8s")
    with pytest.raises(k8s.K8sError, match="holds a run of"):
        k8s.collect(results, f"{REPOSITORY}@sha256:{'ef' * 32}", lambda _: None)


WRAPPER = """
import json, os, runpy, sys
where = os.environ.get("SERVIMG_WITNESS_DIR")
if where:  # what the image's witness hook would record: this process loaded the patched toy_mod
    record = {"module": "toy_mod", "patched_code_ran": True, "origin": "/image/toy_mod.py"}
    doc = {"pid": os.getpid(), "started_ns": 1, "records": [record], "errors": []}
    with open(os.path.join(where, f"{os.getpid()}.json"), "w") as fh:
        json.dump(doc, fh)
sys.argv = [sys.argv[1], *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("overlays", [("toy_mod",), ("toy_mod", "other_mod")])
def test_in_container_arms_collect_the_witness_of_their_processes(
    tmp_path: Path, overlays: tuple[str, ...]
) -> None:
    from servimg.ladder import runner

    port = _free_port()
    path = _toy_ladder(tmp_path / "ladder", port)
    doc = yaml.safe_load(path.read_text())
    (tmp_path / "wrapper.py").write_text(WRAPPER)
    engine = doc["server"]["command"][1]
    doc["server"]["command"] = [sys.executable, str(tmp_path / "wrapper.py"), engine]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    spec = tmp_path / "witness-spec.json"  # the image's /opt/servimg/witness-spec.json
    spec.write_text(json.dumps({"modules": [{"module": m} for m in overlays]}))
    toy = tmp_path / "toy"
    toy.mkdir()
    shutil.copy(TOY / "toy_engine.py", toy / "toy_engine.py")
    loaded = load(path)
    config = RunConfig(
        None, tmp_path / "out", {"toy_dir": str(toy)}, command=True, link_mounts=True, witness_spec=spec
    )
    prepared = runner.prepare(
        loaded, config, lambda _: None, image=image_facts("x", DIGEST, CONFIG, {}, loaded.definition)
    )
    records, unchanged = runner.run_arms(loaded, ["cold", "warm"], config, prepared, "t", lambda _: None)
    assert unchanged and [r.outcome.witness_loaded for r in records] == [("toy_mod",), ("toy_mod",)]
    assert [r.outcome.witness_expected for r in records] == [tuple(sorted(overlays))] * 2
    from servimg.ladder.evaluation import evaluate

    verdict = {a.arm: a for a in evaluate(loaded.definition, [r.outcome for r in records]).arms}
    if overlays == ("toy_mod",):
        assert verdict["warm"].result == "PASS"
    else:  # a cached arm whose processes never loaded other_mod
        assert verdict["warm"].result == "NOT_EXERCISED"
        assert "other_mod" in " ".join(verdict["warm"].reasons)


def test_on_k8s_without_emit_says_what_to_give(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ladder = _toy_ladder(tmp_path / "ladder", 8000)
    code = cli.main(["ladder", "r.example/x@" + DIGEST, "--ladder", str(ladder), "--on", "k8s", "--json"])
    out = capsys.readouterr().out
    assert code != 0 and "--emit DIR" in out and not (tmp_path / "results").exists()
    flags = ["--emit", str(tmp_path / "k8s"), "--out", str(tmp_path / "results"), "--gpus", "all", "--json"]
    code = cli.main(["ladder", "r.example/x@" + DIGEST, "--ladder", str(ladder), "--on", "k8s", *flags])
    out = capsys.readouterr().out
    assert code != 0 and "--gpus all" in out and "results volume" in out  # every problem at once
    assert not (tmp_path / "k8s").exists() and not (tmp_path / "results").exists()


def test_servers_in_the_pod_get_the_images_environment_not_the_harness() -> None:
    from servimg.ladder import server

    harness = str(Path(server.__file__).resolve().parents[2])
    job = {"PYTHONPATH": f"{harness}:/img/lib", "SERVIMG_NODE": "n1", "SERVIMG_JOB_ID": "j", "HOME": "/root"}
    assert server.image_env(job) == {"PYTHONPATH": "/img/lib", "HOME": "/root"}
    assert server.image_env({"PYTHONPATH": harness, "PYTHONDONTWRITEBYTECODE": "1"}) == {}


def _docker_run_job(job: dict[str, Any], image_id: str, results: Path) -> subprocess.CompletedProcess[str]:
    """The kubelet, simulated by the engine: the Job's container (command, env, the results volume at its
    mountPath) from the image under test. Not simulated: the pull by digest, scheduling, the device plugin."""
    container = job["spec"]["template"]["spec"]["containers"][0]
    env = [f"{e['name']}={e['value']}" for e in container["env"] if "value" in e] + ["SERVIMG_NODE=engine"]
    flags = [
        "--rm",
        "--network",
        "none",
        "-v",
        f"{results}:{results}",
        "--entrypoint",
        container["command"][0],
    ]
    argv = [
        "docker",
        "run",
        *flags,
        *[x for e in env for x in ("-e", e)],
        image_id,
        *container["command"][1:],
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)


# The toy server in the image: it first imports every overlay module of the image's witness spec (so the
# image's witness hook records the patched code, as vLLM's processes would), then serves.
IN_IMAGE = """
import importlib, json, os, runpy, sys
spec = "/opt/servimg/witness-spec.json"
if os.path.isfile(spec):
    for module in json.load(open(spec)).get("modules") or []:
        importlib.import_module(module["module"])
sys.argv = ["/toy/toy_engine.py", *sys.argv[1:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.docker
@pytest.mark.vllm
@pytest.mark.root
def test_the_jobs_run_inside_the_real_image_under_its_own_python(cpu_clean: Any, tmp_path: Path) -> None:
    """The pod's code path in the CPU vLLM image (its /opt/venv python imports servimg from the results
    volume, its witness hook is active): the toy engine stands in for vLLM, so the run takes seconds."""
    image_id = str(cpu_clean.images[0].image.config_digest)
    doc = yaml.safe_load((TOY / "toy.yaml").read_text())
    doc["name"] = "toy-in-image"
    doc["server"]["command"] = ["/opt/venv/bin/python", "/toy/in_image.py"]
    doc["server"]["startup_timeout_s"] = 300  # importing the overlay modules imports vLLM (torch)
    (tmp_path / "ladder").mkdir()
    shutil.copy(TOY / "toy-probes.json", tmp_path / "ladder" / "toy-probes.json")
    (tmp_path / "ladder" / "toy-in-image.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    loaded = load(tmp_path / "ladder" / "toy-in-image.yaml")
    results = tmp_path / "results"
    (results / "toy").mkdir(parents=True)
    shutil.copy(TOY / "toy_engine.py", results / "toy" / "toy_engine.py")
    (results / "toy" / "in_image.py").write_text(IN_IMAGE)

    def resolver(ref: str, loaded: LoadedLadder) -> tuple[str, dict[str, Any]]:  # the engine's image
        return "servimg-test/cpu-vllm", image_facts(ref, image_id, image_id, {}, loaded.definition)

    config = RunConfig(None, results, {"toy_dir": str(results / "toy")})
    opts = k8s.K8sOptions(results_claim="ladder-results")
    k8s.emit(loaded, image_id, config, opts, tmp_path / "k8s", print, resolver)
    jobs = _jobs(tmp_path / "k8s")
    assert {j["spec"]["template"]["spec"]["containers"][0]["command"][0] for j in jobs} == {
        "/opt/venv/bin/python"
    }
    ran = [_docker_run_job(j, image_id, results) for j in jobs]
    assert [r.returncode for r in ran] == [0] * len(jobs), [r.stderr[-2000:] for r in ran]
    doc = k8s.collect(results, None, print).to_json()
    assert doc["verdict"] == "PASS", doc["verdict_reasons"]
    for arm in doc["arms"]:  # the image's witness hook wrote into the results volume; collected per arm
        assert arm["witness"]["directory"].startswith(str(results / "witness-raw"))
        assert arm["witness"]["problems"] == [] and set(arm["witness"]["expected_modules"]) <= set(
            arm["witness"]["loaded_modules"]
        )
    assert {p["node"] for p in doc["placement"]["arms"].values()} == {"engine"}
