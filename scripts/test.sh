#!/usr/bin/env bash
# The test command (README): set up, lint, type-check, then every test including docker, registry and
# the real demo base (mmdebstrap from pinned Debian packages + vllm/lmcache wheels; cached under
# ~/.cache/servimg after the first run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="/usr/bin:$PATH"
eval "$(bash scripts/slurm.sh env)"  # the private Slurm cluster setup started (the host's stays the host's)
.venv/bin/ruff check src tests benchmarks
.venv/bin/ruff format --check src tests benchmarks
.venv/bin/mypy
# The suite needs tens of GB (several demo images, the Nix store, the registry): the log says what it had.
df -h "${TMPDIR:-/tmp}" "${SERVIMG_CACHE:-$HOME/.cache/servimg}" /var/lib/docker 2>/dev/null || true
exec .venv/bin/python -m pytest -q -m "" "$@"
