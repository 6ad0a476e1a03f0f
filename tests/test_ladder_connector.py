"""The connector ladder (verify/ladders/cpu-connector.yaml, issue 47): its instrument, pinned and mounted
beside the image under test, and the rules that keep an arm from attaching anything else.

The runs on real vLLM (the seed base FAILs the connector arms, the seed image PASSes every arm) are in
tests/test_seed.py, beside the seed base they share.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from servimg.core.digest import sha256_hex
from servimg.core.errors import LadderError, LadderRunError
from servimg.ladder import definition as ld
from servimg.ladder.loading import load
from servimg.ladder.runner import check_cpu_flags, host_cpu_flags, onednn_isa

REPO = Path(__file__).resolve().parent.parent
LADDER = REPO / "verify" / "ladders" / "cpu-connector.yaml"
INSTRUMENT = REPO / "verify" / "instruments" / "servimg_hybrid_connector.py"


def _doc() -> dict[str, object]:
    return dict(yaml.safe_load(LADDER.read_text()))


def _write(tmp_path: Path, doc: dict[str, object]) -> Path:
    """The ladder as `doc` says, in a checkout of its own (probe set and instrument copied)."""
    for part in ("verify/probes/cpu-connector.json", "verify/instruments/servimg_hybrid_connector.py"):
        (tmp_path / part).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / part).write_bytes((REPO / part).read_bytes())
    path = tmp_path / "verify" / "ladders" / "cpu-connector.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_the_connector_ladder_pins_its_instrument_and_loads_it() -> None:
    loaded = load(LADDER)
    assert loaded.definition.instrument is not None
    assert loaded.definition.instrument.module == "servimg_hybrid_connector"
    assert loaded.instrument_path == INSTRUMENT
    assert sha256_hex(loaded.instrument_bytes) == loaded.definition.instrument.sha256
    # every connector arm attaches the instrument and nothing else; the arms without one attach nothing
    attached = {a.id for a in loaded.definition.arms if "--kv-transfer-config" in a.args}
    assert attached == {"connector-cold", "connector-restart"}
    assert [p.id for _, p in loaded.prompts_for(loaded.definition.arm("connector-warm"))] == [
        "p900", "p600", "p300", "q750", "p900", "p600", "p300", "q750"
    ]  # fmt: skip


def test_an_edited_instrument_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, _doc())
    instrument = tmp_path / "verify" / "instruments" / "servimg_hybrid_connector.py"
    instrument.write_text(instrument.read_text() + "\n# restores a little after all\n")
    with pytest.raises(LadderError, match="the ladder pins") as caught:
        load(path)
    assert "pre-registered" in (caught.value.hint or "")


def test_an_arm_may_attach_only_the_ladders_instrument(tmp_path: Path) -> None:
    doc = _doc()
    arms = list(doc["arms"])  # type: ignore[call-overload]
    other = '{"kv_connector": "X", "kv_connector_module_path": "lmcache.x", "kv_role": "kv_both"}'
    arms[3] = {**arms[3], "args": ["--enable-prefix-caching", "--kv-transfer-config", other]}
    arms[5] = {**arms[5], "args": ["--enable-prefix-caching", "--kv-transfer-config", "{not json"]}
    with pytest.raises(LadderError) as caught:
        load(_write(tmp_path, {**doc, "arms": arms}))
    problems = "\n".join(caught.value.problems)
    assert "kv_connector_module_path 'lmcache.x' is not the ladder's instrument" in problems
    assert "arms[5].args (connector-restart): --kv-transfer-config is not a JSON object" in problems


def test_a_connector_module_without_a_declared_instrument_is_refused(tmp_path: Path) -> None:
    doc = {k: v for k, v in _doc().items() if k != "instrument"}
    with pytest.raises(LadderError) as caught:
        load(_write(tmp_path, doc))
    assert any("declares no `instrument` to mount" in p for p in caught.value.problems)


def test_a_ladder_without_an_instrument_keeps_its_canonical_bytes() -> None:
    """`instrument` is left out of the canonical form when unset: no earlier receipt changes meaning."""
    hybrid = load(REPO / "verify" / "ladders" / "cpu-hybrid.yaml")
    assert "instrument" not in hybrid.definition.as_json()
    assert hybrid.instrument_path is None


def test_a_host_without_the_cpu_flags_the_model_needs_is_refused_before_any_server() -> None:
    ladder = load(LADDER).definition
    assert ladder.requires_cpu_flags == ("avx512_bf16",)
    check_cpu_flags(ladder, frozenset({"avx2", "avx512f", "avx512_bf16"}))  # this ladder's host
    check_cpu_flags(ladder, None)  # unreadable: judged by the run itself
    with pytest.raises(LadderRunError, match="needs a CPU with avx512_bf16") as caught:
        check_cpu_flags(ladder, frozenset({"avx2", "avx512f"}))
    assert "avx512f" in caught.value.message and "AVX-512 BF16" in (caught.value.hint or "")


def test_cpu_flags_are_read_from_cpuinfo(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512_bf16\n\nprocessor\t: 1\n")
    assert host_cpu_flags(cpuinfo) == frozenset({"fpu", "avx2", "avx512_bf16"})
    assert host_cpu_flags(tmp_path / "absent") is None


def test_the_refusal_says_which_onednn_isa_this_cpu_reaches_and_a_cap_above_it_is_refused() -> None:
    """Issue 47: a host whose CPU cannot serve the seed-era torch is told which ISA it reaches and what
    to do; a ladder capping oneDNN above that reach is refused before any server starts."""
    ladder = load(LADDER).definition
    assert ladder.server.env["ONEDNN_MAX_CPU_ISA"] == "AVX512_CORE_BF16"
    avx512 = {"avx2", "avx", "sse4_1", "avx512f", "avx512bw", "avx512vl", "avx512dq"}
    with pytest.raises(LadderRunError, match="needs a CPU with avx512_bf16") as caught:
        check_cpu_flags(ladder, frozenset(avx512 | {"avx512_vnni"}))
    assert "reaches oneDNN ISA AVX512_CORE_VNNI" in caught.value.message
    assert onednn_isa(frozenset(avx512 | {"avx512_bf16", "avx512_vnni"})) == "AVX512_CORE_BF16"
    amx = frozenset(avx512 | {"avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8"})
    assert onednn_isa(amx) == "AVX512_CORE_AMX"
    check_cpu_flags(ladder, amx)  # the cap is below an AMX host's reach: served capped
    raw = yaml.safe_load(LADDER.read_text())
    raw["requires_cpu_flags"] = []
    raw["server"]["env"]["ONEDNN_MAX_CPU_ISA"] = "AVX512_CORE_AMX"
    capped = ld.LadderDefinition.parse(yaml.safe_dump(raw))
    with pytest.raises(LadderRunError, match="caps oneDNN at ONEDNN_MAX_CPU_ISA=AVX512_CORE_AMX") as above:
        check_cpu_flags(capped, frozenset(avx512 | {"avx512_bf16"}))
    assert "AVX512_CORE_BF16" in above.value.message


def test_every_server_process_asks_for_the_ladders_cpu_permissions_and_the_answers_are_counted(
    tmp_path: Path,
) -> None:
    """`cpu_permissions: [amx]`: servimg/inimage/cpu_permissions.py runs as the sitecustomize of a real
    interpreter, asks Linux (on this CPU: granted on an AMX host, an errno elsewhere), reports one line per
    process, and still runs the sitecustomize it shadows."""
    import subprocess
    import sys

    from servimg.inimage import cpu_permissions
    from servimg.ladder.server import Server, cpu_permission_answers

    startup, shadowed, report = tmp_path / "startup", tmp_path / "image", tmp_path / "report"
    for d in (startup, shadowed, report):
        d.mkdir()
    (startup / "sitecustomize.py").write_bytes(Path(cpu_permissions.__file__).read_bytes())
    (shadowed / "sitecustomize.py").write_text("import os\nos.environ['SHADOWED_RAN'] = '1'\n")
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": f"{startup}:{shadowed}",
        "SERVIMG_CPU_PERMISSIONS": "amx",
        "SERVIMG_INSTRUMENT_DIR": str(report),
    }
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", "import os; print(os.environ.get('SHADOWED_RAN'))"],
            env=env, capture_output=True, text=True, check=True,
        )  # fmt: skip
        assert done.stdout.strip() == "1", "the image's own sitecustomize still ran"
    amx = "amx_tile" in (host_cpu_flags() or frozenset())
    server = Server("http://x", "container", (), {}, instrument_dir=report)
    said = cpu_permission_answers(server, ("amx",))
    assert said["requested"] == ["amx"] and said["processes"] == 2, said
    (answer,) = said["answers"]["amx"]  # type: ignore[index]
    assert (answer == "granted") == amx and said["answers"]["amx"][answer] == 2, said  # type: ignore[index]
    (report / cpu_permissions.REPORT_NAME).write_text('{"answers": {"amx": "granted"}}\n{"answ')
    assert cpu_permission_answers(server, ("amx",))["processes"] == 1, "a cut-short line is skipped"
