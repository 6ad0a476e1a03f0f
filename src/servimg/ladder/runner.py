"""The ladder runner: pre-register, run the arms one at a time, judge, write the receipt (docs/design.md,
"ladder").

An arm is a server (a container of the image under test via the docker SDK, a local command, or an
existing endpoint) answering the frozen probe set greedily, one request at a time (concurrency 1, so
per-request metric deltas are attributable). Order of a run:

1. **Pre-registration**: the ladder definition, probe set, thresholds, model files and the harness's own
   source files are hashed into `preregistration.json` before the first arm starts; they are hashed again
   before every arm and at the end, and a run whose inputs changed is INVALID (verdict FAIL).
2. **Arms** in declared order. `server: fresh` starts a new container (ports on 127.0.0.1 only, GPUs via
   device requests when asked, health wait with a timeout, logs captured, the container ALWAYS removed);
   `reuse:<arm>` sends to that arm's server, still running; cache dirs are `wipe` (new, empty) or
   `retain-from:<arm>` (the same host dir, e.g. a restart over a retained disk cache). Metrics are scraped
   before and after every request. Witness files are collected from each container of an image built
   with `witness: true` (`servimg.ladder.witness`); a process that did not run the patched code fails the arm.
3. **Verdict** by `ladder_eval.evaluate` (pure), receipt by `receipt.write`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import os
import shutil
import socket
import subprocess
import tarfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from servimg.backends import engine
from servimg.backends.engine import ContainerSpec, Mount
from servimg.core import canonical
from servimg.core.atomic import atomic_write
from servimg.core.digest import Digest, sha256_hex
from servimg.core.errors import BackendError, ServimgError
from servimg.core.progress import Log
from servimg.ladder import receipt
from servimg.ladder.definition import (
    ArmSpec,
    LadderDefinition,
    LadderError,
    LoadedLadder,
    Prompt,
    as_json,
    substitute,
)
from servimg.ladder.evaluation import (
    ADAPTERS,
    ArmOutcome,
    MetricsAdapter,
    Output,
    RequestOutcome,
    Verdict,
    delta,
    evaluate,
    judge,
    parse_prometheus,
)
from servimg.ladder.tinymodel import TinyModelRecipe, ensure_model
from servimg.ladder.witness import collect, collect_dir
from servimg.oci.store import BlobStore

BUNDLE_DIR = "/opt/servimg/ladder"
WITNESS_SPEC = "/opt/servimg/witness-spec.json"
HARNESS_MODULES = (
    "ladder/runner",
    "ladder/definition",
    "ladder/readers",  # the parser the definition and probe set were read with
    "ladder/evaluation",
    "ladder/receipt",
    "ladder/tinymodel",
    "inimage/tinymodel_gen",
)
# Environment every container arm gets: no hub, no telemetry.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


class LadderRunError(ServimgError):
    """The ladder could not run (no image, a bad variable, a server that never came up …)."""


# ------------------------------------------------------------------------------------------ inputs


def harness_files() -> dict[str, str]:
    """sha256 of the harness's own source: what judged the run is part of what was pre-registered."""
    package = Path(__file__).resolve().parents[1]
    return {f"servimg/{m}.py": sha256_hex((package / f"{m}.py").read_bytes()) for m in HARNESS_MODULES}


def tree_hashes(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): sha256_hex(p.read_bytes())
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


@dataclass(frozen=True)
class Inputs:
    """Everything pre-registered; `sha256` is over the canonical JSON of `as_json()`."""

    ladder_path: str
    ladder_sha256: str
    probes_path: str
    probes_sha256: str
    thresholds_sha256: str
    harness: Mapping[str, str]
    variables: Mapping[str, str]
    model_files: Mapping[str, str]

    def as_json(self) -> dict[str, Any]:
        return {
            "ladder": {"path": self.ladder_path, "sha256": self.ladder_sha256},
            "probes": {"path": self.probes_path, "sha256": self.probes_sha256},
            "thresholds_sha256": self.thresholds_sha256,
            "harness": dict(self.harness),
            "vars": dict(self.variables),
            "model_files": dict(self.model_files),
        }

    @property
    def sha256(self) -> str:
        return sha256_hex(canonical.dumps(self.as_json()))


def capture_inputs(loaded: LoadedLadder, variables: Mapping[str, str], model_dir: Path | None) -> Inputs:
    """Hash the inputs from disk (so a later call sees edits made while the run was going)."""
    return Inputs(
        str(loaded.ladder_path),
        sha256_hex(loaded.ladder_path.read_bytes()),
        str(loaded.probes_path),
        sha256_hex(loaded.probes_path.read_bytes()),
        loaded.definition.thresholds_sha256,
        harness_files(),
        dict(sorted(variables.items())),
        tree_hashes(model_dir) if model_dir is not None else {},
    )


# ------------------------------------------------------------------------------------------ servers


@dataclass
class Server:
    """A running server an arm talks to; `stop()` captures the logs and removes what was started."""

    url: str
    kind: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    facts: dict[str, Any] = field(default_factory=dict)
    container: engine.Container | None = None
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    witness: bool = False
    overlay_modules: tuple[str, ...] = ()  # from the image's witness spec
    witness_dir: Path | None = None  # a local server's SERVIMG_WITNESS_DIR (inside the image under test)

    def stop(self) -> None:
        if self.container is not None:
            try:
                self.container.stop(timeout=10)
                with contextlib.suppress(Exception):
                    self.facts["exit_code"] = self.container.exit_code()
                with contextlib.suppress(Exception):
                    logs = self.container.logs()
                    if self.log_path is not None:
                        self.log_path.write_bytes(logs)
                    self.facts["logs_sha256"] = sha256_hex(logs)
            finally:
                self.container.remove()
                self.container = None
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.facts["exit_code"] = self.process.returncode
            self.process = None


def wait_healthy(server: Server, health_path: str, timeout_s: float, log: Log) -> float:
    """Seconds until GET <health_path> answered 200; raise with the log tail if the server died or hung."""
    started = time.monotonic()
    last = started
    while time.monotonic() - started < timeout_s:
        if server.container is not None and server.container.status() in ("exited", "dead"):
            tail = server.container.logs(tail=25).decode("utf-8", "replace").strip().splitlines()
            raise LadderRunError("the server exited before it was healthy", problems=tail)
        if server.process is not None and server.process.poll() is not None:
            raise LadderRunError(
                f"the server process exited ({server.process.returncode}) before it was healthy"
            )
        with contextlib.suppress(requests.RequestException):
            if requests.get(server.url + health_path, timeout=2).status_code == 200:
                return time.monotonic() - started
        if time.monotonic() - last > 30:
            log(f"  … waiting for {server.url}{health_path} ({time.monotonic() - started:.0f}s)")
            last = time.monotonic()
        time.sleep(1)
    last_lines: list[str] = []
    if server.container is not None:
        last_lines = server.container.logs(tail=25).decode("utf-8", "replace").strip().splitlines()
    raise LadderRunError(f"the server was not healthy within {timeout_s:.0f}s", problems=last_lines)


# ------------------------------------------------------------------------------------------ requests


def metrics_text(url: str) -> str:
    try:
        response = requests.get(url + "/metrics", timeout=10)
        return response.text if response.status_code == 200 else ""
    except requests.RequestException:
        return ""


def complete(url: str, model: str, prompt: Prompt, ladder: LadderDefinition, timeout_s: float) -> Output:
    s = ladder.sampling
    frozen = ladder.probe_tokens == "frozen"
    body = {
        "model": model,
        "prompt": list(prompt.token_ids) if frozen else prompt.text,
        "max_tokens": s.max_tokens,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "seed": s.seed,
        "logprobs": s.logprobs,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
    }
    response = requests.post(url + "/v1/completions", json=body, timeout=timeout_s)
    if response.status_code != 200:
        raise LadderRunError(f"HTTP {response.status_code}: {response.text[:300]}")
    return parse_completion(response.json())


def parse_completion(doc: Mapping[str, Any]) -> Output:
    choice = (doc.get("choices") or [{}])[0]
    logprobs = choice.get("logprobs") or {}
    token_ids = choice.get("token_ids")
    if token_ids is None:  # servers without return_token_ids: tokens as "token_id:N"
        token_ids = [int(str(t).rpartition(":")[2]) for t in logprobs.get("tokens") or []]
    values = [float(v) if v is not None else float("nan") for v in logprobs.get("token_logprobs") or []]
    prompt_ids = tuple(int(t) for t in choice.get("prompt_token_ids") or ())
    return Output(
        str(choice.get("text") or ""),
        tuple(int(t) for t in token_ids),
        tuple(values),
        choice.get("finish_reason"),
        prompt_ids,
    )


def tokenization_check(url: str, model: str, prompts: Sequence[Prompt]) -> dict[str, Any]:
    """Does the server's tokenizer turn each prompt's text into its token ids? (the ids are what is sent)"""
    mismatched, errors = [], []
    for prompt in prompts:
        try:
            r = requests.post(
                url + "/tokenize",
                json={"model": model, "prompt": prompt.text, "add_special_tokens": False},
                timeout=30,
            )
            if r.status_code != 200:
                errors.append(f"{prompt.id}: HTTP {r.status_code}")
            elif tuple(r.json().get("tokens") or ()) != prompt.token_ids:
                mismatched.append(prompt.id)
        except requests.RequestException as exc:
            errors.append(f"{prompt.id}: {exc}")
    return {"checked": len(prompts), "mismatched": mismatched, "errors": errors[:5]}


# ------------------------------------------------------------------------------------------ the run


@dataclass(frozen=True)
class RunConfig:
    image: str | None  # an engine ref/ID; None with `endpoint`
    out: Path
    variables: Mapping[str, str] = field(default_factory=dict)
    gpus: str | None = None
    endpoint: str | None = None  # every arm against this URL (no servers started)
    command: bool = False  # arms as local commands (server.command on the host) instead of containers
    # with `command`: realise each mount as a symlink TARGET -> SOURCE (inside the container under test,
    # e.g. a Kubernetes pod, where no engine can mount; `remote --in-container`)
    link_mounts: bool = False
    # with `link_mounts`: the image's witness spec, here (its serving processes record beside the results)
    witness_spec: Path = Path(WITNESS_SPEC)
    store: BlobStore | None = None


@dataclass
class ArmRecord:
    """One arm as the harness saw it: its outcome (judged later) and the facts for the receipt."""

    spec: ArmSpec
    outcome: ArmOutcome
    facts: dict[str, Any]


class _Clock:
    """Harness time (everything but waiting for a server and for its answers) per arm."""

    def __init__(self) -> None:
        self.server_s = 0.0
        self.requests_s = 0.0


@dataclass(frozen=True)
class Prepared:
    """What is fixed before the first arm: the image, the run variables and the pre-registration."""

    run_id: str
    started_at: str
    image: Mapping[str, Any]
    variables: Mapping[str, str]
    model_dir: Path | None
    inputs: Inputs
    prereg: Mapping[str, Any]
    deviations: tuple[str, ...]


def prepare(
    loaded: LoadedLadder, config: RunConfig, log: Log, image: Mapping[str, Any] | None = None
) -> Prepared:
    """Image facts, variables (the tiny model generated when asked), and `preregistration.json` in `out`."""
    ladder = loaded.definition
    config.out.mkdir(parents=True, exist_ok=True)
    run_id = uuid.uuid4().hex[:12]
    started_at = _now()
    facts = dict(image) if image is not None else _image_facts(config, ladder)
    deviations = tuple(facts.pop("deviations", []))
    variables, model_dir = _variables(loaded, config, log)
    pre = capture_inputs(loaded, variables, model_dir)
    prereg = {"run_id": run_id, "registered_at": started_at, "inputs": pre.as_json(), "sha256": pre.sha256}
    atomic_write(config.out / "preregistration.json", canonical.dumps_pretty(prereg), 0o644)
    log(f"ladder {ladder.name}: pre-registered inputs sha256 {pre.sha256[:16]}… ({len(ladder.arms)} arms)")
    return Prepared(run_id, started_at, facts, variables, model_dir, pre, prereg, deviations)


def run(loaded: LoadedLadder, config: RunConfig, log: Log) -> dict[str, Any]:
    """Run the ladder; write `receipt.json` + `receipt.svg` into `config.out`; return the sealed receipt."""
    run_started = time.monotonic()
    prepared = prepare(loaded, config, log)
    arm_ids = [a.id for a in loaded.definition.arms]
    records, unchanged = run_arms(loaded, arm_ids, config, prepared, prepared.run_id, log)
    placement = {"scheduler": "local", "host": socket.gethostname()}
    return finish(
        loaded, config.out, prepared, records, unchanged, placement, time.monotonic() - run_started, log
    )


def run_arms(
    loaded: LoadedLadder,
    arm_ids: Sequence[str],
    config: RunConfig,
    prepared: Prepared,
    container_run_id: str,
    log: Log,
    on_record: Callable[[ArmRecord], None] = lambda record: None,
) -> tuple[list[ArmRecord], bool]:
    """Run `arm_ids` (in declared order; a chain of the ladder or all of it) with the pre-registered
    inputs re-hashed before each arm. Returns the records and whether the inputs stayed unchanged.
    `container_run_id` labels the containers started (a Slurm job removes only its own)."""
    ladder = loaded.definition
    (config.out / "logs").mkdir(parents=True, exist_ok=True)
    adapter = ADAPTERS[ladder.engine]
    variables, model_dir, pre = prepared.variables, prepared.model_dir, prepared.inputs
    arms = [(i, a) for i, a in enumerate(ladder.arms) if a.id in set(arm_ids)]
    servers: dict[str, Server] = {}
    caches: dict[tuple[str, str], Path] = {}
    records: list[ArmRecord] = []
    unchanged = True
    last_use = {ladder.server_arm(a).id: i for i, a in arms}
    try:
        for index, arm in arms:
            if capture_inputs(loaded, variables, model_dir).sha256 != pre.sha256:
                unchanged = False
                log(f"ladder {ladder.name}: inputs changed before arm {arm.id}: the run is INVALID")
                break
            record = _run_arm(
                loaded, arm, index, config, variables, adapter, servers, caches, container_run_id, log
            )
            records.append(record)
            for owner, server in list(servers.items()):
                if last_use.get(owner, -1) <= index:
                    server.stop()
                    _merge_stop_facts(records, owner, server)
                    del servers[owner]
            on_record(record)
    finally:
        for owner, server in servers.items():
            server.stop()
            _merge_stop_facts(records, owner, server)
        if config.image is not None and config.endpoint is None and not config.command:
            _remove_run_containers(container_run_id)
    if capture_inputs(loaded, variables, model_dir).sha256 != pre.sha256:
        unchanged = False
    return records, unchanged


def finish(
    loaded: LoadedLadder,
    out: Path,
    prepared: Prepared,
    records: Sequence[ArmRecord],
    unchanged: bool,
    placement: Mapping[str, Any],
    wall_s: float,
    log: Log,
) -> dict[str, Any]:
    """Judge the records (pure), write the sealed receipt + plot into `out`, return the receipt."""
    ladder = loaded.definition
    deviations = list(prepared.deviations)
    for record in records:
        deviations += record.facts.pop("deviations", [])
    deviations += _prompt_consistency(records)
    verdict = evaluate(
        ladder, [r.outcome for r in records], inputs_unchanged=unchanged, deviations=deviations
    )
    doc = build_receipt(
        loaded,
        prepared.image,
        prepared.inputs,
        prepared.prereg,
        records,
        verdict,
        prepared.started_at,
        prepared.run_id,
    )
    doc["timing"]["run_wall_s"] = round(wall_s, 3)
    doc["placement"] = dict(placement)
    receipt.write(out, doc)
    sealed = receipt.load(out / "receipt.json")
    log(f"ladder {ladder.name}: {verdict.result} — {out / 'receipt.json'} (sha256 {sealed['sha256'][:16]}…)")
    return sealed


def _prompt_consistency(records: Sequence[ArmRecord]) -> list[str]:
    """Every arm must have sent the same prompt tokens (text probes are tokenized by each server)."""
    seen: dict[str, tuple[str, str]] = {}
    out = []
    for record in records:
        for prompt_id, facts in (record.facts.get("request_facts") or {}).items():
            digest = str(facts.get("prompt_token_ids_sha256"))
            first = seen.setdefault(prompt_id, (record.spec.id, digest))
            if first[1] != digest:
                out.append(f"{prompt_id}: arm {record.spec.id} sent other prompt tokens than arm {first[0]}")
    return out


def _merge_stop_facts(records: Sequence[ArmRecord], owner: str, server: Server) -> None:
    for record in records:
        if record.spec.id == owner:
            record.facts.setdefault("server", {}).update(
                {k: server.facts[k] for k in ("exit_code", "logs_sha256") if k in server.facts}
            )


def _run_arm(
    loaded: LoadedLadder,
    arm: ArmSpec,
    index: int,
    config: RunConfig,
    variables: Mapping[str, str],
    adapter: MetricsAdapter,
    servers: dict[str, Server],
    caches: dict[tuple[str, str], Path],
    run_id: str,
    log: Log,
) -> ArmRecord:
    ladder = loaded.definition
    arm_started = time.monotonic()
    clock = _Clock()
    facts: dict[str, Any] = {"deviations": []}
    prefix = f"[{index + 1}/{len(ladder.arms)} {arm.id}]"
    log(f"{prefix} role {arm.role}, server {arm.server}")
    error: str | None = None
    requests_out: list[RequestOutcome] = []
    metric_names = [g.metric for a in ladder.arms for g in a.exercise]
    before: dict[str, float | None] = {}
    after: dict[str, float | None] = {}
    server: Server | None = None
    try:
        owner = ladder.server_arm(arm)
        if arm.reuses is None:
            t0 = time.monotonic()
            server = _start(loaded, arm, config, variables, caches, run_id, facts, log)
            servers[arm.id] = server
            startup = wait_healthy(server, ladder.server.health_path, ladder.server.startup_timeout_s, log)
            clock.server_s += time.monotonic() - t0
            server.facts["healthy_after_s"] = round(startup, 3)
            server.facts["info"] = _server_info(server.url)
            log(f"{prefix} server healthy after {startup:.1f}s ({server.facts['info'].get('version')})")
        elif owner.id in servers:
            server = servers[owner.id]
        else:
            raise LadderRunError(f"arm {owner.id}'s server is not running (it failed to start, or stopped)")
        facts["server"] = {
            "kind": server.kind,
            "owner_arm": owner.id,
            "argv": list(server.argv),
            "env": dict(sorted(server.env.items())),
            **server.facts,
        }
        for step in arm.pre_steps:
            facts.setdefault("pre_steps", []).append(_pre_step(server.url, step))
        if index == 0 and ladder.probe_tokens == "frozen":
            facts["tokenization_check"] = tokenization_check(
                server.url, ladder.model.served_name, [p for _, p in loaded.probes.prompts]
            )
            if facts["tokenization_check"]["mismatched"] or facts["tokenization_check"]["errors"]:
                facts["deviations"].append(f"tokenization check: {facts['tokenization_check']}")
        before = adapter.snapshot(parse_prometheus(metrics_text(server.url)), metric_names)
        prompts = loaded.probes.prompts
        for number, (family, prompt) in enumerate(prompts, 1):
            m0 = adapter.snapshot(parse_prometheus(metrics_text(server.url)), metric_names)
            t0 = time.monotonic()
            output, req_error = None, None
            try:
                output = complete(
                    server.url, ladder.model.served_name, prompt, ladder, ladder.server.request_timeout_s
                )
            except (LadderRunError, requests.RequestException, ValueError) as exc:
                req_error = str(exc)
            seconds = time.monotonic() - t0
            clock.requests_s += seconds
            m1 = adapter.snapshot(parse_prometheus(metrics_text(server.url)), metric_names)
            judgement = judge(output, prompt.expect, ladder.thresholds.detectors, req_error)
            requests_out.append(RequestOutcome(prompt.id, family.id, output, judgement, req_error))
            per = {k: v for k, v in delta(m0, m1).items() if v}
            request_facts: dict[str, Any] = {"seconds": round(seconds, 4), "metrics_delta": per}
            sent = (
                output.prompt_token_ids
                if output is not None and output.prompt_token_ids
                else prompt.token_ids
            )
            request_facts["prompt_tokens"] = len(sent)
            request_facts["prompt_token_ids_sha256"] = sha256_hex(json.dumps(list(sent)).encode())
            facts.setdefault("request_facts", {})[prompt.id] = request_facts
            status = "ok" if judgement.ok else "CORRUPTED " + "; ".join(judgement.reasons)[:120]
            hits = per.get("prefix_cache_hits")
            log(
                f"{prefix} {number}/{len(prompts)} {prompt.id}: {status} ({seconds:.2f}s hits +{hits or 0:g})"
            )
        after = adapter.snapshot(parse_prometheus(metrics_text(server.url)), metric_names)
        if not metrics_text(server.url):
            facts["deviations"].append(
                f"{arm.id}: the server exports no /metrics: exercise gates cannot be met"
            )
    except (ServimgError, requests.RequestException, KeyError) as exc:
        error = str(exc) if not isinstance(exc, ServimgError) else exc.message
        if isinstance(exc, ServimgError) and exc.problems:
            facts["error_detail"] = list(exc.problems)[-25:]
        log(f"{prefix} ERROR: {error}")
    witness_problems: tuple[str, ...] | None = None
    modules: tuple[str, ...] | None = None
    expected: tuple[str, ...] = ()
    if server is not None and server.witness and (server.container or server.witness_dir) is not None:
        witness_problems, facts["witness"] = _collect_witness(server, config.out / "witness" / arm.id, log)
        modules = tuple(sorted({str(r["module"]) for r in facts["witness"].get("records") or []}))
        # Of the modules the arm reaches, only those the image overlays leave witness records.
        reached = arm.witness_modules if arm.witness_modules is not None else server.overlay_modules
        expected = tuple(m for m in reached if m in server.overlay_modules)
        facts["witness"].update(loaded_modules=list(modules), expected_modules=list(expected))
    facts["metrics"] = {"before": before, "after": after}
    wall = time.monotonic() - arm_started
    facts["timing"] = {
        "wall_s": round(wall, 3),
        "server_start_s": round(clock.server_s, 3),
        "requests_s": round(clock.requests_s, 3),
        "harness_s": round(max(wall - clock.server_s - clock.requests_s, 0.0), 3),
    }
    outcome = ArmOutcome(
        arm.id,
        arm.role,
        tuple(requests_out),
        delta(before, after),
        error,
        witness_problems,
        modules,
        expected,
    )
    return ArmRecord(arm, outcome, facts)


def _start(
    loaded: LoadedLadder,
    arm: ArmSpec,
    config: RunConfig,
    variables: Mapping[str, str],
    caches: dict[tuple[str, str], Path],
    run_id: str,
    facts: dict[str, Any],
    log: Log,
) -> Server:
    ladder = loaded.definition
    spec = ladder.server
    args = [substitute(a, variables) for a in (*spec.args, *arm.args)]
    env = {**OFFLINE_ENV, **{k: substitute(v, variables) for k, v in {**spec.env, **arm.env}.items()}}
    mounts: dict[str, Mount] = {}  # by host path: a later mount of one path replaces an earlier one
    for mount in spec.mounts:
        source = str(Path(substitute(mount.source, variables)).resolve())
        mounts[source] = Mount(source, mount.target, mount.read_only)
    cache_facts = {}
    for name, mode in sorted(arm.caches.items()):
        cache = ladder.caches[name]
        if mode == "wipe":
            path = config.out / "caches" / f"{arm.id}-{name}"
            if path.exists():
                shutil.rmtree(path)
            path.mkdir(parents=True)
        else:
            path = caches[(mode.removeprefix("retain-from:"), name)]
        caches[(arm.id, name)] = path
        files = [p for p in path.rglob("*") if p.is_file()]
        cache_facts[name] = {
            "mode": mode,
            "host": str(path),
            "target": cache.target,
            "files_at_start": len(files),
            "bytes_at_start": sum(p.stat().st_size for p in files),
        }
        mounts[str(path.resolve())] = Mount(str(path.resolve()), cache.target)
        env.update({k: substitute(v, variables) for k, v in cache.env.items()})
    facts["caches"] = cache_facts
    argv = (*spec.command, *args)
    if config.endpoint is not None:
        facts["deviations"].append(
            f"{arm.id}: endpoint mode: no fresh server; args, env and caches not applied"
        )
        return Server(config.endpoint.rstrip("/"), "endpoint", argv, env)
    if config.command:
        log_path = config.out / "logs" / f"{arm.id}.log"
        port = spec.port
        witness_dir = None
        if config.link_mounts:  # inside the image under test: mounts and its witness as a container has them
            for bound in mounts.values():
                link_mount(bound)
            if config.witness_spec.is_file():
                witness_dir = config.out / "witness-raw" / arm.id
                shutil.rmtree(witness_dir, ignore_errors=True)
                witness_dir.mkdir(parents=True)
                env["SERVIMG_WITNESS_DIR"] = str(witness_dir)
        elif mounts:
            facts["deviations"].append(f"{arm.id}: local command: mounts not applied ({', '.join(mounts)})")
        base = image_env(os.environ) if config.link_mounts else dict(os.environ)
        with log_path.open("wb") as fh:
            process = subprocess.Popen(list(argv), env={**base, **env}, stdout=fh, stderr=subprocess.STDOUT)
        server = Server(f"http://127.0.0.1:{port}", "command", argv, env, process=process, log_path=log_path)
        if witness_dir is not None:
            server.witness, server.witness_dir = True, witness_dir
            server.overlay_modules = spec_modules(json.loads(config.witness_spec.read_bytes()))
        return server
    assert config.image is not None
    container = engine.start(
        ContainerSpec(
            config.image,
            args,
            entrypoint=spec.command,
            env=env,
            mounts=tuple(mounts.values()),
            network=True,
            ports=(spec.port,),
            shm_size=spec.shm_size,
            gpus=config.gpus,
            labels={
                "io.servimg.ladder": ladder.name,
                "io.servimg.ladder.run": run_id,
                "io.servimg.ladder.arm": arm.id,
            },
            name=f"servimg-ladder-{run_id}-{arm.id}",
        )
    )
    server = Server(
        "", "docker", argv, env, container=container, log_path=config.out / "logs" / f"{arm.id}.log"
    )
    try:
        published = container.host_port(spec.port, timeout=30)
        if published is None:
            raise LadderRunError(f"the container never published port {spec.port}")
        port = published
        server.url = f"http://127.0.0.1:{port}"
        server.facts.update(
            {
                "container": container.id[:12],
                "image": container.image_id,
                "port": port,
                "gpus": config.gpus,
                "shm_size": spec.shm_size,
                "mounts": {k: f"{m.target}:{m.mode}" for k, m in sorted(mounts.items())},
            }
        )
        spec_tar = container.archive(WITNESS_SPEC)
        server.witness = spec_tar is not None
        server.overlay_modules = overlay_modules(spec_tar) if spec_tar is not None else ()
        log(f"  started container {container.id[:12]} on 127.0.0.1:{port}")
    except BaseException:
        server.stop()
        raise
    return server


# What a Kubernetes Job adds to the image's environment for the harness (`servimg.ladder.k8s`): not for
# the servers, which get the environment a container of the image would.
HARNESS_ENV = ("PYTHONDONTWRITEBYTECODE", "SERVIMG_JOB_ID", "SERVIMG_NODE")


def image_env(environ: Mapping[str, str]) -> dict[str, str]:
    """This process's environment without what was added for the harness: its variables, and its own
    directory on PYTHONPATH (the servers must not import servimg's copy of the docker SDK)."""
    harness = str(Path(__file__).resolve().parents[2])
    out = {k: v for k, v in environ.items() if k not in HARNESS_ENV}
    path = [p for p in out.pop("PYTHONPATH", "").split(os.pathsep) if p and str(Path(p).resolve()) != harness]
    if path:
        out["PYTHONPATH"] = os.pathsep.join(path)
    return out


def link_mount(mount: Mount) -> None:
    """Make `mount.target` a symlink to `mount.source` (what a bind mount does for a container, done from
    inside one). An earlier link is replaced (a restart arm over a retained cache points it again); a real
    file or a non-empty directory there is refused: it would be shadowed, not mounted over."""
    target = Path(mount.target)
    if target.is_symlink():
        target.unlink()
    elif target.is_dir() and not any(target.iterdir()):
        target.rmdir()
    elif target.exists():
        raise LadderRunError(
            f"cannot mount {mount.source} at {mount.target} inside this container: something is there",
            hint="the image under test must not ship files at a ladder mount or cache target",
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    target.symlink_to(mount.source, target_is_directory=True)


def overlay_modules(spec_tar: bytes) -> tuple[str, ...]:
    """The overlay modules a witness spec (as `docker cp` streams it) lists."""
    with tarfile.open(fileobj=io.BytesIO(spec_tar)) as tar:
        for member in tar.getmembers():
            handle = tar.extractfile(member) if member.isfile() else None
            if handle is not None:
                return spec_modules(json.loads(handle.read()))
    return ()


def spec_modules(spec: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(sorted({str(m["module"]) for m in spec.get("modules") or []}))


def _remove_run_containers(run_id: str) -> None:
    """Belt and braces: remove any container of this run still there (e.g. created just before Ctrl-C)."""
    engine.remove_labelled(f"io.servimg.ladder.run={run_id}")


def _collect_witness(server: Server, out: Path, log: Log) -> tuple[tuple[str, ...], dict[str, Any]]:
    """Witness records of the serving processes (`witness.collect`); none recorded is a problem."""
    try:
        if server.container is not None:
            result = collect(server.container.id, out)
        else:
            assert server.witness_dir is not None
            result = collect_dir(server.witness_dir, out)
    except ServimgError as exc:
        return (f"witness files could not be collected: {exc.message}",), {"error": exc.message}
    problems = list(result.problems())
    if not result.records() and server.overlay_modules:  # an image without overlays has none to record
        problems.append("no serving process recorded loading an overlay module")
    log(f"  witness: {len(result.records())} record(s), {len(problems)} problem(s)")
    return tuple(problems), result.as_dict()


def _pre_step(url: str, step: str) -> dict[str, Any]:
    if step == "reset_prefix_cache":
        r = requests.post(url + "/reset_prefix_cache", timeout=60)
        if r.status_code != 200:
            raise LadderRunError(
                f"reset_prefix_cache: HTTP {r.status_code}",
                hint="vLLM serves it only with VLLM_SERVER_DEV_MODE=1 in the server env",
            )
        return {"step": step, "status": r.status_code}
    raise LadderRunError(f"unknown pre-step {step}")


def _server_info(url: str) -> dict[str, Any]:
    info: dict[str, Any] = {}
    with contextlib.suppress(requests.RequestException, ValueError):
        info["version"] = requests.get(url + "/version", timeout=10).json().get("version")
    with contextlib.suppress(requests.RequestException, ValueError):
        info["models"] = [
            m.get("id") for m in requests.get(url + "/v1/models", timeout=10).json().get("data", [])
        ]
    return info


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ------------------------------------------------------------------------------------------ image, vars


def _image_facts(config: RunConfig, ladder: LadderDefinition) -> dict[str, Any]:
    """The image under test: config digest (engine image ID), manifest digest when known, servimg labels."""
    if config.image is None:
        return {"ref": None, "digest": None, "config_digest": None, "deviations": ["no image: endpoint mode"]}
    try:
        attrs = engine.inspect(config.image)
    except BackendError as exc:
        raise LadderRunError(exc.message, hint="build or pull it") from None
    config_digest = str(attrs["Id"])
    manifest: str | None = None
    if config.store is not None:
        cached = engine.cached(Digest.parse(config_digest), config.store)
        manifest = str(cached.digest) if cached is not None else None
    for repo_digest in attrs.get("RepoDigests") or []:
        manifest = manifest or repo_digest.rpartition("@")[2]
    labels = (attrs.get("Config") or {}).get("Labels") or {}
    return image_facts(config.image, manifest, config_digest, labels, ladder)


def image_facts(
    ref: str, manifest: str | None, config_digest: str, labels: Mapping[str, str], ladder: LadderDefinition
) -> dict[str, Any]:
    """The receipt's `image`: ref, manifest and config digests, servimg/OCI labels; checked against the
    digest the ladder names (wherever the image was resolved: the engine, or a registry)."""
    facts: dict[str, Any] = {
        "ref": ref,
        "digest": manifest,
        "config_digest": config_digest,
        "labels": {
            k: v for k, v in sorted(labels.items()) if k.startswith(("io.servimg", "org.opencontainers"))
        },
        "deviations": [],
    }
    if manifest is None:
        facts["deviations"].append(
            "the image's manifest digest is unknown here (engine image); config digest used"
        )
    if ladder.image is not None:
        facts["expected_digest"] = ladder.image.digest
        if ladder.image.digest not in (manifest, config_digest):
            raise LadderRunError(
                f"the ladder is about {ladder.image.digest}, the image {ref} is {manifest or config_digest}",
                hint="run the ladder against the image it names, or update image.digest in the ladder",
            )
    return facts


def _variables(loaded: LoadedLadder, config: RunConfig, log: Log) -> tuple[dict[str, str], Path | None]:
    """Run variables; `model_dir` is generated (tiny copy model in the image) when the ladder says so."""
    variables = dict(config.variables)
    ladder = loaded.definition
    unknown = sorted(set(variables) - set(ladder.vars))
    if unknown:
        raise LadderRunError(
            f"unknown --var {', '.join(unknown)}", hint=f"the ladder declares {sorted(ladder.vars)}"
        )
    model_dir: Path | None = None
    if ladder.model.generate == "tiny-copy" and "model_dir" in ladder.vars and "model_dir" not in variables:
        if config.image is None:
            raise LadderRunError("the tiny model is generated inside the image: pass --var model_dir=DIR")
        model_dir = ensure_model(TinyModelRecipe(), config.image, config.store or BlobStore(), log)
        variables["model_dir"] = str(model_dir)
    elif "model_dir" in variables:
        model_dir = Path(variables["model_dir"])
    missing = sorted(set(ladder.vars) - set(variables))
    if missing and config.endpoint is None:
        raise LadderRunError(
            f"no value for {', '.join(missing)}", hint=" ".join(f"--var {m}=…" for m in missing)
        )
    return variables, model_dir


# ------------------------------------------------------------------------------------------ receipt


def build_receipt(
    loaded: LoadedLadder,
    image: Mapping[str, Any],
    inputs: Inputs,
    prereg: Mapping[str, Any],
    records: Sequence[ArmRecord],
    verdict: Verdict,
    started_at: str,
    run_id: str,
) -> dict[str, Any]:
    ladder = loaded.definition
    by_arm = {a.arm: a for a in verdict.arms}
    arms = []
    for record in records:
        v = by_arm[record.spec.id]
        facts = dict(record.facts)
        request_facts = facts.pop("request_facts", {})
        requests_json = []
        for r in record.outcome.requests:
            extra = request_facts.get(r.prompt_id, {})
            requests_json.append(
                {
                    "prompt_id": r.prompt_id,
                    "family": r.family_id,
                    "ok": r.judgement.ok,
                    "reasons": list(r.judgement.reasons),
                    "expected_ok": r.judgement.expected_ok,
                    "error": r.error,
                    "output": None
                    if r.output is None
                    else {
                        "text": r.output.text,
                        "token_ids": list(r.output.token_ids),
                        "logprobs": [round(x, 6) for x in r.output.logprobs],
                        "finish_reason": r.output.finish_reason,
                    },
                    "detectors": {d.name: d.value for d in r.judgement.detectors},
                    **extra,
                }
            )
        comparison = None
        if v.comparison is not None:
            c = v.comparison
            comparison = {
                "baseline": c.baseline,
                "compared": c.compared,
                "divergent": c.divergent,
                "forward_flips": c.forward_flips,
                "reverse_flips": c.reverse_flips,
                "max_logprob_delta": c.max_logprob_delta,
                "requests": [
                    {
                        "prompt_id": r.prompt_id,
                        "divergent": r.divergent,
                        "first_divergence": r.first_divergence,
                        "flip": r.flip,
                        "max_logprob_delta": r.max_logprob_delta,
                    }
                    for r in c.requests
                ],
            }
        arms.append(
            {
                "id": record.spec.id,
                "role": record.spec.role,
                "verdict": v.result,
                "reasons": list(v.reasons),
                "error": record.outcome.error,
                "spec": as_json(record.spec),
                "corrupted": v.corrupted,
                "metrics_delta": dict(record.outcome.metrics_delta),
                "gates": [
                    {"metric": g.metric, "op": g.op, "value": g.value, "observed": g.observed, "ok": g.ok}
                    for g in v.gates
                ],
                "comparison": comparison,
                "requests": requests_json,
                **facts,
            }
        )
    timings = [a["timing"] for a in arms if "timing" in a]
    wall = sum(t["wall_s"] for t in timings)
    harness = sum(t["harness_s"] for t in timings)
    return {
        "receipt_version": receipt.RECEIPT_VERSION,
        "run_id": run_id,
        "ladder": {
            "name": ladder.name,
            "engine": ladder.engine,
            "sha256": inputs.ladder_sha256,
            "thresholds": as_json(ladder.thresholds),
            "sampling": as_json(ladder.sampling),
        },
        "image": dict(image),
        "inputs": inputs.as_json(),
        "preregistration": {"sha256": prereg["sha256"], "registered_at": prereg["registered_at"]},
        "valid": verdict.valid,
        "verdict": verdict.result,
        "verdict_reasons": list(verdict.reasons),
        "deviations": list(verdict.deviations),
        "noise_floor": {
            "measured": verdict.noise.measured,
            "divergent": verdict.noise.divergent,
            "max_logprob_delta": verdict.noise.max_logprob_delta,
        },
        "gates": [{"arm": a["id"], **g} for a in arms for g in a["gates"]],
        "arms": arms,
        "timing": {
            "arms_wall_s": round(wall, 3),
            "harness_s": round(harness, 3),
            "harness_fraction": round(harness / wall, 4) if wall else None,
        },
        "started_at": started_at,
        "finished_at": _now(),
    }


# ------------------------------------------------------------------------------------------ bundled


def bundled_ladder(image: str, dest: Path) -> Path:
    """Copy the image's bundled ladder (`/opt/servimg/ladder/`) into `dest`; return the ladder YAML path."""
    hint = "build it from a definition with `ladder:`, or pass --ladder"
    try:
        data = engine.copy_out(image, BUNDLE_DIR)
    except BackendError as exc:
        raise LadderError(f"{image}: {exc.message}", hint=hint) from None
    if data is None:
        raise LadderError(f"{image} carries no ladder under {BUNDLE_DIR}", hint=hint)
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar.getmembers():
            name = Path(member.name).name
            if member.isfile() and name.endswith((".yaml", ".json")):
                handle = tar.extractfile(member)
                if handle is not None:
                    (dest / name).write_bytes(handle.read())
    found = sorted(dest.glob("*.yaml"))
    if len(found) != 1:
        raise LadderError(f"{image}: expected one ladder YAML under {BUNDLE_DIR}, found {len(found)}")
    return found[0]


@contextlib.contextmanager
def _noop() -> Iterator[None]:
    yield


def summary(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The CLI's one-line result: verdict, reasons, per-arm verdicts, receipt hash."""
    return {
        "verdict": doc["verdict"],
        "valid": doc["valid"],
        "reasons": doc["verdict_reasons"][:10],
        "arms": {a["id"]: a["verdict"] for a in doc["arms"]},
        "receipt_sha256": doc["sha256"],
        "harness_fraction": doc["timing"]["harness_fraction"],
        "image": doc["image"].get("config_digest"),
    }


def to_json(doc: Mapping[str, Any]) -> str:
    return json.dumps(doc, indent=1, sort_keys=True)
