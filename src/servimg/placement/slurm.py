"""`servimg ladder IMAGE --on slurm`: each chain of arms (`servimg.ladder.plan`) as one Slurm job.

Why a job array: chains are independent by construction (everything an arm needs from another arm is in
its own chain), so the jobs need no dependencies, and an array is one `sbatch`, one id to watch and to
cancel, and a native throttle: `--nodes-max N` is `--array=0-K%N` (at most N chains run at once). Each
array task runs chain `$SLURM_ARRAY_TASK_ID` with `python -m servimg.placement.remote` (this interpreter,
this servimg: the harness hashes are part of the pre-registration and re-checked on the node).

The registry is the shared state for the image (pulled BY DIGEST on every node); `--out` is the shared
results directory (plan, per-arm records, job status, logs). The submitter waits, printing pending /
running / done as they change, then reads Slurm's final state for every task (`scontrol show job`, which
slurmctld keeps for MinJobAge; `sacct` where accounting runs) and judges: an arm of a job that did not
COMPLETE fails with Slurm's state and reason, an arm without a record fails: never a PASS, never a
shorter ladder. Ctrl-C cancels the array (`scancel`).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from servimg.backends import engine
from servimg.backends.registry import read_image
from servimg.backends.registryclient import RegistryClient
from servimg.core import jsonview as jv
from servimg.core.context import Log
from servimg.core.digest import Digest
from servimg.core.errors import LadderRunError, ServimgError
from servimg.core.reference import Reference
from servimg.ladder.loading import LoadedLadder
from servimg.ladder.plan import Chain, chains
from servimg.ladder.receipt import ArmRecord, PlacedJob, Placement, Receipt
from servimg.ladder.runner import finish, image_facts, prepare
from servimg.ladder.server import RunConfig
from servimg.placement import remote

ACTIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING", "SIGNALING")


class SlurmError(LadderRunError):
    """Slurm refused a submission, or cannot say what became of a job."""


@dataclass(frozen=True)
class SlurmOptions:
    partition: str | None = None
    gres: str | None = None  # e.g. gpu:1 (per job: one chain's servers)
    nodes_max: int | None = None  # at most this many chains at once
    time_limit: str | None = None  # sbatch --time, e.g. 2:00:00
    extra: tuple[str, ...] = ()  # more sbatch arguments, verbatim (--mem=64G, --account=…)
    poll_s: float = 2.0

    def __post_init__(self) -> None:
        if self.nodes_max is not None and self.nodes_max < 1:
            raise SlurmError(
                f"--nodes-max {self.nodes_max}: give at least 1 (or leave it out: all chains at once)"
            )


@dataclass(frozen=True)
class TaskState:
    """One array task as Slurm reports it."""

    task: int
    job_id: str
    state: str  # PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, OUT_OF_MEMORY, NODE_FAIL, …
    reason: str = ""
    exit_code: str = ""
    node: str = ""

    @property
    def active(self) -> bool:
        return self.state.split(" ")[0] in ACTIVE

    @property
    def phase(self) -> str:
        return "pending" if self.state == "PENDING" else "running" if self.active else "done"

    def why(self) -> str:
        parts = [self.state]
        if self.reason and self.reason != "None":
            parts.append(f"reason {self.reason}")
        if self.exit_code:
            parts.append(f"exit {self.exit_code}")
        return ", ".join(parts)


class Scheduler(Protocol):
    """What the submitter needs from Slurm (the seam a test may replace; `SlurmCli` is the real one)."""

    def submit(self, argv: Sequence[str]) -> str: ...
    def tasks(self, array_id: str, count: int) -> list[TaskState]: ...
    def cancel(self, array_id: str) -> None: ...


def _fields(line: str) -> dict[str, str]:
    """`scontrol -o` output: space-separated Key=Value (values without spaces, except the last ones)."""
    out: dict[str, str] = {}
    key = None
    for token in line.split(" "):
        name, eq, value = token.partition("=")
        if eq and name and name[0].isupper():
            key = name
            out[key] = value
        elif key is not None:
            out[key] += " " + token
    return out


def parse_scontrol(text: str) -> list[TaskState]:
    """Task states from `scontrol show job -o ARRAY_ID` (one line per task; a pending range on one line)."""
    out = []
    for line in text.splitlines():
        f = _fields(line.strip())
        if "JobId" not in f:
            continue
        task = f.get("ArrayTaskId", "0")
        job = f"{f.get('ArrayJobId', f['JobId'])}_{task}" if "ArrayJobId" in f else f["JobId"]
        for number in _task_range(task):
            node = f.get("NodeList", "")
            out.append(
                TaskState(
                    number,
                    job if "-" not in task and "," not in task else f"{f.get('ArrayJobId')}_{number}",
                    f.get("JobState", "UNKNOWN"),
                    f.get("Reason", ""),
                    f.get("ExitCode", ""),
                    "" if node == "(null)" else node,
                )
            )
    return out


def _task_range(text: str) -> list[int]:
    """`3`, `0-4%2`, `1,3-5`: the task numbers."""
    numbers: list[int] = []
    for part in text.split("%")[0].split(","):
        low, dash, high = part.partition("-")
        if low.isdigit() and (not dash or high.isdigit()):
            numbers += list(range(int(low), int(high if dash else low) + 1))
    return numbers


def parse_sacct(text: str) -> list[TaskState]:
    """`sacct -n -P -X -o JobID,State,ExitCode,NodeList,Reason` lines (accounting, when it runs)."""
    out = []
    for line in text.splitlines():
        cells = line.split("|")
        if len(cells) < 5 or "_" not in cells[0]:
            continue
        task = cells[0].partition("_")[2]
        if task.isdigit():
            state = cells[1].split(" ")[0]
            out.append(TaskState(int(task), cells[0], state, cells[4], cells[2], cells[3]))
    return out


_UNKNOWN = (
    "slurmctld has no record of it and sacct none (without accounting, a task cancelled while still "
    "pending leaves none)"
)


class SlurmCli:
    """The real scheduler: Slurm's own commands (sbatch, scontrol, sacct, scancel) on PATH."""

    def _call(self, argv: Sequence[str], what: str) -> str:
        try:
            done = subprocess.run(list(argv), capture_output=True, text=True, timeout=120, check=False)
        except FileNotFoundError:
            raise SlurmError(
                f"{argv[0]} is not installed here",
                hint="submit from a Slurm login node (slurm-client), or run without --on slurm",
            ) from None
        except subprocess.TimeoutExpired:
            raise SlurmError(f"{what}: {argv[0]} did not answer within 120 s") from None
        if done.returncode != 0:
            raise SlurmError(f"{what} failed: {done.stderr.strip() or done.stdout.strip()}")
        return done.stdout

    def submit(self, argv: Sequence[str]) -> str:
        out = self._call(["sbatch", "--parsable", *argv], "sbatch").strip()
        return out.split(";")[0]

    def tasks(self, array_id: str, count: int) -> list[TaskState]:
        try:
            text = self._call(["scontrol", "show", "job", "-o", array_id], "scontrol")
        except SlurmError as exc:
            if "Invalid job id" not in exc.message:  # slurmctld busy or away: the caller retries
                raise
            text = ""  # purged after MinJobAge
        found = {t.task: t for t in parse_scontrol(text)}
        if len(found) < count:  # purged from slurmctld (MinJobAge): ask accounting, where it runs
            try:
                text = self._call(
                    ["sacct", "-n", "-P", "-X", "-j", array_id, "-o", "JobID,State,ExitCode,NodeList,Reason"],
                    "sacct",
                )
                for t in parse_sacct(text):
                    found.setdefault(t.task, t)
            except SlurmError:
                pass
        return [found.get(i, TaskState(i, f"{array_id}_{i}", "UNKNOWN", _UNKNOWN)) for i in range(count)]

    def cancel(self, array_id: str) -> None:
        self._call(["scancel", array_id], "scancel")


# ------------------------------------------------------------------------------------------ the run


@dataclass(frozen=True)
class Submitted:
    array_id: str
    chains: tuple[Chain, ...]


def resolve_image(ref_text: str, loaded: LoadedLadder) -> tuple[str, dict[str, object]]:
    """The image as the registry has it (every node pulls from there): (repository, receipt image facts).
    A tag is resolved to its manifest digest now, once; the jobs pull that digest."""
    try:
        ref = Reference.parse(ref_text)
    except ServimgError as exc:
        raise LadderRunError(
            f"--on slurm|k8s needs the image in a registry: {exc.message}",
            hint="push it (servimg build --to HOST/REPO:TAG, or servimg push); pass HOST/REPO@sha256:…",
        ) from None
    reference = str(ref.digest) if ref.digest is not None else ref.tag or "latest"
    with RegistryClient(ref.registry) as client:
        image, _ = read_image(client, ref.repository, reference, expected=ref.digest)
    repository = f"{ref.registry}/{ref.repository}"
    facts = image_facts(
        ref_text, str(image.digest), str(image.config_digest), image.labels, loaded.definition
    )
    return repository, facts


def sbatch_argv(
    name: str, results: Path, chain_count: int, options: SlurmOptions, python: str = sys.executable
) -> list[str]:
    """One array, task N = chain N; stdout/stderr per task under RESULTS/slurm/."""
    throttle = f"%{options.nodes_max}" if options.nodes_max else ""
    job = f"exec {shlex.quote(python)} -m servimg.placement.remote {shlex.quote(str(results))}"
    command = f'{job} "$SLURM_ARRAY_TASK_ID"'
    argv = [
        f"--job-name={name}",
        f"--array=0-{chain_count - 1}{throttle}",
        f"--chdir={os.getcwd()}",
        f"--output={results / 'slurm' / 'chain-%a.out'}",
        "--nodes=1",
        "--ntasks=1",
        "--export=ALL",
    ]
    if options.partition:
        argv.append(f"--partition={options.partition}")
    if options.gres:
        argv.append(f"--gres={options.gres}")
    if options.time_limit:
        argv.append(f"--time={options.time_limit}")
    return [*argv, *options.extra, f"--wrap={command}"]


def run(
    loaded: LoadedLadder,
    ref_text: str,
    config: RunConfig,
    options: SlurmOptions,
    log: Log,
    scheduler: Scheduler | None = None,
) -> Receipt:
    """Submit, wait, collect, judge; the receipt is `runner.finish`'s (the local run's) plus placement."""
    scheduler = scheduler or SlurmCli()
    started = time.monotonic()
    results = config.out.resolve()
    repository, facts = resolve_image(ref_text, loaded)
    generated = loaded.definition.model.generate and "model_dir" not in config.variables
    # the tiny model is generated from the image itself, here: the submitter's engine needs it
    config_digest = Digest.parse(jv.text(facts["config_digest"], "image.config_digest"))
    if generated and not engine.has_image(config_digest):
        log(f"pulling {repository}@{facts['digest']} to generate the tiny model")
        engine.pull_by_digest(
            repository, Digest.parse(jv.text(facts["digest"], "image.digest")), config_digest
        )
    local = replace(config, image=str(facts["config_digest"]), out=results)
    prepared = prepare(loaded, local, log, image=facts)
    planned = chains(loaded.definition)
    plan = remote.JobPlan.of(prepared, loaded, repository, config.gpus, planned)
    remote.write_plan(results, plan)
    (results / "slurm").mkdir(exist_ok=True)
    name = f"servimg-ladder-{loaded.definition.name}-{prepared.run_id}"
    array_id = scheduler.submit(sbatch_argv(name, results, len(planned), options))
    log(
        f"slurm: submitted job array {array_id}: {len(planned)} chain(s) "
        + "; ".join(f"{c.index}: {' → '.join(c.arms)}" for c in planned)
    )
    try:
        states = wait(scheduler, array_id, len(planned), options.poll_s, log)
    except KeyboardInterrupt:
        log(f"slurm: interrupted: cancelling job array {array_id}")
        scheduler.cancel(array_id)
        raise LadderRunError(
            f"interrupted: cancelled Slurm job array {array_id}", hint="nothing was judged; run again"
        ) from None
    records, unchanged, placement = collect(loaded, results, planned, states, array_id)
    return finish(loaded, results, prepared, records, unchanged, placement, time.monotonic() - started, log)


def wait(
    scheduler: Scheduler, array_id: str, count: int, poll_s: float, log: Log, retries: int = 10
) -> list[TaskState]:
    """Poll until no task is active; log the pending/running/done counts whenever they change. A failing
    query is retried (`retries` times in a row): a busy slurmctld must not end the wait early."""
    last = ""
    failures = 0
    while True:
        try:
            states = scheduler.tasks(array_id, count)
            failures = 0
        except SlurmError as exc:
            failures += 1
            if failures > retries:
                raise
            log(f"slurm: {exc.message} (retrying, {failures}/{retries})")
            time.sleep(poll_s * failures)
            continue
        phases = [t.phase for t in states]
        counts = ", ".join(f"{p} {phases.count(p)}" for p in ("pending", "running", "done"))
        line = f"slurm {array_id}: {counts}"
        detail = ", ".join(f"chain-{t.task} {t.state}{' on ' + t.node if t.node else ''}" for t in states)
        if line + detail != last:
            log(f"{line} ({detail})")
            last = line + detail
        if not any(t.active for t in states):
            return states
        time.sleep(poll_s)


@dataclass(frozen=True)
class SlurmPlacement:
    """The Slurm array job as `remote.collect` reads it: each chain's task state (sacct/scontrol)."""

    array_id: str
    states: Mapping[int, TaskState]

    def outcome(self, chain: Chain, status: Mapping[str, object]) -> remote.ChainOutcome:
        unknown = TaskState(chain.index, f"{self.array_id}_{chain.index}", "UNKNOWN")
        state = self.states.get(chain.index, unknown)
        node = state.node or status.get("node")
        return remote.ChainOutcome(
            {
                "job_id": state.job_id,
                "node": node,
                "state": state.state,
                "reason": state.reason,
                "exit_code": state.exit_code,
            },
            {"job_id": state.job_id, "node": str(node or "")},
            _failure(state, status),
            f"slurm job {state.job_id}",
        )

    def placement(self, jobs: Sequence[PlacedJob], arms: remote.ArmPlaces) -> Placement:
        return Placement("slurm", {"array_job_id": self.array_id}, tuple(jobs), arms)


def collect(
    loaded: LoadedLadder, results: Path, planned: Sequence[Chain], states: Sequence[TaskState], array_id: str
) -> tuple[list[ArmRecord], bool, Placement]:
    """Every arm's record in declared order (`remote.collect`); the arms of a job that did not complete
    carry Slurm's state and reason as their error."""
    return remote.collect(loaded, results, planned, SlurmPlacement(array_id, {t.task: t for t in states}))


def _failure(state: TaskState, status: Mapping[str, object]) -> str | None:
    """Why a job's arms cannot pass, or None when Slurm says COMPLETED and the job says done."""
    if state.state == "COMPLETED" and status.get("state") == "done":
        return None
    text = f"slurm job {state.job_id} {state.why()}"
    if status.get("error"):
        text += f": {status['error']}"
        if status.get("differences"):
            text += f" ({', '.join(jv.texts(status['differences'])[:8])})"
    elif state.state == "COMPLETED":
        text += f": the job reported {status.get('state') or 'nothing'}"
    return text
