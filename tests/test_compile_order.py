"""The compile run hands its jobs out largest source first (the longest compile must not start last:
servimg.patching.bytecode.compile_sources), and the order changes no byte: each (path, opt) gets the pyc
its own process wrote, whatever order the jobs were given in."""

from __future__ import annotations

import json
from pathlib import Path

import fakebase as fb
from servimg.patching.bytecode import CompileJob, InterpreterFacts, compile_sources


class RecordingRunner(fb.FakeRunner):
    def __init__(self) -> None:
        self.plans: list[list[dict[str, object]]] = []

    def run(self, jobs_dir: Path, interpreter: str) -> InterpreterFacts:
        self.plans.append(json.loads((jobs_dir / "jobs.json").read_text()))
        return super().run(jobs_dir, interpreter)


def _jobs() -> list[CompileJob]:
    def source(lines: int) -> bytes:
        return "".join(f"def f{n}(x):\n    return x + {n}\n" for n in range(lines)).encode()

    return [
        CompileJob("/site/a_small.py", source(1), (0,)),
        CompileJob("/site/b_large.py", source(400), (0, 1)),
        CompileJob("/site/c_medium.py", source(40), (0,)),
    ]


def test_the_largest_source_is_compiled_first_and_the_bytes_do_not_depend_on_the_order() -> None:
    runner = RecordingRunner()
    _, forward = compile_sources(runner, "/usr/bin/python3", _jobs())
    _, backward = compile_sources(runner, "/usr/bin/python3", list(reversed(_jobs())))
    order = [job["dfile"] for job in runner.plans[0]]
    assert order == ["/site/b_large.py", "/site/b_large.py", "/site/c_medium.py", "/site/a_small.py"]
    assert runner.plans[0] == runner.plans[1]
    assert forward == backward
    assert set(forward) == {
        ("/site/a_small.py", 0),
        ("/site/b_large.py", 0),
        ("/site/b_large.py", 1),
        ("/site/c_medium.py", 0),
    }
