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
exec .venv/bin/python -m pytest -q -m "" "$@"
