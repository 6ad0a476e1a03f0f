"""One finding model, one renderer, one registry of commands: the verdict rules every report shares, the
JSON shapes the reports keep, and a CLI whose subcommands come from a single table."""

from __future__ import annotations

import dataclasses
import inspect
import json
import typing
from pathlib import Path

import pytest

from fakebase import HOST_SEAMS
from servimg import cli
from servimg.bases import catalog
from servimg.commands import ladder
from servimg.core.findings import ERROR, FAIL, NOT_EXERCISED, PASS, WARN, Finding, Findings, Status
from servimg.invocation import params
from servimg.invocation.context import Context
from servimg.judging.check import CheckReport
from servimg.judging.evidence import row
from servimg.ladder import receipt
from servimg.ladder.witness import WitnessCollection
from servimg.oci.store import BlobStore
from servimg.proof.verify import VerifyFailed, VerifyReport
from servimg.render import findings_table
from servimg.signing import keys


def _f(status: str, hint: str = "") -> Finding:
    return Finding("CODE", Status(status), "subject", f"message {status}", hint)


@pytest.mark.parametrize(
    ("statuses", "verdict"),
    [
        ((), PASS),
        ((PASS, WARN), PASS),  # a warning is reported, never failing
        ((PASS, NOT_EXERCISED), NOT_EXERCISED),
        ((NOT_EXERCISED, FAIL), FAIL),
        ((PASS, ERROR), FAIL),  # a check that could not run is as bad as one that failed
    ],
)
def test_the_verdict_is_the_worst_finding(statuses: tuple[str, ...], verdict: str) -> None:
    findings = Findings(tuple(_f(s) for s in statuses))
    assert findings.verdict == verdict
    assert findings.ok is (verdict == PASS)
    assert findings.counts()["PASS"] == statuses.count(PASS)


def test_one_table_for_every_report() -> None:
    failed = Findings((_f(PASS), _f(FAIL, hint="do this")))
    table = findings_table(failed)
    assert "fix: do this" in table and "→ NOT OK (FAIL)" in table
    assert "→ OK" in findings_table(Findings((_f(PASS, hint="never shown"),)))
    assert "never shown" not in findings_table(Findings((_f(PASS, hint="never shown"),)))


def test_check_rows_keep_their_json_shape() -> None:
    report = CheckReport(
        (row("base label", PASS, "same"), row("attestation provenance 0123", FAIL, "forged")), ref="r"
    )
    assert [f.code for f in report.findings] == ["BASE_LABEL", "ATTESTATION"]
    doc = report.as_dict()
    assert doc["rows"][1] == {"what": "attestation provenance 0123", "verdict": "FAIL", "why": "forged"}
    assert doc["summary"] == {"PASS": 1, "WARN": 0, "FAIL": 1} and not doc["ok"]
    assert json.loads(json.dumps(doc)) == doc


def test_a_verify_report_round_trips_and_fails_with_its_findings() -> None:
    data = {
        "checks": [
            {"code": "SOURCE_SHA", "status": "PASS", "subject": "a.py", "message": "ok"},
            {"code": "SENTINEL", "status": "FAIL", "subject": "a:f", "message": "gone", "hint": "rebuild"},
        ]
    }
    report = VerifyReport.from_json(data)
    assert report.counts() == {"PASS": 1, "WARN": 0, "FAIL": 1, "ERROR": 0}
    error = VerifyFailed(report)
    assert list(error.problems) == ["SENTINEL a:f: gone"] and error.hint == "rebuild"
    assert VerifyReport.from_json(report.as_dict()).findings == report.findings
    # Wrapped with context on its way out, it is still a VerifyFailed that carries its report.
    wrapped = error.context("building images/demo.yaml")
    assert isinstance(wrapped, VerifyFailed) and wrapped.report is report
    assert wrapped.message == "building images/demo.yaml: 1 check(s) failed" and wrapped.hint == "rebuild"
    assert wrapped.as_dict()["report"] == report.as_dict() and wrapped.__cause__ is error


def test_a_witness_without_records_fails_and_says_why() -> None:
    empty = WitnessCollection("c1", "/var/lib/servimg/witness", ())
    assert empty.verdict().verdict == FAIL and not empty.ok
    error = empty.error()
    assert error is not None and "no witness records" in error.message
    ran = WitnessCollection("c1", "/w", ({"pid": 7, "records": [{"module": "m", "patched_code_ran": True}]},))
    assert ran.ok and ran.error() is None


def test_a_receipt_reads_back_as_the_ladder_verdict() -> None:
    doc = receipt.Receipt(
        receipt_version=1,
        run_id="r",
        ladder={"name": "smoke"},
        image={},
        inputs={},
        preregistration={},
        valid=True,
        verdict="NOT_EXERCISED",
        verdict_reasons=(),
        deviations=("no noise floor was measured",),
        noise_floor={},
        gates=(),
        arms=(
            receipt.ReceiptArm("control", "control", "PASS", ()),
            receipt.ReceiptArm("warm", "warm", "NOT_EXERCISED", ("gate not met",)),
        ),
        timing={},
        started_at="",
        finished_at="",
    )
    verdict = receipt.verdict(doc)
    assert verdict.verdict == doc.verdict and verdict.counts()["WARN"] == 1
    invalid = dataclasses.replace(doc, valid=False)
    assert receipt.verdict(invalid).verdict == FAIL, "an invalid run is a FAIL"


def test_the_cli_has_one_registry_of_commands() -> None:
    names = [c.name for c in cli.COMMANDS]
    assert len(set(names)) == len(names)
    top = cli.parser()
    for name in names:
        argv = [*name, *{"diff": ["a", "b"], "key": ["--out", "k"]}.get(name[0], [])]
        if name[0] in ("lock", "build"):
            argv.append("x.yaml")
        elif name[0] in ("verify", "push", "show", "check", "ladder", "fixes", "vex", "matrix"):
            argv += ["ref", "dest"] if name[0] == "push" else ["ref"]
        elif name[0] == "witness":
            argv.append("container")
        elif name[0] == "base":
            argv.append("demo")
        elif name[0] == "rebase":
            argv += ["x.yaml", "--base", "oci:new"]
        elif name[0] == "attest":
            argv += ["ref", "--predicate-type", "vsa", "--file", "f"]
        elif name[0] == "promote":
            argv += ["ref", "--tag", "qualified"]
        elif name == ("overlay", "drop"):
            argv += ["x.yaml", "an-overlay"]
        elif name[0] == "overlay":
            argv += ["x.yaml", "vllm", "--dir", "d", *(["--id", "i"] if name[1] == "save" else [])]
        elif name[0] == "init":
            argv += ["--base", "ref", "--name", "n"]
        elif name[0] == "policy":
            argv += ["--out", "o", "--registry", "r:5000", "--kyverno"]
        args = top.parse_args(argv)
        command = next(c for c in cli.COMMANDS if c.name == name)
        assert args.run is command.run
        # The function the entry names (loaded as the command runs) takes what its entry builds.
        function = cli.load(command.run.function)
        first = next(iter(inspect.signature(function).parameters))
        assert isinstance(command.run.params(args), typing.get_type_hints(function)[first]), name


def test_the_parameters_name_what_the_library_names() -> None:
    """servimg.invocation.params repeats two names so that parsing imports nothing behind a command."""
    assert tuple(catalog.BASES) == params.BASES
    assert params.DEFAULT_KEY_NAME == keys.DEFAULT_NAME


def test_a_refused_target_is_a_fail_outcome_not_an_exception(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    context = Context(BlobStore(tmp_path / "cache"), seams=HOST_SEAMS)
    (outcome,) = ladder.ladder(params.Ladder("img", variables=("novalue",)), context)
    assert outcome.error is not None and "NAME=VALUE" in outcome.error.message
    assert cli.main(["ladder", "img", "--var", "novalue", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["status"] == "FAIL"
