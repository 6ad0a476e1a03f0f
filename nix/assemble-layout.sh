# Builder of nix/base.nix's layout derivation (POSIX sh; mkdir and ln from $PATH):
# an OCI image layout whose blobs/sha256/<hex> are symlinks to the blob FODs ($blobs, each named <hex>).
set -eu
mkdir -p "$out/blobs/sha256"
for blob in $blobs; do
  file=${blob##*/}             # <store hash>-<hex>
  ln -s "$blob" "$out/blobs/sha256/${file#*-}"
done
printf '%s' "$index" >"$out/index.json"
printf '%s' "$ociLayout" >"$out/oci-layout"
