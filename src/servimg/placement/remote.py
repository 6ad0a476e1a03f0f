"""A ladder run split over scheduler jobs: the plan a job reads, the results it writes, and the job itself.

The submitter (`servimg.placement.slurm`) pre-registers the inputs, writes `plan.json` into the shared results
directory (`--out`, which every node must see) and submits one job per chain (`servimg.ladder.plan`). A job
runs `python -m servimg.placement.remote RESULTS CHAIN` on its node, which:

1. pulls the image BY DIGEST and refuses other bytes (`engine.pull_by_digest`);
2. re-hashes the pre-registered inputs (ladder, probes, harness source, model files, variables) on the
   node, and refuses to run an arm if they differ from what the submitter registered;
3. runs its chain's arms with the local harness (`runner.run_arms`), writing each arm's record atomically
   to `arms/<arm>.json` as it finishes, and its own status to `jobs/chain-<n>.json`.

In a Kubernetes Job (`servimg.placement.k8s`) the same entry runs with `--in-container`: the kubelet pulled
the image by digest and the job runs INSIDE it, so step 1 is the kubelet's, and the arms' servers are
processes of this container (`RunConfig.command`, mounts as symlinks) instead of containers of an engine.

The submitter then reads the records back (`read_record`: outputs are re-judged by the same pure
functions) and writes the same receipt a local run writes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType
from typing import Protocol

from servimg.backends import engine
from servimg.core import jsonview as jv
from servimg.core.atomic import atomic_write
from servimg.core.context import Log
from servimg.core.digest import Digest
from servimg.core.errors import LadderRunError, ServimgError
from servimg.ladder.evaluation import ArmOutcome, Output, RequestOutcome, judge
from servimg.ladder.loading import LoadedLadder, load
from servimg.ladder.plan import Chain
from servimg.ladder.prereg import capture_inputs
from servimg.ladder.receipt import ArmRecord, PlacedJob, Placement
from servimg.ladder.runner import Prepared, run_arms
from servimg.ladder.server import RunConfig

PLAN = "plan.json"
PLAN_VERSION = 1


# ------------------------------------------------------------------------------------------ the plan


@dataclass(frozen=True)
class JobPlan:
    """What every job of one run needs: written once by the submitter, read by each job."""

    run_id: str
    started_at: str
    ladder_path: str  # absolute: the node re-reads (and re-hashes) the same file
    repository: str  # HOST[:PORT]/REPO of the image under test
    manifest: Digest  # the image's manifest digest: what each node pulls
    config_digest: Digest  # the image ID the pull must produce
    image: Mapping[str, object]  # the receipt's image facts, as the submitter resolved them
    variables: Mapping[str, str]
    model_dir: str | None
    inputs_sha256: str
    prereg: Mapping[str, object]
    deviations: tuple[str, ...]
    gpus: str | None
    chains: tuple[Chain, ...]

    def as_json(self) -> dict[str, object]:
        return {
            "plan_version": PLAN_VERSION,
            "run_id": self.run_id,
            "started_at": self.started_at,
            "ladder_path": self.ladder_path,
            "repository": self.repository,
            "manifest": str(self.manifest),
            "config_digest": str(self.config_digest),
            "image": dict(self.image),
            "variables": dict(self.variables),
            "model_dir": self.model_dir,
            "inputs_sha256": self.inputs_sha256,
            "prereg": dict(self.prereg),
            "deviations": list(self.deviations),
            "gpus": self.gpus,
            "chains": [{"index": c.index, "arms": list(c.arms)} for c in self.chains],
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, object]) -> JobPlan:
        if doc.get("plan_version") != PLAN_VERSION:
            raise LadderRunError(f"plan version {doc.get('plan_version')!r} is not {PLAN_VERSION}")
        return cls(
            str(doc["run_id"]),
            str(doc["started_at"]),
            str(doc["ladder_path"]),
            str(doc["repository"]),
            Digest.parse(jv.text(doc["manifest"], "manifest")),
            Digest.parse(jv.text(doc["config_digest"], "config_digest")),
            dict(jv.obj(doc["image"], "image")),
            {key: jv.text(value, f"variables.{key}") for key, value in jv.obj(doc["variables"]).items()},
            jv.optional_text(doc.get("model_dir"), "model_dir"),
            str(doc["inputs_sha256"]),
            dict(jv.obj(doc["prereg"], "prereg")),
            tuple(jv.texts(doc.get("deviations") or (), "deviations")),
            jv.optional_text(doc.get("gpus"), "gpus"),
            tuple(
                Chain(jv.integer(c["index"]), tuple(jv.texts(c["arms"])))
                for c in jv.objs(doc["chains"], "chains")
            ),
        )

    @classmethod
    def of(
        cls,
        prepared: Prepared,
        loaded: LoadedLadder,
        repository: str,
        gpus: str | None,
        chains: Sequence[Chain],
    ) -> JobPlan:
        image = prepared.image
        return cls(
            prepared.run_id,
            prepared.started_at,
            str(loaded.ladder_path.resolve()),
            repository,
            Digest.parse(jv.text(image["digest"], "image.digest")),
            Digest.parse(jv.text(image["config_digest"], "image.config_digest")),
            dict(image),
            dict(prepared.variables),
            None if prepared.model_dir is None else str(prepared.model_dir.resolve()),
            prepared.inputs.sha256,
            dict(prepared.prereg),
            prepared.deviations,
            gpus,
            tuple(chains),
        )

    def prepared(self, loaded: LoadedLadder) -> Prepared:
        """The submitter's pre-registration, with the inputs hashed again HERE (on the node)."""
        model_dir = None if self.model_dir is None else Path(self.model_dir)
        inputs = capture_inputs(loaded, self.variables, model_dir)
        return Prepared(
            self.run_id,
            self.started_at,
            self.image,
            self.variables,
            model_dir,
            inputs,
            self.prereg,
            self.deviations,
        )


def write_plan(results: Path, plan: JobPlan) -> Path:
    results.mkdir(parents=True, exist_ok=True)
    path = results / PLAN
    atomic_write(path, json.dumps(plan.as_json(), indent=1, sort_keys=True).encode(), 0o644)
    return path


def read_plan(results: Path) -> JobPlan:
    try:
        return JobPlan.from_json(json.loads((results / PLAN).read_bytes()))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LadderRunError(
            f"cannot read the job plan {results / PLAN}: {exc}",
            hint="--out must be a directory every node sees at the same path (a shared filesystem)",
        ) from None


# ------------------------------------------------------------------------------------------ records


def record_json(record: ArmRecord) -> dict[str, object]:
    """An arm's record as JSON: raw outputs (judged again by the reader), metric deltas, facts."""
    o = record.outcome
    return {
        "arm": o.arm_id,
        "role": o.role,
        "error": o.error,
        "metrics_delta": dict(o.metrics_delta),
        "witness_problems": None if o.witness_problems is None else list(o.witness_problems),
        "witness_loaded": None if o.witness_loaded is None else list(o.witness_loaded),
        "witness_expected": list(o.witness_expected),
        "requests": [
            {
                "prompt_id": r.prompt_id,
                "family_id": r.family_id,
                "error": r.error,
                "output": None if r.output is None else _output_json(r.output),
            }
            for r in o.requests
        ],
        "facts": record.facts,
    }


def _output_json(output: Output) -> dict[str, object]:
    """Exact: every logprob as Python's repr round-trips it (NaN, which JSON lacks, as null)."""
    return {
        "token_ids": list(output.token_ids),
        "logprobs": [None if math.isnan(x) else x for x in output.logprobs],
        "text": output.text,
        "finish_reason": output.finish_reason,
        "prompt_token_ids": list(output.prompt_token_ids),
    }


def read_record(doc: Mapping[str, object], loaded: LoadedLadder) -> ArmRecord:
    """A record written by `record_json`, with every request judged again here (pure functions, the
    pre-registered detectors): the verdict never trusts a node's own judgement."""
    ladder = loaded.definition
    spec = ladder.arm(str(doc["arm"]))
    prompts = {p.id: p for _, p in loaded.probes.prompts}
    requests = []
    for r in jv.objs(doc["requests"], "requests"):
        raw = r.get("output")
        output = None if raw is None else _output(jv.obj(raw, "requests[].output"))
        prompt = prompts[str(r["prompt_id"])]
        error = jv.optional_text(r.get("error"), "requests[].error")
        judgement = judge(output, prompt.expect, ladder.thresholds.detectors, error)
        requests.append(RequestOutcome(prompt.id, str(r["family_id"]), output, judgement, error))
    witness, modules = doc.get("witness_problems"), doc.get("witness_loaded")
    outcome = ArmOutcome(
        spec.id,
        spec.role,
        tuple(requests),
        {
            k: None if v is None else jv.number(v, f"metrics_delta.{k}")
            for k, v in jv.obj(doc.get("metrics_delta") or {}).items()
        },
        jv.optional_text(doc.get("error"), "error"),
        None if witness is None else tuple(jv.texts(witness, "witness_problems")),
        None if modules is None else tuple(jv.texts(modules, "witness_loaded")),
        tuple(jv.texts(doc.get("witness_expected") or (), "witness_expected")),
    )
    return ArmRecord(spec, outcome, dict(jv.obj(doc.get("facts") or {}, "facts")))


def _output(raw: Mapping[str, object]) -> Output:
    return Output(
        jv.text(raw["text"], "output.text"),
        tuple(jv.integer(t, "output.token_ids[]") for t in jv.seq(raw["token_ids"])),
        tuple(
            float("nan") if x is None else jv.number(x, "output.logprobs[]") for x in jv.seq(raw["logprobs"])
        ),
        jv.optional_text(raw.get("finish_reason"), "output.finish_reason"),
        tuple(jv.integer(t, "output.prompt_token_ids[]") for t in jv.seq(raw.get("prompt_token_ids") or ())),
    )


def chain_records(
    loaded: LoadedLadder, results: Path, chain: Chain, failure: str | None, job: str
) -> dict[str, ArmRecord]:
    """The records of one chain's arms as the job wrote them. With `failure` (the job did not end done)
    every arm carries it as its error, so it FAILs; an arm without a record fails the same way."""
    found = {}
    for arm_id in chain.arms:
        doc = read_json(arm_path(results, arm_id))
        record = read_record(doc, loaded) if doc is not None else None
        if failure is not None:
            record = failed_record(loaded, arm_id, record, failure)
        elif record is None:
            why = f"{job} completed without a record of arm {arm_id}"
            record = failed_record(loaded, arm_id, None, why)
        found[arm_id] = record
    return found


def failed_record(loaded: LoadedLadder, arm_id: str, record: ArmRecord | None, why: str) -> ArmRecord:
    spec = loaded.definition.arm(arm_id)
    if record is None:
        return ArmRecord(spec, ArmOutcome(spec.id, spec.role, (), {}, why), {})
    error = why if record.outcome.error is None else f"{why}; {record.outcome.error}"
    return ArmRecord(spec, replace(record.outcome, error=error), record.facts)


def arm_path(results: Path, arm_id: str) -> Path:
    return results / "arms" / f"{arm_id}.json"


ArmPlaces = Mapping[str, Mapping[str, str]]  # the placement's `arms`: arm id → where it ran


@dataclass(frozen=True)
class ChainOutcome:
    """One chain as its scheduler saw it: the job's own fields for the placement, where its arms ran,
    why they cannot pass (None: the job ran to the end), and the job's name for their errors."""

    job: Mapping[str, object]
    where: Mapping[str, str]
    failure: str | None
    name: str


class Scheduler(Protocol):
    """How a scheduler (Slurm, Kubernetes) places a ladder's chains as jobs, as `collect` reads them
    back: each chain's outcome from its job and the status the harness wrote, and the run's placement."""

    def outcome(self, chain: Chain, status: Mapping[str, object]) -> ChainOutcome: ...

    def placement(self, jobs: Sequence[PlacedJob], arms: ArmPlaces) -> Placement: ...


def collect(
    loaded: LoadedLadder, results: Path, chains: Sequence[Chain], scheduler: Scheduler
) -> tuple[list[ArmRecord], bool, Placement]:
    """Every arm's record in declared order, whatever the scheduler: the arms of a job that did not end
    done carry the scheduler's reason as their error (so they FAIL), and an arm with no record fails the
    same way. Returns the records, whether the inputs stayed unchanged in every job, and the placement."""
    found: dict[str, ArmRecord] = {}
    unchanged = True
    jobs: list[PlacedJob] = []
    arms: dict[str, Mapping[str, str]] = {}
    for chain in chains:
        status = read_json(status_path(results, chain)) or {}
        if status.get("inputs_unchanged") is False:
            unchanged = False
        outcome = scheduler.outcome(chain, status)
        jobs.append(
            PlacedJob(
                chain.index,
                tuple(chain.arms),
                outcome.job,
                jv.optional_text(status.get("state"), "status.state"),
                jv.optional_text(status.get("started_at"), "status.started_at"),
                jv.optional_text(status.get("finished_at"), "status.finished_at"),
                outcome.failure,
            )
        )
        arms.update({a: outcome.where for a in chain.arms})
        found.update(chain_records(loaded, results, chain, outcome.failure, outcome.name))
    records = [found[a.id] for a in loaded.definition.arms if a.id in found]
    return records, unchanged, scheduler.placement(jobs, {a: dict(w) for a, w in arms.items()})


def status_path(results: Path, chain: Chain) -> Path:
    return results / "jobs" / f"{chain.name}.json"


def _write_json(path: Path, doc: Mapping[str, object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(doc, indent=1, sort_keys=True).encode(), 0o644)


def read_json(path: Path) -> dict[str, object] | None:
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


# ------------------------------------------------------------------------------------------ the job


def job_id() -> str | None:
    """The scheduler's id for this job: `SERVIMG_JOB_ID` (a Kubernetes Job's name, set by its manifest),
    a Slurm array task `ARRAY_TASK`, else the plain job id."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if os.environ.get("SERVIMG_JOB_ID"):
        return os.environ["SERVIMG_JOB_ID"]
    if array and task:
        return f"{array}_{task}"
    return os.environ.get("SLURM_JOB_ID") or os.environ.get("HOSTNAME")


def node_name() -> str:
    """Where the job runs: `SERVIMG_NODE` (a pod's spec.nodeName, via the downward API), else the host."""
    return os.environ.get("SERVIMG_NODE") or socket.gethostname()


def run_chain(results: Path, chain_index: int, log: Log, in_container: bool = False) -> int:
    """Run one chain on this node; exit status 0 when every arm ran with unchanged inputs."""
    plan = read_plan(results)
    chain = next((c for c in plan.chains if c.index == chain_index), None)
    if chain is None:
        raise LadderRunError(f"the plan has no chain {chain_index} (chains 0..{len(plan.chains) - 1})")
    status: dict[str, object] = {
        "chain": chain.index,
        "arms": list(chain.arms),
        "job_id": job_id(),
        "node": node_name(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "state": "running",
        "error": None,
        "inputs_unchanged": None,
    }
    _write_json(status_path(results, chain), status)
    try:
        code = _run(results, plan, chain, status, log, in_container)
    except ServimgError as exc:
        status.update(state="error", error=exc.message, problems=list(exc.problems)[:20])
        code = 2
    except KeyboardInterrupt:  # SIGTERM from the scheduler (scancel, time limit): see `_terminate`
        status.update(state="terminated", error="the job was terminated by the scheduler")
        code = 143
    status["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    _write_json(status_path(results, chain), status)
    return code


def _run(
    results: Path, plan: JobPlan, chain: Chain, status: dict[str, object], log: Log, in_container: bool
) -> int:
    loaded = load(Path(plan.ladder_path))
    if in_container:  # the kubelet pulled {repository}@{manifest}: this process runs inside it
        log(f"{chain.name} on {status['node']}: inside {plan.repository}@{plan.manifest}")
    else:
        log(f"{chain.name} on {status['node']}: pulling {plan.repository}@{plan.manifest}")
        engine.pull_by_digest(plan.repository, plan.manifest, plan.config_digest)
    prepared = plan.prepared(loaded)
    status["inputs_sha256"] = prepared.inputs.sha256
    if prepared.inputs.sha256 != plan.inputs_sha256:
        status.update(
            state="invalid",
            inputs_unchanged=False,
            error="the pre-registered inputs differ on this node",
            differences=input_differences(jv.obj(plan.prereg.get("inputs") or {}), prepared.inputs.as_json()),
        )
        log(f"{chain.name}: the pre-registered inputs differ on this node: no arm runs")
        return 3
    config = RunConfig(str(plan.config_digest), results, plan.variables, plan.gpus)
    if in_container:
        config = replace(config, command=True, link_mounts=True)

    def written(record: ArmRecord) -> None:
        _write_json(arm_path(results, record.spec.id), record_json(record))

    records, unchanged = run_arms(
        loaded, chain.arms, config, prepared, f"{plan.run_id}-{chain.index}", log, written
    )
    for record in records:  # again: a server's exit facts are merged into its arm once it stopped
        written(record)
    status.update(state="done" if unchanged else "invalid", inputs_unchanged=unchanged)
    return 0 if unchanged else 3


def input_differences(
    registered: Mapping[str, object], here: Mapping[str, object], prefix: str = ""
) -> list[str]:
    """Which pre-registered inputs differ (dotted keys), to say WHY a node refused to run."""
    out = []
    for key in sorted(set(registered) | set(here)):
        a, b = registered.get(key), here.get(key)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out += input_differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}")
    return out


def _terminate(signum: int, frame: FrameType | None) -> None:
    """Slurm signals a job it cancels or times out with SIGTERM (KillWait before SIGKILL): unwind, so
    the runner's `finally` removes the containers it started (dockerd, not the job, is their parent)."""
    raise KeyboardInterrupt


def node_parser() -> argparse.ArgumentParser:
    """The job's command line (`sbatch_argv`, and the Kubernetes manifests, are tested against it)."""
    p = argparse.ArgumentParser(
        prog="python -m servimg.placement.remote", description="run one chain of arms"
    )
    p.add_argument("results", type=Path, help="the shared results directory holding plan.json")
    p.add_argument("chain", type=int, help="the chain's index in the plan")
    p.add_argument(
        "--in-container",
        action="store_true",
        help="run inside the image under test (a Kubernetes pod): no pull, servers as local processes",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = node_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:
        return int(exc.code or 0)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        log: Log = lambda line: print(line, flush=True)  # noqa: E731
        return run_chain(args.results, args.chain, log, args.in_container)
    except ServimgError as exc:
        print(f"FAIL: {exc.message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
