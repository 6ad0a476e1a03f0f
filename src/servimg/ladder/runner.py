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

This module orchestrates; the parts are their own modules: `ladder.prereg` (the inputs hashed),
`ladder.server` (servers from start to removal), `ladder.vllm` (the server's HTTP API) and
`ladder.receipt` (the arm records assembled into the receipt, sealed, read back).
"""

from __future__ import annotations

import dataclasses
import io
import json
import socket
import tarfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import requests

from servimg.backends import engine
from servimg.core import canonical
from servimg.core import jsonview as jv
from servimg.core.atomic import atomic_write
from servimg.core.context import Log
from servimg.core.digest import Digest, sha256_hex
from servimg.core.errors import BackendError, LadderError, LadderRunError, ServimgError
from servimg.ladder import receipt, vllm
from servimg.ladder.definition import ArmSpec, LadderDefinition
from servimg.ladder.evaluation import (
    ADAPTERS,
    ArmOutcome,
    MetricsAdapter,
    RequestOutcome,
    delta,
    evaluate,
    judge,
    parse_prometheus,
)
from servimg.ladder.loading import LoadedLadder
from servimg.ladder.prereg import Inputs, capture_inputs, now
from servimg.ladder.probeset import send_keys
from servimg.ladder.receipt import ArmRecord, Placement, Receipt, build_receipt
from servimg.ladder.server import (
    RunConfig,
    Server,
    collect_witness,
    cpu_permission_answers,
    deviate,
    fact_list,
    fact_map,
    instrument_metrics,
    instrument_requests,
    remove_run_containers,
    start_server,
    wait_healthy,
)
from servimg.ladder.tinymodel import GENERATED, ensure_model
from servimg.oci.store import BlobStore

BUNDLE_DIR = "/opt/servimg/ladder"


# ------------------------------------------------------------------------------------------ the run


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
    image: Mapping[str, object]
    variables: Mapping[str, str]
    model_dir: Path | None
    inputs: Inputs
    prereg: Mapping[str, object]
    deviations: tuple[str, ...]


def prepare(
    loaded: LoadedLadder, config: RunConfig, log: Log, image: Mapping[str, object] | None = None
) -> Prepared:
    """Image facts, variables (the tiny model generated when asked), and `preregistration.json` in `out`."""
    ladder = loaded.definition
    check_cpu_flags(ladder, host_cpu_flags())
    config.out.mkdir(parents=True, exist_ok=True)
    run_id = uuid.uuid4().hex[:12]
    started_at = now()
    facts = dict(image) if image is not None else _image_facts(config, ladder)
    deviations = tuple(jv.texts(facts.pop("deviations", []), "image.deviations"))
    variables, model_dir = _variables(loaded, config, log)
    pre = capture_inputs(loaded, variables, model_dir)
    prereg = {"run_id": run_id, "registered_at": started_at, "inputs": pre.as_json(), "sha256": pre.sha256}
    atomic_write(config.out / "preregistration.json", canonical.dumps_pretty(prereg), 0o644)
    log(f"ladder {ladder.name}: pre-registered inputs sha256 {pre.sha256[:16]}… ({len(ladder.arms)} arms)")
    return Prepared(run_id, started_at, facts, variables, model_dir, pre, prereg, deviations)


def host_cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str] | None:
    """This host's CPU flags (x86 `flags`, arm `Features`); None where they cannot be read."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return None


# oneDNN's CPU ISA levels (the values of ONEDNN_MAX_CPU_ISA), highest first, each with the CPU flags that
# mark it (a real CPU with a level's flags has every level below); a host reaches the first it has.
ONEDNN_ISAS: tuple[tuple[str, frozenset[str]], ...] = (
    ("AVX512_CORE_AMX", frozenset({"amx_tile", "amx_bf16", "amx_int8"})),
    ("AVX512_CORE_BF16", frozenset({"avx512_bf16"})),
    ("AVX512_CORE_VNNI", frozenset({"avx512_vnni"})),
    ("AVX512_CORE", frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq"})),
    ("AVX2", frozenset({"avx2"})),
    ("AVX", frozenset({"avx"})),
    ("SSE41", frozenset({"sse4_1"})),
)


def onednn_isa(flags: frozenset[str]) -> str | None:
    """The highest oneDNN ISA this host's CPU flags reach (None: below SSE4.1, or not x86)."""
    return next((name for name, marks in ONEDNN_ISAS if marks <= flags), None)


def check_cpu_flags(ladder: LadderDefinition, flags: frozenset[str] | None) -> None:
    """Refuse, before any server starts, a host whose CPU cannot serve the ladder's model, or whose
    CPU cannot reach the oneDNN ISA the ladder caps its servers at; say what this CPU reaches."""
    if flags is None:  # unreadable: the run itself is the judge
        return
    reach = onednn_isa(flags)
    wide = sorted(f for f in flags if f.startswith(("avx512", "amx")))
    host = (
        f"this host's CPU reaches oneDNN ISA {reach or 'none'} "
        f"(AVX-512/AMX flags: {', '.join(wide) or 'none'})"
    )
    missing = [f for f in ladder.requires_cpu_flags if f not in flags]
    if missing:
        raise LadderRunError(
            f"ladder {ladder.name} needs a CPU with {', '.join(missing)}, which this host lacks; {host}",
            hint="run it on a host with these instructions (an AVX-512 BF16 or AMX x86 CPU for vLLM's "
            "bf16-only CPU GDN kernels), e.g. --on slurm with a partition of such nodes",
        )
    cap = ladder.server.env.get("ONEDNN_MAX_CPU_ISA")
    names = [name for name, _ in ONEDNN_ISAS]
    if cap in names and reach is not None and names.index(cap) < names.index(reach):
        raise LadderRunError(
            f"ladder {ladder.name} caps oneDNN at ONEDNN_MAX_CPU_ISA={cap}, above what {host}",
            hint=f"run it on a host that reaches {cap}; a lower cap (ONEDNN_MAX_CPU_ISA={reach}) is a "
            "new ladder, since the run variables are pre-registered",
        )


def run(loaded: LoadedLadder, config: RunConfig, log: Log) -> Receipt:
    """Run the ladder; write `receipt.json` + `receipt.svg` into `config.out`; return the sealed receipt."""
    run_started = time.monotonic()
    prepared = prepare(loaded, config, log)
    arm_ids = [a.id for a in loaded.definition.arms]
    records, unchanged = run_arms(loaded, arm_ids, config, prepared, prepared.run_id, log)
    placement = Placement("local", {"host": socket.gethostname()})
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
            remove_run_containers(container_run_id)
    if capture_inputs(loaded, variables, model_dir).sha256 != pre.sha256:
        unchanged = False
    return records, unchanged


def finish(
    loaded: LoadedLadder,
    out: Path,
    prepared: Prepared,
    records: Sequence[ArmRecord],
    unchanged: bool,
    placement: Placement,
    wall_s: float,
    log: Log,
) -> Receipt:
    """Judge the records (pure), write the sealed receipt + plot into `out`, return the receipt."""
    ladder = loaded.definition
    deviations = list(prepared.deviations)
    for record in records:
        deviations += jv.texts(record.facts.pop("deviations", []), "facts.deviations")
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
    doc = dataclasses.replace(doc, timing={**doc.timing, "run_wall_s": round(wall_s, 3)}, placement=placement)
    receipt.write(out, doc)
    sealed = receipt.read(out / "receipt.json")
    file_sha = sha256_hex((out / "receipt.json").read_bytes())
    log(f"ladder {ladder.name}: {verdict.result} — {out / 'receipt.json'} (sha256:{file_sha[:12]}…)")
    return sealed


def _prompt_consistency(records: Sequence[ArmRecord]) -> list[str]:
    """Every arm must have sent the same prompt tokens (text probes are tokenized by each server)."""
    seen: dict[str, tuple[str, str]] = {}
    out = []
    for record in records:
        for key, facts in jv.obj(record.facts.get("request_facts") or {}).items():
            facts = jv.obj(facts, f"request_facts.{key}")
            prompt_id = key.partition("@")[0]
            digest = str(facts.get("prompt_token_ids_sha256"))
            first = seen.setdefault(prompt_id, (record.spec.id, digest))
            if first[1] != digest:
                out.append(f"{prompt_id}: arm {record.spec.id} sent other prompt tokens than arm {first[0]}")
    return out


def _merge_stop_facts(records: Sequence[ArmRecord], owner: str, server: Server) -> None:
    for record in records:
        if record.spec.id == owner:
            fact_map(record.facts, "server").update(
                {k: server.facts[k] for k in ("exit_code", "logs_sha256") if k in server.facts}
            )


@dataclass
class _Probing:
    """What an arm's requests gave so far (an error part-way keeps what came before it)."""

    before: dict[str, float | None] = field(default_factory=dict)
    after: dict[str, float | None] = field(default_factory=dict)
    requests: list[RequestOutcome] = field(default_factory=list)


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
    """One arm: its server (started, or the owner arm's), its pre-steps, every probe prompt with the
    metrics around it, the witness records; an error ends the arm's requests, never the run."""
    ladder = loaded.definition
    arm_started = time.monotonic()
    clock = _Clock()
    facts: dict[str, object] = {"deviations": []}
    prefix = f"[{index + 1}/{len(ladder.arms)} {arm.id}]"
    log(f"{prefix} role {arm.role}, server {arm.server}")
    error: str | None = None
    probing = _Probing()
    server: Server | None = None
    try:
        server = _arm_server(
            loaded, arm, config, variables, servers, caches, run_id, facts, clock, prefix, log
        )
        _before_requests(loaded, arm, index, server, facts)
        _send_prompts(loaded, arm, server, adapter, probing, facts, clock, prefix, log)
    except (ServimgError, requests.RequestException, KeyError) as exc:
        error = str(exc) if not isinstance(exc, ServimgError) else exc.message
        if isinstance(exc, ServimgError) and exc.problems:
            facts["error_detail"] = list(exc.problems)[-25:]
        log(f"{prefix} ERROR: {error}")
    witness_problems, modules, expected = _witnessed(server, arm, config, facts, log)
    facts["metrics"] = {"before": probing.before, "after": probing.after}
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
        tuple(probing.requests),
        delta(probing.before, probing.after),
        error,
        witness_problems,
        modules,
        expected,
    )
    return ArmRecord(arm, outcome, facts)


def _arm_server(
    loaded: LoadedLadder,
    arm: ArmSpec,
    config: RunConfig,
    variables: Mapping[str, str],
    servers: dict[str, Server],
    caches: dict[tuple[str, str], Path],
    run_id: str,
    facts: dict[str, object],
    clock: _Clock,
    prefix: str,
    log: Log,
) -> Server:
    """A fresh server (started and healthy) or the running server of the arm it reuses; its facts."""
    ladder = loaded.definition
    owner = ladder.server_arm(arm)
    if arm.reuses is None:
        t0 = time.monotonic()
        server = start_server(loaded, arm, config, variables, caches, run_id, facts, log)
        servers[arm.id] = server
        startup = wait_healthy(server, ladder.server.health_path, ladder.server.startup_timeout_s, log)
        clock.server_s += time.monotonic() - t0
        server.facts["healthy_after_s"] = round(startup, 3)
        server.facts["info"] = vllm.server_info(server.url)
        log(f"{prefix} server healthy after {startup:.1f}s ({jv.member(server.facts, 'info', 'version')})")
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
    return server


def _before_requests(
    loaded: LoadedLadder, arm: ArmSpec, index: int, server: Server, facts: dict[str, object]
) -> None:
    """The arm's pre-steps; on the first arm of a frozen-token ladder, the server's tokenizer checked."""
    ladder = loaded.definition
    for step in arm.pre_steps:
        fact_list(facts, "pre_steps").append(vllm.pre_step(server.url, step))
    if index == 0 and ladder.probe_tokens == "frozen":
        check = vllm.tokenization_check(
            server.url, ladder.model.served_name, [p for _, p in loaded.probes.prompts]
        )
        facts["tokenization_check"] = check
        if check["mismatched"] or check["errors"]:
            deviate(facts, f"tokenization check: {check}")


def _send_prompts(
    loaded: LoadedLadder,
    arm: ArmSpec,
    server: Server,
    adapter: MetricsAdapter,
    probing: _Probing,
    facts: dict[str, object],
    clock: _Clock,
    prefix: str,
    log: Log,
) -> None:
    """Every prompt of the probe set, one at a time, metrics scraped before and after each (so each
    request's metric deltas are its own); judged as they come."""
    ladder = loaded.definition
    metric_names = [g.metric for a in ladder.arms for g in a.exercise]

    def snapshot() -> dict[str, float | None]:
        # The ladder's instrument reports beside the server's own metrics (ladder.server).
        text = vllm.metrics_text(server.url) + instrument_metrics(server)
        return adapter.snapshot(parse_prometheus(text), metric_names)

    probing.before = snapshot()
    reported = len(instrument_requests(server))
    prompts = loaded.prompts_for(arm)
    keys = send_keys([prompt.id for _, prompt in prompts])
    for number, ((family, prompt), key) in enumerate(zip(prompts, keys, strict=True), 1):
        m0 = snapshot()
        t0 = time.monotonic()
        output, req_error = None, None
        try:
            output = vllm.complete(
                server.url, ladder.model.served_name, prompt, ladder, ladder.server.request_timeout_s
            )
        except (LadderRunError, requests.RequestException, ValueError) as exc:
            req_error = str(exc)
        seconds = time.monotonic() - t0
        clock.requests_s += seconds
        per = {k: v for k, v in delta(m0, snapshot()).items() if v}
        judgement = judge(output, prompt.expect, ladder.thresholds.detectors, req_error)
        probing.requests.append(RequestOutcome(prompt.id, family.id, output, judgement, req_error))
        tokens = (
            output.prompt_token_ids if output is not None and output.prompt_token_ids else prompt.token_ids
        )
        fact_map(facts, "request_facts")[key] = {
            "seconds": round(seconds, 4),
            "metrics_delta": per,
            "prompt_tokens": len(tokens),
            "prompt_token_ids_sha256": sha256_hex(json.dumps(list(tokens)).encode()),
        }
        status = "ok" if judgement.ok else "CORRUPTED " + "; ".join(judgement.reasons)[:120]
        hits = per.get("prefix_cache_hits")
        log(f"{prefix} {number}/{len(prompts)} {prompt.id}: {status} ({seconds:.2f}s hits +{hits or 0:g})")
    probing.after = snapshot()
    if loaded.definition.instrument is not None:  # what the scheduler handed it, per request
        facts["instrument_requests"] = instrument_requests(server)[reported:]
    if loaded.definition.cpu_permissions:  # what Linux answered the server's processes
        facts["cpu_permissions"] = cpu_permission_answers(server, loaded.definition.cpu_permissions)
    if not vllm.metrics_text(server.url):
        deviate(facts, f"{arm.id}: the server exports no /metrics: exercise gates cannot be met")


def _witnessed(
    server: Server | None, arm: ArmSpec, config: RunConfig, facts: dict[str, object], log: Log
) -> tuple[tuple[str, ...] | None, tuple[str, ...] | None, tuple[str, ...]]:
    """The witness records of a witness image's serving processes: (problems, modules loaded, modules
    expected); (None, None, ()) where there is nothing to collect."""
    if server is None or not server.witness or (server.container or server.witness_dir) is None:
        return None, None, ()
    problems, witness = collect_witness(server, config.out / "witness" / arm.id, log)
    facts["witness"] = witness
    modules = tuple(
        sorted({str(r["module"]) for r in jv.objs(witness.get("records") or [], "witness.records")})
    )
    # Of the modules the arm reaches, only those the image overlays leave witness records.
    reached = arm.witness_modules if arm.witness_modules is not None else server.overlay_modules
    expected = tuple(m for m in reached if m in server.overlay_modules)
    witness.update(loaded_modules=list(modules), expected_modules=list(expected))
    return problems, modules, expected


# ------------------------------------------------------------------------------------------ image, vars


def _image_facts(config: RunConfig, ladder: LadderDefinition) -> dict[str, object]:
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
    for repo_digest in jv.texts(attrs.get("RepoDigests") or [], "RepoDigests"):
        manifest = manifest or repo_digest.rpartition("@")[2]
    labels = {
        k: str(v) for k, v in jv.obj(jv.member(attrs, "Config", "Labels") or {}, "Config.Labels").items()
    }
    return image_facts(config.image, manifest, config_digest, labels, ladder)


def image_facts(
    ref: str, manifest: str | None, config_digest: str, labels: Mapping[str, str], ladder: LadderDefinition
) -> dict[str, object]:
    """The receipt's `image`: ref, manifest and config digests, servimg/OCI labels; checked against the
    digest the ladder names (wherever the image was resolved: the engine, or a registry)."""
    facts: dict[str, object] = {
        "ref": ref,
        "digest": manifest,
        "config_digest": config_digest,
        "labels": {
            k: v for k, v in sorted(labels.items()) if k.startswith(("io.servimg", "org.opencontainers"))
        },
        "deviations": [],
    }
    if manifest is None:
        fact_list(facts, "deviations").append(
            "the image's manifest digest is unknown here (engine image); config digest used"
        )
    if ladder.image is not None:
        facts["expected_digest"] = str(ladder.image.digest)
        if str(ladder.image.digest) not in (manifest, config_digest):
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
    generate = ladder.model.generate
    if generate is not None and "model_dir" in ladder.vars and "model_dir" not in variables:
        if config.image is None:
            raise LadderRunError("the tiny model is generated inside the image: pass --var model_dir=DIR")
        models = (config.store or BlobStore()).layout.models
        model_dir = ensure_model(GENERATED[generate], config.image, models, log)
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
            # the ladder, its probe set, and its instrument (a module the ladder pins by sha256)
            if member.isfile() and name.endswith((".yaml", ".json", ".py")):
                handle = tar.extractfile(member)
                if handle is not None:
                    (dest / name).write_bytes(handle.read())
    found = sorted(dest.glob("*.yaml"))
    if len(found) != 1:
        raise LadderError(f"{image}: expected one ladder YAML under {BUNDLE_DIR}, found {len(found)}")
    return found[0]


def summary(doc: Receipt, receipt_file: Path) -> dict[str, object]:
    """The CLI's one-line result: verdict, reasons, per-arm verdicts, the receipt's two hashes, each named
    for what it hashes (docs/ladder.md, "The receipt's hashes"): `receipt_sha256` is the file's (what
    `sha256sum`, `check`, `show` and the attached test-result's configuration digest say), `receipt_seal`
    the seal inside it (sha256 of the canonical JSON of everything else: it survives reformatting)."""
    return {
        "verdict": doc.verdict,
        "valid": doc.valid,
        "reasons": list(doc.verdict_reasons[:10]),
        "arms": {a.id: a.verdict for a in doc.arms},
        "receipt_sha256": f"sha256:{sha256_hex(receipt_file.read_bytes())}",
        "receipt_seal": f"sha256:{doc.sha256}",
        "harness_fraction": doc.timing.get("harness_fraction"),
        "image": doc.image.get("config_digest"),
    }


def to_json(doc: Mapping[str, object]) -> str:
    return json.dumps(doc, indent=1, sort_keys=True)
