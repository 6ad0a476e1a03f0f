"""Runs INSIDE the image under its own interpreter (standard library only, Python 3.7+).

Usage: python _incontainer_compile.py JOBS.json RESULT.json
Writes one JSON object: the interpreter's facts (version, magic, cache tag) and, per job, success.
JOBS.json is a list of compile jobs, or {"compile": [...], "sentinels": [...]}: a sentinel job is a base
module's source and the sentinels to look up in its code, compiled by THIS interpreter (a base newer than
the host has syntax the host cannot compile) and searched with the probe's own `find_in_qualname`
(probe.py beside this script; Python 3.9+). Its answer per sentinel key: [hits, code objects].
Each source is compiled in its own fresh process (PYTHONHASHSEED=0), so the output cannot depend on
what an earlier compile left in the interpreter (marshal's ref flags are refcount-sensitive on some
versions) nor on which runner (container or chroot) ran us. The processes share nothing, so they run
side by side, one per CPU: a job's bytes are the same whichever runs first; results keep the given order.
"""

from __future__ import annotations  # dict[...] annotations on Python 3.7/3.8

import importlib
import importlib.util
import json
import os
import subprocess
import sys
import threading

# A compile error is reported as one line, `PATH:LINE: TYPE: MESSAGE` (PATH as it lives in the image), so
# the build and `overlay save` name the file and the line, not only the message.
CHILD = r"""
import py_compile, sys
src, dfile, cfile, opt = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
try:
    py_compile.compile(src, cfile=cfile, dfile=dfile, doraise=True, optimize=opt,
                       invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
except py_compile.PyCompileError as exc:
    err = exc.exc_value
    line = getattr(err, "lineno", None) or "?"
    sys.stderr.write("%s:%s: %s: %s\n" % (dfile, line, exc.exc_type_name, getattr(err, "msg", None) or err))
    sys.exit(1)
"""


def sentinel_lookups(items: list[dict[str, object]]) -> dict[str, object]:
    """Per sentinel key: [hits, code objects with its qualname], or {"error": why} for a module whose
    source this interpreter cannot compile. Compiled, never executed."""
    probe = importlib.import_module("probe")  # beside this script (sys.path[0]); only now: 3.9+

    out: dict[str, object] = {}
    for item in items:
        with open(str(item["src"]), "rb") as fh:
            source = fh.read()
        try:
            code = compile(source, f"<base {item['module']}>", "exec", dont_inherit=True, optimize=0)
        except (SyntaxError, ValueError) as exc:
            for lookup in _lookups(item):
                out[str(lookup["key"])] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        for lookup in _lookups(item):
            hits, objects, _ = probe.find_in_qualname(
                code, lookup["qualname"], lookup["name"], lookup["const"]
            )
            out[str(lookup["key"])] = [hits, objects]
    return out


def _lookups(item: dict[str, object]) -> list[dict[str, object]]:
    lookups = item["lookups"]
    return [x for x in lookups if isinstance(x, dict)] if isinstance(lookups, list) else []


def main() -> None:
    with open(sys.argv[1]) as fh:
        plan = json.load(fh)
    jobs = plan["compile"] if isinstance(plan, dict) else plan
    sentinels = plan.get("sentinels", []) if isinstance(plan, dict) else []
    # Not -I/-E: those would ignore PYTHONHASHSEED, and string hash order decides how frozenset
    # constants are marshalled.
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONHASHSEED": "0"}

    def compile_one(job: dict[str, object]) -> dict[str, object]:
        argv = [sys.executable, "-S", "-s", "-c", CHILD, str(job["src"]), str(job["dfile"]), str(job["out"])]
        argv.append(str(job["opt"]))
        try:
            proc = subprocess.run(argv, env=env, capture_output=True, text=True)
        except OSError as exc:  # in a thread: reported as this job's failure, never a lost result
            return {"out": job["out"], "ok": False, "error": f"cannot start {sys.executable}: {exc}"}
        return {"out": job["out"], "ok": proc.returncode == 0, "error": proc.stderr[-2000:]}

    # Plain threads, not concurrent.futures: that imports logging, a tenth of this script's run.
    results: list[dict[str, object]] = [{} for _ in jobs]
    pending = list(enumerate(jobs))
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if not pending:
                    return
                i, job = pending.pop(0)
            results[i] = compile_one(job)  # each job's own slot: results keep the jobs' order

    threads = [threading.Thread(target=worker) for _ in range(min(len(jobs), os.cpu_count() or 1))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    facts: dict[str, object] = {
        "executable": sys.executable,
        "version": ".".join(str(v) for v in sys.version_info[:3]),
        "magic": importlib.util.MAGIC_NUMBER.hex(),
        "cache_tag": sys.implementation.cache_tag,
        "results": results,
    }
    if sentinels:
        facts["sentinels"] = sentinel_lookups(sentinels)
    # A file in the shared work dir, not stdout: container log capture is not a reliable channel.
    with open(sys.argv[2], "w") as fh:
        json.dump(facts, fh, sort_keys=True)


if __name__ == "__main__":
    main()
