"""`servimg ladder IMAGE`: the smoke ladder against an image, locally or on Slurm; a hashed receipt."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from servimg.backends import transport
from servimg.commands import params
from servimg.commands.outcome import Context, Outcome, attempt
from servimg.commands.signed import signing_key
from servimg.core.errors import UsageError
from servimg.ladder import receipt, runner, slurm
from servimg.ladder.definition import LadderError, load
from servimg.provenance import attach
from servimg.provenance.attest import TEST_RESULT_V01


def slurm_options(given: params.Slurm) -> slurm.SlurmOptions:
    return slurm.SlurmOptions(given.partition, given.gres, given.nodes_max, given.time_limit, given.extra)


def ladder(p: params.Ladder, ctx: Context) -> Iterator[Outcome]:
    """Run the smoke ladder: OK only on PASS; FAIL and NOT_EXERCISED fail (never a pass)."""

    def run() -> Outcome:
        variables = dict(v.split("=", 1) for v in p.variables if "=" in v)
        if len(variables) != len(p.variables):
            raise UsageError("--var takes NAME=VALUE", hint="e.g. --var model_dir=/models/tiny")
        options = slurm_options(p.slurm)
        out, path = p.out, p.ladder
        # Arms and the bundled ladder need the image in the engine: a name or ID it has, else pulled in.
        needs_engine = path is None or not p.endpoint
        image = transport.in_engine(p.image, ctx.store, ctx.log) if needs_engine else p.image
        if path is None:
            out = out or Path("ladder-out") / "bundled"
            path = runner.bundled_ladder(image, out / "ladder")
        loaded = load(path)
        out = out or Path("ladder-out") / loaded.definition.name
        config = runner.RunConfig(
            None if p.endpoint else image, out, variables, p.gpus, p.endpoint, store=ctx.store
        )
        if p.on == "slurm":
            doc = slurm.run(loaded, p.image, config, options, ctx.log)
        else:
            doc = runner.run(loaded, config, ctx.log)
        fields: dict[str, object] = {**runner.summary(doc), "receipt": str(out / "receipt.json")}
        if p.on == "slurm":
            fields["placement"] = doc["placement"]
        if p.attach:
            attached = attach.attest_file(
                p.image,
                TEST_RESULT_V01,
                out / "receipt.json",
                ctx.store,
                ctx.log,
                key=signing_key(p.key),
                repo=p.attach,
            )
            fields["attestation"] = attached.as_dict()
        error = None
        if doc["verdict"] != "PASS":
            error = LadderError(
                f"ladder {loaded.definition.name}: {doc['verdict']}",
                problems=list(doc["verdict_reasons"])[:20],
                hint=f"see {out / 'receipt.json'} and {out / 'receipt.svg'}",
            )
        return Outcome(p.image, fields, findings=receipt.verdict(doc), error=error)

    yield attempt(p.image, run)
