"""Human output a person can read (issue 40): no Python reprs (`{'mediaType': …}`, `['a', 'b']`, `True`,
`None`, `PosixPath(…)`), no path or digest wrapped in the middle, every line once.

The commands run here for real on the fake base (lock, build into an OCI layout, push with a key, show,
check with the right and the wrong key, cache status, key generate, overlay drop of an unknown id, a
failing lock) and their stdout and stderr are searched; the main job's own output (every command it
runs in human form: base, push, ladder, check) is searched the same way in tests/test_demo_job.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import fakebase as fb
from servimg.core.digest import Digest
from servimg.render import human_lines

REPR = [
    (re.compile(r"\{'[^']*': "), "a dict repr"),
    (re.compile(r"\['[^']*'(, |\])"), "a list repr"),
    (re.compile(r"(^|: )(True|False|None)$", re.M), "a Python constant"),
    (re.compile(r"\b(PosixPath|Digest|Path)\("), "an object repr"),
    (re.compile(r"<servimg\.[\w.]+ object at 0x"), "an object repr"),
]
# A digest broken across lines: its hex ends at the end of a line or at a table's column border.
DIGEST_CUT = re.compile(r"sha256:[0-9a-f]{1,63}[ \t]*│?[ \t]*$", re.M)


def python_reprs(text: str) -> list[str]:
    """Every line of `text` that shows Python's spelling instead of a person's."""
    found = []
    for line in text.splitlines():
        for pattern, what in REPR:
            if pattern.search(line):
                found.append(f"{what}: {line}")
    found += [f"a digest cut mid-token: {m.group().strip()}" for m in DIGEST_CUT.finditer(text)]
    found += [f"the reason a check failed is not on its FAIL line: {line}" for line in _bare_fails(text)]
    return found


def _bare_fails(text: str) -> list[str]:
    """FAIL lines about a missing verified attestation that do not say why the ones found were not
    counted, while the table shows some were ignored."""
    if "ignored:" not in text:
        return []
    return [
        line
        for line in text.splitlines()
        if line.startswith("  - ") and "no verified" in line and "not counted" not in line
    ]


def test_the_renderer_writes_values_as_a_person_reads_them() -> None:
    fields = {
        "digest": Digest.parse("sha256:" + "a" * 64),
        "changed": True,
        "parent": None,
        "files": ["a.py", "b.py"],
        "layer": {"mediaType": "application/vnd.oci.image.layer.v1.tar", "size": 3},
        "attestations": [{"kind": "provenance", "formats": ["referrer", "bundle"]}],
        "nothing": {},
    }
    text = "\n".join(human_lines(fields, "  "))
    assert not python_reprs(text), text
    assert "  digest: sha256:" + "a" * 64 in text and "  changed: yes" in text and "  parent: none" in text
    assert "  files: a.py, b.py" in text and "    mediaType: application/vnd.oci.image.layer.v1.tar" in text
    assert "  attestations:\n    - kind: provenance\n      formats: referrer, bundle" in text


def test_the_detector_sees_what_it_looks_for() -> None:
    assert python_reprs("  layer: {'mediaType': 'x'}")
    assert python_reprs("  files: ['a', 'b']")
    assert python_reprs("  changed: True")
    assert python_reprs("  where: PosixPath('/x')")
    assert python_reprs("… sha256:" + "a" * 30 + "\n" + "a" * 34)
    assert python_reprs("│ config sha256:" + "a" * 30 + " │\n│ " + "a" * 34 + " │")
    assert not python_reprs("  summary: 34 PASS, 0 WARN, 0 FAIL\n  changed: yes")


def test_every_command_run_here_prints_no_python_repr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = str(tmp_path / "cache")
    base = fb.make_base(tmp_path / "base", [fb.tar(fb.package_members())])
    definition = fb.make_repo(tmp_path / "repo", base)
    layout = f"oci:{tmp_path / 'built'}"
    report = tmp_path / "verify.json"
    report.write_text('{"checks": [{"code": "SOURCE", "status": "PASS", "subject": "s", "message": "m"}]}')
    outputs: dict[str, Any] = {}

    def run(*argv: str, code: int = 0) -> None:
        got = fb.main([*argv, "--cache", cache])
        out = capsys.readouterr()
        outputs[" ".join(argv[:2])] = out.out + out.err
        assert got == code, (argv, out.out, out.err)

    run("key", "generate", "--out", str(tmp_path / "keys"))
    run("key", "generate", "--out", str(tmp_path / "other"))
    run("lock", str(definition))
    run("build", str(definition), "--to", layout)
    pushed = f"oci:{tmp_path / 'pushed'}:v1"
    run("push", layout, pushed, "--key", str(tmp_path / "keys" / "servimg.key"), "--report", str(report))
    run("show", pushed)
    run("check", pushed, "--key", str(tmp_path / "keys" / "servimg.pub"))
    run("check", pushed, "--key", str(tmp_path / "other" / "servimg.pub"), code=1)
    run("cache", "status")
    run("overlay", "drop", str(definition), "no-such", code=1)
    run("lock", str(tmp_path / "missing.yaml"), code=1)
    found = {command: python_reprs(text) for command, text in outputs.items()}
    assert not {c: f for c, f in found.items() if f}, found
    for command, text in outputs.items():
        lines = [line for line in text.splitlines() if line.strip()]
        repeated = {line for line in lines if lines.count(line) > 1 and line.startswith("…")}
        assert not repeated, (command, repeated)


def test_a_drifted_definition_names_the_fields_that_moved(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The drift message names the definition's fields that moved (the definition as locked is
    remembered in the cache by its sha256), not only `definition_sha256`; without it, where to look."""
    cache = str(tmp_path / "cache")
    base = fb.make_base(tmp_path / "base", [fb.tar(fb.package_members())])
    definition = fb.make_repo(tmp_path / "repo", base)
    assert fb.main(["lock", str(definition), "--cache", cache, "--quiet"]) == 0
    text = definition.read_text()
    definition.write_text(text.replace("tag: '{name}-{lock12}'", "tag: 'moved-{lock12}'"))
    target = f"oci:{tmp_path / 'out'}"
    capsys.readouterr()
    assert fb.main(["build", str(definition), "--to", target, "--cache", cache]) == 1
    printed = capsys.readouterr().out
    assert "drifted from the lock" in printed and "definition.tag: locked" in printed, printed
    assert '"{name}-{lock12}", now "moved-{lock12}"' in printed, printed
    assert fb.main(["build", str(definition), "--to", target, "--cache", str(tmp_path / "other")]) == 1
    elsewhere = capsys.readouterr().out
    assert "the definition as locked is not in this cache" in elsewhere and "git diff" in elsewhere, elsewhere
