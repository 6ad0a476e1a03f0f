"""`servimg server start|status|stop`: this user's resident servers (servimg.resident)."""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Iterator

from servimg.commands import params
from servimg.commands.context import Context
from servimg.commands.outcome import Outcome, attempt
from servimg.core import jsonview as jv
from servimg.core.errors import ResidentError, ServimgError
from servimg.resident import control

STATUS_FIELDS = ("pid", "served", "running", "idle_timeout", "python", "package")


def server(p: params.Server, ctx: Context) -> Iterator[Outcome]:
    """start: the server of this environment, running; status: one line per server of this user (FAIL
    for a socket no server answers on); stop: every server of this user, each after its running
    commands (a stale socket is removed)."""
    if p.action == "start":
        yield attempt("server", lambda: _started(p.wait))
        return
    try:
        listed = control.servers()
    except ServimgError as exc:
        yield Outcome("server", error=exc)
        return
    if not listed:
        yield Outcome("server", {"servers": 0, "directory": control.where()})
    for path, status in listed:
        if p.action == "stop":
            yield attempt(path, functools.partial(_stopped, path, p.wait))
        elif status is None:
            yield Outcome(path, error=_stale(path))
        else:
            yield Outcome(path, _fields(status))


def _started(wait: float) -> Outcome:
    status = control.start(wait)
    return Outcome(str(status["socket"]), {**_fields(status), "started_now": status["started_now"]})


def _stopped(path: str, wait: float) -> Outcome:
    pid = control.stop(path, wait)
    return Outcome(path, {"stopped": pid} if pid is not None else {"removed": "stale socket, no server"})


def _fields(status: dict[str, object]) -> dict[str, object]:
    since = dt.datetime.fromtimestamp(jv.number(status["started"], "started"), dt.UTC).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )
    return {"started": since, **{k: status[k] for k in STATUS_FIELDS if k in status}}


def _stale(path: str) -> ResidentError:
    return ResidentError(
        f"{path}: no server answers (it ended without removing its socket)",
        hint="`servimg server stop` removes it",
    )
