"""`servimg ladder IMAGE --on k8s --emit DIR`: each chain of arms (`servimg.ladder.plan`) as one Kubernetes
Job manifest, and `--collect RESULTS`: the receipt from what those Jobs wrote (docs/ladder.md, "Kubernetes").

Why manifests, not a submission: no cluster can be reached from where servimg is built and tested, and a
team applies manifests with the tools it already trusts (`kubectl apply -k DIR`, Argo, Flux). The emitted
directory is a pure function of the image digest, the ladder, the pre-registered inputs and the options:
emitting twice writes identical bytes.

Each Job's one container IS the image under test, pinned by digest (the kubelet pulls exactly those bytes),
and runs the same node-side entry as a Slurm job,
`python -m servimg.placement.remote RESULTS N --in-container`:
it re-hashes the pre-registered inputs before its first arm, runs the chain's arms with the local harness
(servers as processes of the container, the ladder's mounts and caches as symlinks) and writes every arm's
record atomically to the results volume. The volume (a PersistentVolumeClaim or a hostPath) is mounted at
the same absolute path as `--out` on the submitter, so the plan's paths hold in the pod; the harness itself
(servimg's source) is put on the volume at emit time, and its hashes are part of the pre-registration.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from servimg.core import jsonview as jv
from servimg.core.atomic import atomic_write
from servimg.core.context import Log
from servimg.core.errors import LadderError, LadderRunError, ServimgError
from servimg.core.reference import Reference
from servimg.ladder.definition import substitute
from servimg.ladder.loading import LoadedLadder, load
from servimg.ladder.plan import Chain, chains
from servimg.ladder.receipt import PlacedJob, Placement, Receipt
from servimg.ladder.runner import finish, prepare
from servimg.ladder.server import RunConfig
from servimg.placement import remote

INDEX = "k8s.json"  # in the results directory: what `--collect` reads (job names, namespace)
HARNESS = "harness"  # in the results directory: servimg's source, on the pod's PYTHONPATH
INPUTS = "inputs"  # in the results directory: the ladder and its probe set, as the pods read them
SETUP_S = 600  # per job, on top of the ladder's own timeouts: scheduling, the image pull, the harness
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$")
_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


class K8sError(LadderRunError):
    """Manifests cannot be emitted as asked, or what Jobs wrote cannot be collected."""


@dataclass(frozen=True)
class K8sOptions:
    namespace: str = "default"
    gpu_resource: str = "nvidia.com/gpu"
    gpus: str | None = None  # a count per Job (one chain's servers); None: no GPU request
    results_claim: str | None = None  # a PersistentVolumeClaim holding the results directory
    results_host_path: str | None = None  # or a directory on every node
    time_limit: str | None = None  # Slurm's format ([D-]HH:MM:SS, MM, …); default from the ladder's timeouts
    python: str | None = None  # the interpreter in the image (default: the ladder's server command's)
    force: bool = False  # replace a non-empty --emit directory

    def check(self) -> None:
        """Every problem of the options at once (not at construction: the CLI builds them from its
        arguments before a command runs, and a command's errors are its outcome)."""
        problems = []
        if not _DNS_LABEL.match(self.namespace) or len(self.namespace) > 63:
            problems.append(f"--namespace {self.namespace!r} is not a DNS-1123 label")
        if (self.results_claim is None) == (self.results_host_path is None):
            problems.append("give the results volume: --results-claim PVC or --results-host-path DIR (one)")
        if self.results_host_path is not None and not self.results_host_path.startswith("/"):
            problems.append(f"--results-host-path {self.results_host_path!r} must be absolute")
        if self.results_claim is not None and not _DNS_LABEL.match(self.results_claim):
            problems.append(f"--results-claim {self.results_claim!r} is not a valid claim name")
        if self.gpus is not None and (not self.gpus.isdigit() or int(self.gpus) < 1):
            problems.append(f"--gpus {self.gpus}: give a count ≥ 1 per Job (or leave it out: no GPU request)")
        if "/" not in self.gpu_resource:
            problems.append(f"--gpu-resource {self.gpu_resource!r} is not an extended resource (vendor/name)")
        if self.time_limit is not None and time_limit_s(self.time_limit) is None:
            problems.append(f"--time-limit {self.time_limit!r}: use [D-]HH:MM:SS, MM:SS or minutes")
        if problems:
            raise K8sError(
                "cannot emit Kubernetes Jobs", problems=problems, hint="see `servimg ladder --help`"
            )


def time_limit_s(text: str) -> int | None:
    """Seconds of a Slurm time limit (`MM`, `MM:SS`, `HH:MM:SS`, `D-HH`, `D-HH:MM`, `D-HH:MM:SS`)."""
    m = _TIME.match(text.strip())
    if m is None:
        return None
    days, a, b, c = (int(g) if g is not None else None for g in m.groups())
    assert a is not None
    if days is not None:  # D-HH[:MM[:SS]]
        seconds = days * 86400 + a * 3600 + (b or 0) * 60 + (c or 0)
    elif c is not None:
        seconds = a * 3600 + (b or 0) * 60 + c
    elif b is not None:
        seconds = a * 60 + b
    else:
        seconds = a * 60
    return seconds if seconds > 0 else None


def chain_deadline_s(loaded: LoadedLadder, chain: Chain) -> int:
    """The longest a chain may take by the ladder's own timeouts: every fresh server's startup, every
    request's timeout, plus setup. A Job past it is stopped by Kubernetes (activeDeadlineSeconds)."""
    ladder = loaded.definition
    prompts = len(loaded.probes.prompts)
    total = float(SETUP_S)
    for arm in (ladder.arm(a) for a in chain.arms):
        if arm.reuses is None:
            total += ladder.server.startup_timeout_s
        total += prompts * ladder.server.request_timeout_s
    return int(total)


def shm_quantity(docker_size: str) -> str:
    """Docker's `1g`/`512m` as a Kubernetes quantity (`1Gi`/`512Mi`): both mean powers of 1024."""
    m = re.match(r"^(\d+)([bkmg]?)$", docker_size.strip().lower())
    if m is None:
        raise K8sError(f"server.shm_size {docker_size!r} is not a size like 1g or 512m")
    return m.group(1) + {"": "", "b": "", "k": "Ki", "m": "Mi", "g": "Gi"}[m.group(2)]


# ------------------------------------------------------------------------------------------ manifests


@dataclass(frozen=True)
class Emission:
    """What the manifests are about: everything in them comes from here (so they are a pure function)."""

    ladder: str
    repository: str
    manifest: str  # sha256:… of the image under test
    inputs_sha256: str
    results: str  # absolute: the volume's mountPath, = the submitter's --out
    python: str
    shm: str
    chains: tuple[tuple[Chain, int], ...]  # each chain with its deadline in seconds


def job_name(emission: Emission, chain: Chain) -> str:
    """A DNS-1123 name ≤ 63 characters (Kubernetes puts it in a label): ladder, digest, inputs, chain."""
    digest = emission.manifest.removeprefix("sha256:")[:10]
    tail = f"-{digest}-{emission.inputs_sha256[:6]}-c{chain.index}"
    head = re.sub(r"[^a-z0-9-]+", "-", f"servimg-{emission.ladder}".lower()).strip("-")
    return head[: 63 - len(tail)].rstrip("-") + tail


def labels(emission: Emission, chain: Chain) -> dict[str, str]:
    """Label values are ≤ 63 characters: the digest's first 63 hex digits (the annotation has all 64)."""
    return {
        "app.kubernetes.io/managed-by": "servimg",
        "app.kubernetes.io/name": "servimg-ladder",
        "servimg.io/ladder": re.sub(r"[^A-Za-z0-9._-]", "-", emission.ladder)[:63].strip("-._"),
        "servimg.io/chain": str(chain.index),
        "servimg.io/image-digest": emission.manifest.removeprefix("sha256:")[:63],
    }


def node_argv(emission: Emission, chain: Chain) -> list[str]:
    """The container's command: `servimg.placement.remote`'s, in the container (`remote.node_parser`)."""
    entry = [emission.python, "-m", "servimg.placement.remote"]
    return [*entry, emission.results, str(chain.index), "--in-container"]


def job_manifest(emission: Emission, chain: Chain, deadline_s: int, options: K8sOptions) -> dict[str, object]:
    """One batch/v1 Job: one pod, never retried (a retry would re-run arms over half-written state)."""
    name = job_name(emission, chain)
    image = f"{emission.repository}@{emission.manifest}"
    env = [
        {"name": "PYTHONPATH", "value": f"{emission.results}/{HARNESS}"},
        {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
        {"name": "SERVIMG_JOB_ID", "value": name},
        {"name": "SERVIMG_NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
    ]
    resources: dict[str, object] = {}
    if options.gpus is not None:
        count = {options.gpu_resource: str(int(options.gpus))}
        resources = {"requests": dict(count), "limits": dict(count)}  # extended resources: requests = limits
    if options.results_claim is not None:
        volume: dict[str, object] = {"persistentVolumeClaim": {"claimName": options.results_claim}}
    else:
        volume = {"hostPath": {"path": options.results_host_path, "type": "Directory"}}
    container = {
        "name": "ladder",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": node_argv(emission, chain),
        "env": env,
        "resources": resources,
        "volumeMounts": [
            {"name": "results", "mountPath": emission.results},
            {"name": "dshm", "mountPath": "/dev/shm"},
        ],
    }
    meta_labels = labels(emission, chain)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": options.namespace,
            "labels": meta_labels,
            "annotations": {
                "servimg.io/image": image,
                "servimg.io/arms": ",".join(chain.arms),
                "servimg.io/inputs-sha256": emission.inputs_sha256,
            },
        },
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": deadline_s,
            "template": {
                "metadata": {"labels": meta_labels},
                "spec": {
                    "restartPolicy": "Never",
                    # SIGTERM (deadline, deletion) unwinds the harness: its servers are stopped, records kept
                    "terminationGracePeriodSeconds": 60,
                    "containers": [container],
                    "volumes": [
                        {"name": "results", **volume},
                        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": emission.shm}},
                    ],
                },
            },
        },
    }


def manifests(emission: Emission, options: K8sOptions) -> dict[str, bytes]:
    """Every file of the emitted directory, by name: one Job per chain, kustomization.yaml, jobs.json."""
    files: dict[str, bytes] = {}
    jobs = []
    for chain, deadline in emission.chains:
        file = f"job-{chain.name}.yaml"
        files[file] = canonical_yaml(job_manifest(emission, chain, deadline, options))
        jobs.append(
            {
                "name": job_name(emission, chain),
                "chain": chain.index,
                "arms": list(chain.arms),
                "file": file,
                "active_deadline_s": deadline,
            }
        )
    files["kustomization.yaml"] = canonical_yaml(
        {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [j["file"] for j in jobs],
        }
    )
    files["jobs.json"] = canonical_json(index(emission, options, jobs))
    return files


def index(emission: Emission, options: K8sOptions, jobs: Sequence[Mapping[str, object]]) -> dict[str, object]:
    return {
        "ladder": emission.ladder,
        "image": f"{emission.repository}@{emission.manifest}",
        "inputs_sha256": emission.inputs_sha256,
        "namespace": options.namespace,
        "results": emission.results,
        "results_volume": {"claim": options.results_claim, "host_path": options.results_host_path},
        "jobs": list(jobs),
        "apply": "kubectl apply -k .",
        "collect": f"servimg ladder {emission.repository}@{emission.manifest} --collect {emission.results}",
    }


def canonical_yaml(doc: Mapping[str, object]) -> bytes:
    return yaml.safe_dump(dict(doc), sort_keys=True, default_flow_style=False, width=4096).encode()


def canonical_json(doc: Mapping[str, object]) -> bytes:
    return (json.dumps(doc, indent=1, sort_keys=True, ensure_ascii=False) + "\n").encode()


# ------------------------------------------------------------------------------------------ emit

Resolver = Callable[[str, LoadedLadder], tuple[str, dict[str, object]]]


def resolve(ref_text: str, loaded: LoadedLadder, resolver: Resolver) -> tuple[str, dict[str, object]]:
    """The image by digest: a tag is resolved in its registry once; one that cannot be is refused."""
    try:
        ref = Reference.parse(ref_text)
    except ServimgError:
        ref = None
    try:
        repository, facts = resolver(ref_text, loaded)
    except ServimgError as exc:
        if ref is not None and ref.digest is None:
            raise K8sError(
                f"{ref_text} names a tag that could not be resolved to a digest: {exc.message}",
                hint="a Job must pin the image by digest: pass HOST/REPO@sha256:…, or make its registry "
                "reachable from here so the tag is resolved once",
            ) from None
        raise
    return repository, facts


def emit(
    loaded: LoadedLadder,
    ref_text: str,
    config: RunConfig,
    options: K8sOptions,
    dest: Path,
    log: Log,
    resolver: Resolver,
) -> dict[str, object]:
    """Pre-register into the results directory (`config.out`), put the inputs and the harness there, and
    write the manifests into `dest` (a new directory, renamed into place: never half-written)."""
    options.check()
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())) and not options.force:
        raise K8sError(
            f"--emit {dest} exists and is not empty",
            hint="give a new directory, or --force to replace it",
        )
    results = config.out.resolve()
    repository, facts = resolve(ref_text, loaded, resolver)
    variables = dict(config.variables)
    if loaded.definition.model.generate and "model_dir" not in variables:
        raise K8sError(
            "--on k8s does not generate the model: the pods must read it from the results volume",
            hint=f"generate it once (a local `servimg ladder` run), copy it under {results} and pass "
            f"--var model_dir={results}/model",
        )
    outside = [m for m in mount_sources(loaded, variables) if not Path(m).resolve().is_relative_to(results)]
    if outside:
        raise K8sError(
            f"the ladder mounts {', '.join(outside)}: not on the results volume ({results})",
            hint="the pods see only the results volume: copy it under --out and pass --var NAME=that path",
        )
    staged = stage_inputs(loaded, results)
    install_harness(results / HARNESS)
    local = replace(config, image=str(facts["config_digest"]), out=results, variables=variables)
    prepared = prepare(staged, local, log, image=facts)
    planned = chains(staged.definition)
    plan = remote.JobPlan.of(prepared, staged, repository, None, planned)
    remote.write_plan(results, plan)
    server_python = staged.definition.server.command[:1]
    python = options.python or (
        server_python[0] if server_python and Path(server_python[0]).name.startswith("python") else "python3"
    )
    emission = Emission(
        staged.definition.name,
        repository,
        str(facts["digest"]),
        prepared.inputs.sha256,
        str(results),
        python,
        shm_quantity(staged.definition.server.shm_size),
        tuple((c, _deadline(staged, c, options)) for c in planned),
    )
    files = manifests(emission, options)
    atomic_write(results / INDEX, files["jobs.json"], 0o644)
    write_directory(dest, files)
    log(f"k8s: {len(planned)} Job(s) in {dest}: kubectl apply -k {dest}; then --collect {results}")
    emitted: dict[str, object] = json.loads(files["jobs.json"])
    return emitted


def mount_sources(loaded: LoadedLadder, variables: Mapping[str, str]) -> list[str]:
    """The paths the ladder's servers mount (the model, …): in a pod they must be on the results volume."""
    try:
        return sorted({substitute(m.source, variables) for m in loaded.definition.server.mounts})
    except LadderError as exc:
        raise K8sError(exc.message, hint=exc.hint) from None


def _deadline(loaded: LoadedLadder, chain: Chain, options: K8sOptions) -> int:
    limit = time_limit_s(options.time_limit) if options.time_limit is not None else None
    return limit if limit is not None else chain_deadline_s(loaded, chain)


def stage_inputs(loaded: LoadedLadder, results: Path) -> LoadedLadder:
    """The ladder and its probe set copied onto the results volume (side by side: `load` finds the probe
    set beside its ladder), loaded from there: the paths pre-registered are the paths the pods read."""
    where = results / INPUTS
    where.mkdir(parents=True, exist_ok=True)
    ladder = where / loaded.ladder_path.name
    probes = where / loaded.probes_path.name
    ladder.write_bytes(loaded.ladder_bytes)
    probes.write_bytes(loaded.probes_bytes)
    return load(ladder)


def install_harness(dest: Path) -> None:
    """servimg's own source (and the pure-Python docker SDK it imports) on the volume, for the pods'
    PYTHONPATH; the image provides the rest (requests, PyYAML: a vLLM image has them)."""
    import docker  # the installed SDK: its source is copied, not run here

    package = Path(__file__).resolve().parents[1]
    sources = {"servimg": package, "docker": Path(docker.__file__).resolve().parent}
    tmp = Path(tempfile.mkdtemp(prefix=".harness-", dir=dest.parent))
    try:
        for name, root in sources.items():
            shutil.copytree(root, tmp / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_directory(dest: Path, files: Mapping[str, bytes]) -> None:
    """Write `files` into a temporary sibling of `dest`, then rename it into place (an old `dest`, when
    replacing it, is moved aside first and removed last)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    old = dest.parent / f".{dest.name}.old"
    try:
        for name, data in sorted(files.items()):
            (tmp / name).write_bytes(data)
            (tmp / name).chmod(0o644)
        tmp.chmod(0o755)
        if dest.exists():
            shutil.rmtree(old, ignore_errors=True)
            dest.rename(old)
        tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)


# ------------------------------------------------------------------------------------------ collect


def job_states(doc: Mapping[str, object]) -> dict[str, str]:
    """`kubectl get jobs -o json` (a JobList, or one Job): per name, why it did not complete ("" if it
    did): the Failed condition's reason and message (DeadlineExceeded, BackoffLimitExceeded, …)."""
    items = doc.get("items") if doc.get("kind") != "Job" else [doc]
    out = {}
    for item in jv.objs(items or [], "items"):
        name = str(jv.member(item, "metadata", "name"))
        status = jv.obj(item.get("status") or {}, "status")
        true = [c for c in jv.objs(status.get("conditions") or [], "conditions") if c.get("status") == "True"]
        conditions = {str(c.get("type")): c for c in true}
        if "Complete" in conditions:
            out[name] = ""
        elif "Failed" in conditions:
            c = conditions["Failed"]
            out[name] = f"Failed, reason {c.get('reason')}: {c.get('message') or ''}".rstrip(": ")
        else:
            counts = f"active {status.get('active', 0)}, failed {status.get('failed', 0)}"
            out[name] = f"not finished ({counts})"
    return out


def collect(
    results: Path, ref_text: str | None, log: Log, jobs_json: Mapping[str, object] | None = None
) -> Receipt:
    """The receipt of a run whose Jobs have ended: the same as a local run's, placement `k8s`. A chain
    without a status, or one whose job did not end done, makes every arm of it FAIL with the reason."""
    results = results.resolve()
    plan = remote.read_plan(results)
    emitted = remote.read_json(results / INDEX) or {}
    if ref_text is not None:
        ref = _maybe_ref(ref_text)
        if ref is not None and ref.digest is not None and ref.digest != plan.manifest:
            raise K8sError(
                f"{results} holds a run of {plan.manifest}, not of {ref.digest}",
                hint="collect with the image the manifests were emitted for",
            )
    loaded = load(Path(plan.ladder_path))
    prepared = plan.prepared(loaded)
    unchanged = prepared.inputs.sha256 == plan.inputs_sha256
    names = {
        jv.integer(j["chain"], "jobs[].chain"): str(j["name"]) for j in jv.objs(emitted.get("jobs") or [])
    }
    states = job_states(jobs_json) if jobs_json is not None else {}
    scheduler = K8sPlacement(names, states, jv.optional_text(emitted.get("namespace"), "namespace"))
    records, all_unchanged, placement = remote.collect(loaded, results, plan.chains, scheduler)
    unchanged = unchanged and all_unchanged
    return finish(loaded, results, prepared, records, unchanged, placement, _span(plan, placement), log)


@dataclass(frozen=True)
class K8sPlacement:
    """The Jobs of an emitted run as `remote.collect` reads them: their names and, when given, what
    `kubectl get jobs -o json` said of each (`job_states`)."""

    names: Mapping[int, str]
    states: Mapping[str, str]
    namespace: str | None

    def outcome(self, chain: Chain, status: Mapping[str, object]) -> remote.ChainOutcome:
        name = self.names.get(chain.index, chain.name)
        node = str(status.get("node") or "")
        return remote.ChainOutcome(
            {"job_name": name, "node": node, "kubernetes": self.states.get(name)},
            {"job_name": name, "node": node},
            _failure(name, status, self.states.get(name)),
            f"k8s job {name}",
        )

    def placement(self, jobs: Sequence[PlacedJob], arms: remote.ArmPlaces) -> Placement:
        return Placement("k8s", {"namespace": self.namespace}, tuple(jobs), arms)


def _failure(name: str, status: Mapping[str, object], kubernetes: str | None) -> str | None:
    if status.get("state") == "done" and not kubernetes:
        return None
    if not status:
        text = f"k8s job {name}: no status in the results volume (the pod never started the harness)"
    else:
        text = f"k8s job {name}: the job reported {status.get('state')}"
        if status.get("error"):
            text += f": {status['error']}"
        if status.get("differences"):
            text += f" ({', '.join(jv.texts(status['differences'])[:8])})"
        if status.get("state") == "running":
            text += " (it was killed, or is still running)"
    if kubernetes:
        text += f"; Kubernetes: {kubernetes}"
    elif kubernetes is None:
        text += f"; see kubectl describe job {name}"
    return text


def _span(plan: remote.JobPlan, placement: Placement) -> float:
    """Seconds from the pre-registration to the last job's finish (what the jobs recorded)."""
    last = placement.last_finish
    if last is None:
        return 0.0
    fmt = "%Y-%m-%dT%H:%M:%SZ"
    return (dt.datetime.strptime(last, fmt) - dt.datetime.strptime(plan.started_at, fmt)).total_seconds()


def _maybe_ref(text: str) -> Reference | None:
    try:
        return Reference.parse(text)
    except ServimgError:
        return None
