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
from servimg.ladder.runner import check_cpu_flags, host_cpu_flags

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
    loaded = ld.load(LADDER)
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
        ld.load(path)
    assert "pre-registered" in (caught.value.hint or "")


def test_an_arm_may_attach_only_the_ladders_instrument(tmp_path: Path) -> None:
    doc = _doc()
    arms = list(doc["arms"])  # type: ignore[call-overload]
    other = '{"kv_connector": "X", "kv_connector_module_path": "lmcache.x", "kv_role": "kv_both"}'
    arms[3] = {**arms[3], "args": ["--enable-prefix-caching", "--kv-transfer-config", other]}
    arms[5] = {**arms[5], "args": ["--enable-prefix-caching", "--kv-transfer-config", "{not json"]}
    with pytest.raises(LadderError) as caught:
        ld.load(_write(tmp_path, {**doc, "arms": arms}))
    problems = "\n".join(caught.value.problems)
    assert "kv_connector_module_path 'lmcache.x' is not the ladder's instrument" in problems
    assert "arms[5].args (connector-restart): --kv-transfer-config is not a JSON object" in problems


def test_a_connector_module_without_a_declared_instrument_is_refused(tmp_path: Path) -> None:
    doc = {k: v for k, v in _doc().items() if k != "instrument"}
    with pytest.raises(LadderError) as caught:
        ld.load(_write(tmp_path, doc))
    assert any("declares no `instrument` to mount" in p for p in caught.value.problems)


def test_a_ladder_without_an_instrument_keeps_its_canonical_bytes() -> None:
    """`instrument` is left out of the canonical form when unset: no earlier receipt changes meaning."""
    hybrid = ld.load(REPO / "verify" / "ladders" / "cpu-hybrid.yaml")
    assert "instrument" not in hybrid.definition.as_json()
    assert hybrid.instrument_path is None


def test_a_host_without_the_cpu_flags_the_model_needs_is_refused_before_any_server() -> None:
    ladder = ld.load(LADDER).definition
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
