#!/usr/bin/env bash
# Install and start what servimg needs on a fresh Debian 12 machine (as root). Idempotent: safe to run
# again; `bash scripts/cleanup.sh` stops what it started.
#
#   bash scripts/setup.sh          everything the tests need (scripts/test.sh)
#   bash scripts/setup.sh demo     only what the main job needs (scripts/demo.sh)
#
# The main job needs Docker Engine (Debian docker.io), the OCI registry (Debian docker-registry) on
# 127.0.0.1:5000, mmdebstrap (the demo base is bootstrapped from pinned packages) and the Python venv with
# servimg. The tests also need faketime (the reproducibility tests build under another clock), Nix (Debian
# nix-bin, the offline flake tests), the ecosystem's tools the interop tests drive (skopeo, umoci, podman;
# docker-credential-pass + pass for the credential-helper tests; gnupg, softhsm2 and node with the
# packages of tests/interop/node for the deploy-side tests of issue 31) and a private one-node Slurm cluster
# (scripts/slurm.sh: its own configuration, munge key and ports; a host's /etc/slurm is never touched).
#
# A guest on the host: it installs Debian packages (and says which, and why, before it does), starts
# daemons only when none answers, and writes only its own files (/var/lib/servimg, /var/log/servimg,
# .venv): never a file under /etc.
set -euo pipefail
cd "$(dirname "$0")/.."

profile=${1:-test}
case "$profile" in
  demo | test) ;;
  *) echo "usage: $0 [demo|test]" >&2; exit 2 ;;
esac
STATE=/var/lib/servimg
LOGS=/var/log/servimg
mkdir -p "$STATE" "$LOGS"

export DEBIAN_FRONTEND=noninteractive
demo_tools="dockerd:docker.io docker-registry:docker-registry mmdebstrap:mmdebstrap"
# qemu-user-static + binfmt-support: multi-platform builds run another architecture's binaries (an arm64
# base's dpkg and python) under qemu through binfmt_misc (docs/platforms.md).
demo_tools="$demo_tools qemu-aarch64-static:qemu-user-static update-binfmts:binfmt-support"
test_tools="faketime:faketime nix-instantiate:nix-bin skopeo:skopeo umoci:umoci podman:podman
  docker-credential-pass:golang-docker-credential-helpers pass:pass gpg:gnupg softhsm2-util:softhsm2
  node:nodejs npm:npm"
wanted=$demo_tools
[ "$profile" = test ] && wanted="$demo_tools $test_tools"
need=()
for pair in $wanted; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || need+=("${pair#*:}")
done
if ((${#need[@]})); then
  echo "setup ($profile): installing Debian packages ${need[*]} (the engine, the registry and the base"
  echo "  bootstrapper$([ "$profile" = test ] && echo ', and the tools the tests drive'))"
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi

# binfmt_misc: mounted (a container may not have it) and qemu's handlers registered (F flag: usable inside
# chroots and containers). Idempotent; where the mount is refused (an unprivileged container) it says so,
# and multi-platform builds refuse with the same reason.
binfmt=/proc/sys/fs/binfmt_misc
if [ ! -e "$binfmt/status" ]; then
  mount -t binfmt_misc binfmt_misc "$binfmt" 2>/dev/null ||
    echo "setup: cannot mount binfmt_misc at $binfmt (unprivileged?): no emulated platform will build" >&2
fi
if [ -e "$binfmt/status" ] && [ ! -e "$binfmt/qemu-aarch64" ]; then
  echo "setup: registering qemu's binfmt_misc handlers (update-binfmts --enable)"
  update-binfmts --enable >/dev/null 2>&1 || true
fi
[ -e "$binfmt/status" ] && [ ! -e "$binfmt/qemu-aarch64" ] &&
  echo "setup: qemu-aarch64 is not registered in binfmt_misc: linux/arm64 builds will refuse" >&2

# Docker Engine: prefer Debian's client beside Debian's daemon (same API version).
export PATH="/usr/bin:$PATH"
if ! docker info >/dev/null 2>&1; then
  echo "setup: starting dockerd (log $LOGS/dockerd.log; scripts/cleanup.sh stops it)"
  nohup dockerd >"$LOGS/dockerd.log" 2>&1 &
  echo $! >"$STATE/dockerd.pid"
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { echo "setup: dockerd did not start; see $LOGS/dockerd.log" >&2; exit 1; }
fi

# The registry: CNCF distribution 2.8 from Debian, loopback only; its configuration is ours, not /etc's.
if ! curl -fsS http://127.0.0.1:5000/v2/ >/dev/null 2>&1; then
  echo "setup: starting docker-registry on 127.0.0.1:5000 (storage $STATE/registry)"
  mkdir -p "$STATE/registry"
  cat >"$STATE/registry.yml" <<YAML
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $STATE/registry
  delete:
    enabled: true
http:
  addr: 127.0.0.1:5000
YAML
  nohup docker-registry serve "$STATE/registry.yml" >"$LOGS/registry.log" 2>&1 &
  echo $! >"$STATE/registry.pid"
  for _ in $(seq 1 30); do curl -fsS http://127.0.0.1:5000/v2/ >/dev/null 2>&1 && break; sleep 1; done
  curl -fsS http://127.0.0.1:5000/v2/ >/dev/null || { echo "setup: registry did not start" >&2; exit 1; }
fi

# Slurm (Debian slurm-wlm + munge), private, for `servimg ladder --on slurm` tests only.
[ "$profile" = test ] && bash scripts/slurm.sh start

if [ ! -x .venv/bin/servimg ]; then
  echo "setup: creating .venv"
  python3 -m venv .venv
fi
if [ "$profile" = test ]; then .venv/bin/pip install -q -e '.[dev]'; else .venv/bin/pip install -q -e .; fi

# The deploy side's own verifiers the interop tests run (tests/interop/node/package.json, pinned by its
# lock): @sigstore/verify and Kyverno's CRD schemas. They need node >= 20.17.
if [ "$profile" = test ]; then
  node_major=$(node -p 'process.versions.node.split(".").map(Number).reduce((a, b, i) => i < 2 ? a * 1000 + b : a)' 2>/dev/null || echo 0)
  if [ "$node_major" -lt 20017 ]; then
    echo "setup: node $(node --version 2>/dev/null || echo missing) is older than 20.17, which @sigstore/verify needs;" >&2
    echo "  install node 20 or later (the tests that run it skip and say so)" >&2
  elif ! cmp -s tests/interop/node/package-lock.json tests/interop/node/node_modules/.servimg-lock; then
    echo "setup: installing the interop tests' node packages (npm ci, tests/interop/node)"
    (cd tests/interop/node && npm ci --no-audit --no-fund --loglevel=error >/dev/null &&
      cp package-lock.json node_modules/.servimg-lock)
  fi
fi
echo "setup ($profile): ready (docker $(docker version -f '{{.Server.Version}}'), registry 127.0.0.1:5000, .venv)"
