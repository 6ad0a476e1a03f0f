#!/usr/bin/env bash
# Install and start everything servimg's tests and demo need, on a fresh Debian 12 machine (as root):
# Docker Engine (Debian docker.io), the OCI registry (Debian docker-registry) on 127.0.0.1:5000,
# Slurm + munge (scripts/slurm.sh: a one-node cluster for `ladder --on slurm`),
# mmdebstrap (bases are bootstrapped from pinned packages), faketime (the reproducibility tests build under
# another clock), Nix (Debian nix-bin, for the offline flake tests), the ecosystem's tools the interop tests
# drive (skopeo, umoci, podman; docker-credential-pass + pass for the credential-helper tests), and the
# Python venv with servimg + dev tools. Idempotent: safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

export DEBIAN_FRONTEND=noninteractive
need=()
for pair in dockerd:docker.io docker-registry:docker-registry mmdebstrap:mmdebstrap faketime:faketime \
  nix-instantiate:nix-bin skopeo:skopeo umoci:umoci podman:podman \
  docker-credential-pass:golang-docker-credential-helpers pass:pass; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || need+=("${pair#*:}")
done
if ((${#need[@]})); then
  echo "setup: installing ${need[*]}"
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi

# Docker Engine: prefer Debian's client beside Debian's daemon (same API version).
export PATH="/usr/bin:$PATH"
if ! docker info >/dev/null 2>&1; then
  echo "setup: starting dockerd"
  mkdir -p /var/log/servimg
  nohup dockerd >/var/log/servimg/dockerd.log 2>&1 &
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { echo "setup: dockerd did not start; see /var/log/servimg/dockerd.log" >&2; exit 1; }
fi

# The registry: CNCF distribution 2.8 from Debian, loopback only.
if ! curl -fsS http://127.0.0.1:5000/v2/ >/dev/null 2>&1; then
  echo "setup: starting docker-registry on 127.0.0.1:5000"
  mkdir -p /var/lib/servimg-registry /etc/servimg /var/log/servimg
  cat >/etc/servimg/registry.yml <<'YAML'
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: /var/lib/servimg-registry
  delete:
    enabled: true
http:
  addr: 127.0.0.1:5000
YAML
  nohup docker-registry serve /etc/servimg/registry.yml >/var/log/servimg/registry.log 2>&1 &
  for _ in $(seq 1 30); do curl -fsS http://127.0.0.1:5000/v2/ >/dev/null 2>&1 && break; sleep 1; done
  curl -fsS http://127.0.0.1:5000/v2/ >/dev/null || { echo "setup: registry did not start" >&2; exit 1; }
fi

# Slurm (Debian slurm-wlm + munge) as a single-node cluster on 127.0.0.1: `servimg ladder --on slurm`.
bash scripts/slurm.sh start

if [ ! -x .venv/bin/servimg ]; then
  echo "setup: creating .venv"
  python3 -m venv .venv
fi
.venv/bin/pip install -q -e '.[dev]'
echo "setup: ready (docker $(docker version -f '{{.Server.Version}}'), registry 127.0.0.1:5000, .venv)"
