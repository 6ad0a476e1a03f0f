# Builder of nix/checks.nix's lockPins (POSIX sh; sha256sum from $PATH): every overlay patch, as copied
# into the store, must hash to the lock's patch_sha256.
set -eu
printf '%s' "$pins" >pins.sha256
if ! sha256sum -c pins.sha256 >report.txt 2>&1; then
  cat report.txt >&2
  echo "servimg: an overlay patch drifted from $lockFile; if intended, run \`servimg lock\` and review the diff" >&2
  exit 1
fi
{
  echo "lock $lockDigest"
  cat report.txt
} >"$out"
