"""The resident server (servimg.resident): a command it serves behaves as the same command run in-process —
output, exit status, working directory, umask, environment, signals — and a server is only ever used by
a client of exactly its environment. Real processes throughout: `python -m servimg` clients, servers
they spawn, in a private server directory per test."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from servimg.resident import client, identity, wire
from servimg.resident.server import Job

REPO = Path(__file__).resolve().parent.parent


class Servers:
    """A private server directory (short: a socket's path has 108 bytes) and the client's environment."""

    def __init__(self, where: Path, cwd: Path) -> None:
        self.where = where
        self.cwd = cwd
        self.env = {
            **os.environ,
            identity.DIR_ENV: str(where),
            "SERVIMG_SERVER_IDLE": "60",
            "PYTHONPATH": str(REPO / "src"),
        }
        self.env.pop("SERVIMG_SERVER", None)

    def run(
        self, *argv: str, env: dict[str, str] | None = None, **kw: Any
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "servimg", *argv],
            cwd=kw.pop("cwd", self.cwd),
            env=env or self.env,
            capture_output=True,
            text=True,
            timeout=120,
            **kw,
        )

    def in_process(self, *argv: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        return self.run(*argv, env={**self.env, "SERVIMG_SERVER": "0"}, **kw)

    def start(self) -> dict[str, Any]:
        done = self.run("server", "start", "--json", "--quiet")
        assert done.returncode == 0, done.stderr
        return dict(json.loads(done.stdout.splitlines()[-1]))

    def statuses(self) -> list[dict[str, Any]]:
        done = self.run("server", "status", "--json", "--quiet")
        lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        return [line for line in lines if line.get("status") == "OK" and "pid" in line]

    def served(self) -> int:
        return sum(int(s.get("served", 0)) for s in self.statuses())

    def sockets(self) -> list[Path]:
        return sorted(self.where.glob("*.sock"))


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Servers]:
    where = Path(tempfile.mkdtemp(prefix="sv-", dir="/tmp"))
    os.chmod(where, 0o700)
    cwd = tmp_path / "work"
    cwd.mkdir()
    found = Servers(where, cwd)
    try:
        yield found
    finally:
        found.run("server", "stop", "--quiet")
        shutil.rmtree(where, ignore_errors=True)


def _gone(pid: int | str) -> bool:
    """Ended: no such process, or a zombie its (maybe slow) reaper has not collected yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _wait_for(condition: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


# -- served as in-process -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "argv",
    [
        ("lock", "images/missing.yaml"),  # FAIL: exit 1, the message on stdout/stderr
        ("lock", "images/missing.yaml", "--json"),
        ("build", "--nope"),  # a usage error: exit 2 on stderr
        ("verify", "--help"),
    ],
)
def test_a_served_command_prints_and_exits_as_in_process(servers: Servers, argv: tuple[str, ...]) -> None:
    servers.start()
    before = servers.served()
    served = servers.run(*argv)
    assert servers.served() == before + 1, "the server ran it"
    alone = servers.in_process(*argv)
    assert (served.returncode, served.stdout, served.stderr) == (alone.returncode, alone.stdout, alone.stderr)


def test_relative_paths_and_the_environment_are_the_clients(servers: Servers) -> None:
    """`key generate --out keys` writes under the client's cwd, and encrypts the key because the
    client's environment has SERVIMG_KEY_PASSWORD (the server's does not)."""
    servers.start()
    env = {**servers.env, "SERVIMG_KEY_PASSWORD": "s3cret"}
    done = servers.run("key", "generate", "--out", "keys", env=env)
    assert done.returncode == 0, done.stderr
    assert servers.served() == 1
    assert b"ENCRYPTED PRIVATE KEY" in (servers.cwd / "keys" / "servimg.key").read_bytes()


def test_the_first_command_runs_in_process_and_leaves_a_server(servers: Servers) -> None:
    assert servers.sockets() == []
    first = servers.run("lock", "images/missing.yaml")
    assert first.returncode == 1 and "missing.yaml" in first.stdout + first.stderr
    _wait_for(lambda: servers.statuses(), "the spawned server")
    again = servers.run("lock", "images/missing.yaml")
    assert (again.returncode, again.stdout) == (first.returncode, first.stdout)
    assert servers.served() == 1


def test_no_server_with_servimg_server_0_nor_for_a_usage_error(servers: Servers) -> None:
    assert servers.in_process("lock", "images/missing.yaml").returncode == 1
    assert servers.run("no-such-command").returncode == 2
    assert servers.run("lock", "--no-such-flag").returncode == 2
    assert servers.run("lock", "--help").returncode == 0  # help is read and gone: no server for it
    assert servers.run("build", "images/demo.yaml", "-h").returncode == 0
    time.sleep(1.0)
    assert servers.sockets() == []


# -- signals and hang-ups -----------------------------------------------------------------------------
@pytest.fixture
def silent_registry() -> Iterator[str]:
    """A TCP server that accepts and never answers: a command asking it blocks until interrupted."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}/never/answers:latest"
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        listener.close()


def _blocked(servers: Servers, ref: str, umask: int = 0o022) -> tuple[subprocess.Popen[str], int]:
    """A served `check` blocked on the silent registry, and its worker's pid."""
    status = servers.start()
    client = subprocess.Popen(
        [sys.executable, "-m", "servimg", "check", ref],
        cwd=servers.cwd,
        env=servers.env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: os.umask(umask),
    )
    server_pid = int(status["pid"])
    workers: list[int] = []

    def running() -> bool:
        children = Path(f"/proc/{server_pid}/task/{server_pid}/children").read_text().split()
        workers[:] = [int(c) for c in children]
        return bool(workers)

    _wait_for(running, "the worker")
    time.sleep(1.0)  # well inside the registry request
    return client, workers[0]


def test_the_worker_is_the_clients_process(servers: Servers, silent_registry: str) -> None:
    """What /proc says of the worker: the client's stdin, stdout and stderr (the same pipes), working
    directory and umask; its own process group (signals reach what it started)."""
    client, worker = _blocked(servers, silent_registry, umask=0o027)
    try:
        for fd in (0, 1, 2):
            assert os.readlink(f"/proc/{worker}/fd/{fd}") == os.readlink(f"/proc/{client.pid}/fd/{fd}")
        assert os.readlink(f"/proc/{worker}/cwd") == str(servers.cwd)
        status = Path(f"/proc/{worker}/status").read_text()
        assert "Umask:\t0027" in status, status
        assert os.getpgid(worker) == worker
    finally:
        client.kill()
        client.communicate(timeout=60)


def test_ctrl_c_interrupts_the_served_command_as_in_process(servers: Servers, silent_registry: str) -> None:
    client, worker = _blocked(servers, silent_registry)
    client.send_signal(signal.SIGINT)
    out, err = client.communicate(timeout=60)
    assert client.returncode == 130, (out, err)
    assert "FAIL: interrupted; nothing was published" in err
    _wait_for(lambda: _gone(worker), "the worker to end")


def test_a_signal_that_kills_the_worker_kills_the_client_the_same_way(
    servers: Servers, silent_registry: str
) -> None:
    client, _worker = _blocked(servers, silent_registry)
    client.send_signal(signal.SIGTERM)
    client.communicate(timeout=60)
    assert client.returncode == -signal.SIGTERM


def test_a_client_that_dies_takes_its_command_with_it(servers: Servers, silent_registry: str) -> None:
    client, worker = _blocked(servers, silent_registry)
    client.kill()
    client.communicate(timeout=60)
    _wait_for(lambda: _gone(worker), "the orphaned worker to be terminated")
    assert servers.statuses()[0]["running"] == 0


# -- which server, and when none ----------------------------------------------------------------------
def test_another_environment_gets_another_server(servers: Servers) -> None:
    servers.start()
    other = {**servers.env, "PYTHONHASHSEED": "7"}  # read by the interpreter at its start
    done = servers.run("server", "start", "--json", "--quiet", env=other)
    assert done.returncode == 0, done.stderr
    assert len(servers.sockets()) == 2
    assert servers.run("lock", "images/missing.yaml", env=other).returncode == 1
    by_socket = {s["target"]: s["served"] for s in servers.statuses()}
    assert sorted(by_socket.values()) == [0, 1]


def test_a_server_that_died_is_replaced(servers: Servers) -> None:
    status = servers.start()
    os.kill(int(status["pid"]), signal.SIGKILL)
    _wait_for(lambda: _gone(status["pid"]), "the server to die")
    assert servers.sockets(), "its socket stays behind"
    done = servers.run("lock", "images/missing.yaml")  # in-process: nobody answers on the socket
    assert done.returncode == 1 and "missing.yaml" in done.stdout + done.stderr
    _wait_for(lambda: any(s.get("pid") not in (None, status["pid"]) for s in servers.statuses()), "a new one")


def test_an_idle_server_leaves_and_takes_its_files(servers: Servers) -> None:
    env = {**servers.env, "SERVIMG_SERVER_IDLE": "0.5"}
    done = servers.run("server", "start", "--quiet", env=env)
    assert done.returncode == 0, done.stderr
    _wait_for(lambda: list(servers.where.iterdir()) == [], "the idle server to leave")


def test_stop_ends_every_server_and_removes_a_stale_socket(servers: Servers) -> None:
    status = servers.start()
    stale = servers.where / ("0" * 32 + ".sock")
    stale.touch()
    listed = servers.statuses()
    assert len(listed) == 1  # the stale one is a FAIL line, not JSON of a server
    status_run = servers.run("server", "status", "--quiet")
    assert status_run.returncode == 1 and "no server answers" in status_run.stdout + status_run.stderr
    stopped = servers.run("server", "stop", "--json", "--quiet")
    assert stopped.returncode == 0, stopped.stderr
    results = [json.loads(line) for line in stopped.stdout.splitlines()]
    assert {r.get("stopped") for r in results} == {status["pid"], None}
    assert servers.sockets() == []
    assert _gone(status["pid"])


@pytest.mark.root
def test_another_users_request_is_refused(servers: Servers) -> None:
    """The directory is private (0700); behind it, the server checks the peer's uid (SO_PEERCRED)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to connect as another user")
    status = servers.start()
    os.chmod(servers.where, 0o711)
    os.chmod(status["target"], 0o666)
    probe = (
        # The refusal comes before anything is read (another user's bytes are never unmarshalled).
        "import sys; from servimg.resident import wire; s = wire.connect(sys.argv[1]); "
        "print(wire.receive(s)[0])"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, status["target"]],
        env={"PYTHONPATH": str(REPO / "src")},
        capture_output=True,
        text=True,
        user=65534,
        group=65534,
        timeout=30,
    )
    os.chmod(servers.where, 0o700)
    assert "another user" in done.stdout, done.stdout + done.stderr


# -- pure parts ---------------------------------------------------------------------------------------
def test_the_identity_follows_what_a_process_fixes_at_start() -> None:
    env = {"HOME": "/root", "PATH": "/usr/bin"}
    same = identity.document(env)
    assert identity.document(dict(env)) == same
    assert identity.document({**env, "SERVIMG_CACHE": "/elsewhere", "PATH": "/bin"}) == same  # read later
    for name, value in (("PYTHONPATH", "/x"), ("LD_PRELOAD", "libfaketime.so.1"), ("FAKETIME", "-1d")):
        assert identity.document({**env, name: value}) != same, name
    assert identity.document(env, path=[*sys.path, "/nowhere"]) != same
    assert len(identity.name_of(same)) == 32


def test_a_request_is_refused_with_every_problem_named() -> None:
    with pytest.raises(wire.ProtocolError) as caught:
        Job.parse({"run": "build", "env": {"A": 1}, "argv0": None, "umask": 0o1777}, [0, 1])
    assert str(caught.value).split("; ") == [
        "run: not a list of strings",
        "env: not a mapping of strings",
        "argv0: not a string",
        "umask: not a mode",
        "2 descriptors, not 4 (stdin, stdout, stderr, cwd)",
    ]


def test_a_server_directory_others_can_enter_is_not_used(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o755)
    where, why = identity.server_dir({identity.DIR_ENV: str(shared)})
    assert where is None and "mode 0700" in why
    private = tmp_path / "private"
    where, why = identity.server_dir({identity.DIR_ENV: str(private)})
    assert where == str(private) and why == "" and private.stat().st_mode & 0o777 == 0o700
    deep = tmp_path / ("d" * 100)  # a socket's path has 108 bytes: no server rather than one that fails
    where, why = identity.server_dir({identity.DIR_ENV: str(deep)})
    assert where is None and "too long" in why


def test_a_server_that_cannot_start_is_not_started_by_every_command(servers: Servers) -> None:
    """A server that fails before it serves leaves its log (why); for a minute after, commands run
    in-process without spawning another. One that served and died is replaced at once (above)."""
    assert servers.run("lock", "images/missing.yaml").returncode == 1
    _wait_for(lambda: servers.statuses(), "the spawned server")
    log = next(servers.where.glob("*.log"))
    assert client.SERVING in log.read_bytes()  # what tells a serving server's log from a failed one's
    pid = servers.statuses()[0]["pid"]
    assert servers.run("server", "stop", "--quiet").returncode == 0
    log.write_bytes(b"servimg server 1: Traceback (most recent call last): ...\n")  # died at its start
    for _ in range(2):
        assert servers.run("lock", "images/missing.yaml").returncode == 1
    time.sleep(1.0)  # a spawned server would have truncated the log at once (its first step)
    assert log.read_bytes().startswith(b"servimg server 1: Traceback")
    assert servers.sockets() == [] and _gone(pid)


def test_the_spawned_server_holds_no_descriptor_of_its_client(servers: Servers) -> None:
    """A pipe the client inherited (here as fd 3+) must reach EOF when the client exits, although the
    server it spawned lives on: otherwise whoever reads that pipe waits for the server's idle timeout."""
    read, write = os.pipe()
    try:
        done = servers.run("lock", "images/missing.yaml", pass_fds=(write,))
        assert done.returncode == 1
        os.close(write)
        write = -1
        _wait_for(lambda: servers.statuses(), "the spawned server")
        os.set_blocking(read, False)
        assert os.read(read, 1) == b"", "EOF: nobody holds the write end any more"
    finally:
        os.close(read)
        if write != -1:
            os.close(write)


def test_a_message_that_does_not_decode_is_a_protocol_error() -> None:
    """The server reads requests in a loop that must survive any bytes a peer sends."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.sendall((5).to_bytes(4, "big") + b"\xffjunk")
        with pytest.raises(wire.ProtocolError, match="does not decode"):
            wire.receive(ours)
