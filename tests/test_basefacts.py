"""Facts of a base alone are derived once and kept (servimg.patching.basefacts): reread for the same key,
derived again for another base, another input or another version of the code that derives them, and
never trusted when damaged. SERVIMG_NO_RESULT_CACHE does not switch them off; `bypassed` does."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from servimg.cache import results as resultstore
from servimg.patching import basefacts


class Counter:
    def __init__(self, value: object) -> None:
        self.value = value
        self.calls = 0

    def __call__(self) -> object:
        self.calls += 1
        return self.value


CODE = (sys.modules[__name__],)


def test_a_fact_is_derived_once_per_key(tmp_path: Path) -> None:
    derive = Counter([1, 2])
    key = {"diff_ids": ["sha256:" + "a" * 64]}
    assert basefacts.remembered(tmp_path, "f", key, derive, code=CODE) == [1, 2]
    assert basefacts.remembered(tmp_path, "f", key, derive, code=CODE) == [1, 2]
    assert derive.calls == 1
    other_base = {"diff_ids": ["sha256:" + "b" * 64]}
    assert basefacts.remembered(tmp_path, "f", other_base, derive, code=CODE) == [1, 2]
    assert derive.calls == 2  # another base is another key: never the first base's answer


def test_another_version_of_the_code_is_another_key(tmp_path: Path) -> None:
    derive = Counter("x")
    first = types.ModuleType("first")
    first.__file__ = str(tmp_path / "first.py")
    Path(first.__file__).write_text("A = 1\n")
    second = types.ModuleType("second")
    second.__file__ = str(tmp_path / "second.py")
    Path(second.__file__).write_text("A = 2\n")
    basefacts.remembered(tmp_path, "f", {}, derive, code=(first,))
    basefacts.remembered(tmp_path, "f", {}, derive, code=(second,))
    assert derive.calls == 2


def test_damaged_or_unreadable_entries_are_derived_again(tmp_path: Path) -> None:
    derive = Counter({"k": True})
    basefacts.remembered(tmp_path, "f", {}, derive, code=CODE)
    (entry,) = (tmp_path / "results").rglob("*.json")
    doc = json.loads(entry.read_text())
    doc["value"] = {"k": False}  # edited: its value_sha256 no longer checks out
    entry.write_text(json.dumps(doc))
    assert basefacts.remembered(tmp_path, "f", {}, derive, code=CODE) == {"k": True}
    assert derive.calls == 2

    def refuse(value: object) -> object:
        raise TypeError("not what this code reads")

    assert basefacts.remembered(tmp_path, "f", {}, derive, code=CODE, decode=refuse) == {"k": True}
    assert derive.calls == 3


def test_no_result_cache_keeps_base_facts_but_bypassed_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    derive = Counter(7)
    basefacts.remembered(tmp_path, "f", {}, derive, code=CODE)
    monkeypatch.setenv(resultstore.OFF, "1")
    assert basefacts.remembered(tmp_path, "f", {}, derive, code=CODE) == 7
    assert derive.calls == 1  # a --no-cache build still starts from its base
    with resultstore.bypassed():  # servimg check --rebuild: everything again
        basefacts.remembered(tmp_path, "f", {}, derive, code=CODE)
    assert derive.calls == 2
