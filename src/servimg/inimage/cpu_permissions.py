"""servimg's CPU permission request: the ladder run variable `cpu_permissions` (issue 47), in every Python
process of a ladder's server.

Mounted read-only by the ladder runner as `sitecustomize.py` in a directory put first on PYTHONPATH, so
site.py runs it at the start of every Python process the server starts (the API server, the engine core,
its workers), whatever starts them. It never changes the image under test.

Why. Linux hands a process the AMX tile state (XTILEDATA) only after the process asked for it with
`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`; without it the first AMX instruction is a SIGILL.
torch 2.11's oneDNN JIT emits AMX `tilezero` in vLLM 0.26.0's CPU GDN prefill on AMX hosts, and the
served engine's worker process died with SIGILL until every process asked (what `torch._C._cpu._init_amx()`
does; measured by the incident, issue 47). Asking on a CPU or kernel without AMX fails harmlessly
(EOPNOTSUPP or EINVAL).

What is asked comes from `SERVIMG_CPU_PERMISSIONS` (comma-separated; `amx` is the one known). Each
process appends one JSON line to `$SERVIMG_INSTRUMENT_DIR/cpu-permissions.jsonl` saying what it asked
and what Linux answered, which the runner puts in the receipt. Then the image's own sitecustomize (the
next one on sys.path; Debian ships one) runs as it would have.

STANDARD LIBRARY ONLY; never raises (a start-up hook must not take the server down).
"""

import ctypes
import errno
import importlib.machinery
import importlib.util
import json
import os
import platform
import sys
from collections.abc import Callable

REPORT_NAME = "cpu-permissions.jsonl"
SYS_ARCH_PRCTL = 158  # x86_64 syscall number (arch/x86/entry/syscalls/syscall_64.tbl)
ARCH_REQ_XCOMP_PERM = 0x1023  # arch/x86/include/uapi/asm/prctl.h
XFEATURE_XTILEDATA = 18  # arch/x86/include/asm/fpu/types.h


def request_amx() -> str:
    """Ask Linux for the AMX tile data state: "granted", or the errno's name."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return "not x86_64 Linux"
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0:
        return "granted"
    code = ctypes.get_errno()
    return errno.errorcode.get(code, str(code))


REQUESTS: "dict[str, Callable[[], str]]" = {"amx": request_amx}


def request_all(names: "list[str]") -> "dict[str, str]":
    answers = {}
    for name in names:
        ask = REQUESTS.get(name)
        try:
            answers[name] = ask() if ask is not None else "unknown permission"
        except Exception as exc:  # reported, never raised
            answers[name] = f"error: {exc}"
    return answers


def report(answers: "dict[str, str]") -> None:
    directory = os.environ.get("SERVIMG_INSTRUMENT_DIR")
    if not directory:
        return
    said = {"pid": os.getpid(), "argv0": (sys.argv or [""])[0], "answers": answers}
    line = json.dumps(said, sort_keys=True)
    try:
        fd = os.open(os.path.join(directory, REPORT_NAME), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            os.write(fd, (line + "\n").encode())  # one write under O_APPEND: lines never interleave
        finally:
            os.close(fd)
    except OSError:
        pass


def run_image_sitecustomize() -> None:
    """The sitecustomize this one shadows (the next on sys.path), run as site.py would have."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception:  # site.py also swallows a failing sitecustomize
        pass


def main() -> None:
    names = [n for n in os.environ.get("SERVIMG_CPU_PERMISSIONS", "").split(",") if n]
    if names:
        report(request_all(names))
    run_image_sitecustomize()


if __name__ == "sitecustomize":  # mounted as sitecustomize.py; importing it elsewhere does nothing
    main()
