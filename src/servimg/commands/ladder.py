"""`servimg ladder IMAGE`: the smoke ladder against an image — locally, on Slurm, or as Kubernetes Jobs
(emitted, then collected); a hashed receipt."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from servimg.attesting import later
from servimg.backends import transport
from servimg.commands.platformref import one_platform
from servimg.commands.signed import signing_key
from servimg.core.context import Log
from servimg.core.errors import LadderError, UsageError
from servimg.core.platform import Platform
from servimg.invocation import params
from servimg.invocation.context import Context
from servimg.invocation.outcome import Outcome, attempt
from servimg.ladder import receipt, runner, server
from servimg.ladder.loading import LoadedLadder, load
from servimg.ladder.receipt import Receipt
from servimg.placement import k8s, slurm
from servimg.statements.attest import TEST_RESULT_V01


def slurm_options(given: params.Slurm) -> slurm.SlurmOptions:
    return slurm.SlurmOptions(given.partition, given.gres, given.nodes_max, given.time_limit, given.extra)


def k8s_options(given: params.K8s) -> k8s.K8sOptions:
    return k8s.K8sOptions(
        given.namespace,
        given.gpu_resource,
        given.gpus,
        given.results_claim,
        given.results_host_path,
        given.time_limit,
        given.python,
        given.force,
    )


def native_platform(ref: str, platform: Platform | None, log: Log) -> str:
    """The image whose arms run here: one platform of an index (default: this host's). A platform this
    host would only emulate is refused: a ladder measures serving, and under qemu its timings mean
    nothing."""
    wanted = platform or Platform.host()
    if wanted.emulated:
        raise LadderError(
            f"refusing to run the ladder for {wanted} on this {Platform.host()} host: under emulation its "
            "timings (and its GPU arms) would mean nothing",
            hint=f"run it on a {wanted} host (`servimg ladder --platform {wanted}` there), or --on slurm/k8s "
            "with nodes of that platform",
        )
    return one_platform(ref, wanted, log, what="ladder")


def ladder(p: params.Ladder, ctx: Context) -> Iterator[Outcome]:
    """Run the smoke ladder: OK only on PASS; FAIL and NOT_EXERCISED fail (never a pass)."""

    def run() -> Outcome:
        if p.collect is not None:
            jobs = _json_file(p.k8s_jobs) if p.k8s_jobs is not None else None
            doc = k8s.collect(p.collect, p.image, ctx.log, jobs)
            return _ladder_outcome(p, doc, p.collect, "k8s", ctx)
        variables = dict(v.split("=", 1) for v in p.variables if "=" in v)
        if len(variables) != len(p.variables):
            raise UsageError("--var takes NAME=VALUE", hint="e.g. --var model_dir=/models/tiny")
        options = slurm_options(p.slurm)
        out, path = p.out, p.ladder
        # Arms and the bundled ladder need the image in the engine: a name or ID it has, else pulled in
        # (emitted Kubernetes Jobs run it on the cluster: only a bundled ladder needs it here).
        needs_engine = path is None or not (p.endpoint or p.on == "k8s")
        chosen = (
            native_platform(p.image, Platform.optional(p.platform), ctx.log) if p.on == "local" else p.image
        )
        image = transport.engine_name(chosen, ctx) if needs_engine else chosen
        if path is None:
            out = out or Path("ladder-out") / "bundled"
            path = runner.bundled_ladder(image, out / "ladder")
        loaded = load(path)
        out = out or Path("ladder-out") / loaded.definition.name
        config = server.RunConfig(
            None if p.endpoint else image, out, variables, p.gpus, p.endpoint, store=ctx.store
        )
        if p.on == "k8s":
            return _emit_k8s(p, loaded, config, ctx)
        if p.on == "slurm":
            doc = slurm.run(loaded, p.image, config, options, ctx.log)
        else:
            doc = runner.run(loaded, config, ctx.log)
        return _ladder_outcome(p, doc, out, p.on, ctx)

    yield attempt(p.image, run)


def _emit_k8s(p: params.Ladder, loaded: LoadedLadder, config: server.RunConfig, ctx: Context) -> Outcome:
    if p.emit is None or p.k8s is None or p.out is None:
        raise UsageError(
            "--on k8s writes manifests: give --emit DIR and --out RESULTS (the results volume's path)",
            hint="servimg ladder IMAGE --on k8s --emit DIR --out /shared/run --results-claim PVC",
        )
    options = k8s_options(p.k8s)
    index = k8s.emit(loaded, p.image, config, options, p.emit, ctx.log, slurm.resolve_image)
    return Outcome(p.image, {"emitted": str(p.emit), **index})


def _ladder_outcome(p: params.Ladder, doc: Receipt, out: Path, on: str, ctx: Context) -> Outcome:
    """OK only on PASS (FAIL and NOT_EXERCISED fail); the receipt attached when asked."""
    fields: dict[str, object] = {
        **runner.summary(doc, out / "receipt.json"),
        "receipt": str(out / "receipt.json"),
    }
    if on != "local" and doc.placement is not None:
        fields["placement"] = doc.placement.to_json()
    if p.attach:
        attached = later.attest_file(
            p.image,
            TEST_RESULT_V01,
            out / "receipt.json",
            ctx,
            key=signing_key(p.key),
            repo=p.attach,
        )
        fields["attestation"] = attached.as_dict()
    error = None
    if doc.verdict != "PASS":
        error = LadderError(
            f"ladder {doc.name}: {doc.verdict}",
            problems=list(doc.verdict_reasons[:20]),
            hint=f"see {out / 'receipt.json'} and {out / 'receipt.svg'}",
        )
    return Outcome(p.image, fields, findings=receipt.verdict(doc), error=error)


def _json_file(path: Path) -> dict[str, object]:
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {path}: {exc}", hint="kubectl get jobs -n NS -o json > FILE") from None
    if not isinstance(doc, dict):
        raise UsageError(f"{path} is not a JSON object", hint="kubectl get jobs -n NS -o json > FILE")
    return doc
