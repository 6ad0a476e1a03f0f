"""The set-up is a guest on the host (README): `scripts/setup.sh` installs and starts what the tests need
without rewriting a file it did not create. A Slurm login or build node keeps its cluster: the tests' Slurm
runs from a private configuration (scripts/slurm.sh: its own SLURM_CONF, munge key and socket, ports and
state under /var/lib/servimg/slurm), and the host's /etc/slurm/slurm.conf stays byte for byte.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO

HOST_CONF = Path("/etc/slurm/slurm.conf")
PRIVATE_CONF = Path(os.environ.get("SERVIMG_SLURM_DIR", "/var/lib/servimg/slurm")) / "slurm.conf"
MARK = b"# The host's own Slurm cluster (written by tests/test_setup.py): servimg must not touch it.\n"

pytestmark = [pytest.mark.root, pytest.mark.slurm, pytest.mark.docker]


def test_setup_keeps_the_hosts_slurm_conf_and_runs_a_private_cluster() -> None:
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip("needs root on Debian")  # CI is both
    created = not HOST_CONF.exists()
    if created:  # a file of this test's own, removed again; an existing one is only read
        HOST_CONF.parent.mkdir(parents=True, exist_ok=True)
        HOST_CONF.write_bytes(MARK + b"ClusterName=host\n")
    before, stat = HOST_CONF.read_bytes(), HOST_CONF.stat()
    try:
        setup = subprocess.run(
            ["bash", "scripts/setup.sh"], cwd=REPO, capture_output=True, text=True, timeout=1200, check=False
        )
        assert setup.returncode == 0, setup.stdout[-2000:] + setup.stderr[-2000:]
        assert HOST_CONF.read_bytes() == before, "the host's slurm.conf was rewritten"
        assert HOST_CONF.stat().st_mtime_ns == stat.st_mtime_ns and HOST_CONF.stat().st_ino == stat.st_ino
        env = {**os.environ, "SLURM_CONF": str(PRIVATE_CONF)}
        told = subprocess.run(["bash", "scripts/slurm.sh", "env"], cwd=REPO, capture_output=True, text=True)
        assert told.stdout.strip() == f"export SLURM_CONF={PRIVATE_CONF}"
        sinfo = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True)
        assert sinfo.returncode == 0 and sinfo.stdout.split()[0] in ("idle", "mix", "alloc"), sinfo
        srun = subprocess.run(
            ["srun", "-N1", "--time=1", "true"], env=env, capture_output=True, text=True, timeout=120
        )
        assert srun.returncode == 0, srun.stderr
        conf = PRIVATE_CONF.read_text()
        assert "SlurmctldPort=6917" in conf and "AuthInfo=socket=" in conf, "its own ports and munge socket"
        assert "/etc/" not in conf, conf
    finally:
        if created:
            HOST_CONF.unlink(missing_ok=True)
