#!/bin/bash
# The user's case (issue 40): push an image whose base the registry already holds, to a new repository.
cd "$(dirname "$0")/.."
BEFORE=${BEFORE:?set BEFORE to a checkout of the code to compare (its src/ is used)}
IMG=${IMG:?set IMG to an image to push, e.g. docker-daemon:servimg/vllm:TAG of the main job}
for side in before after before after; do
  repo=127.0.0.1:5000/measure/$side-$RANDOM
  if [ $side = before ]; then py="env PYTHONPATH=$BEFORE/src .venv/bin/python"; else py=".venv/bin/python"; fi
  start=$(date +%s.%N)
  $py -m servimg push "$IMG" "$repo:t" --unsigned > "${TMPDIR:-/tmp}/push-$side.log" 2>&1
  rc=$?
  end=$(date +%s.%N)
  echo "$side rc=$rc $(echo "$end - $start" | bc) s $(grep -c 'mounted from' "${TMPDIR:-/tmp}/push-$side.log") mounted $(grep -c ': uploaded' "${TMPDIR:-/tmp}/push-$side.log") uploaded"
done
