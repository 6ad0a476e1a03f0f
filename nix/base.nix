# The base image of one locked definition, as an OCI image layout in the store, every blob a
# fixed-output derivation (FOD) pinned by the lock. builtins only; the tools come from `toolchain`
# (nix/default.nix), so the same expression builds with nixpkgs (flake.nix) or with the host's tools
# (tests/test_nix.py).
#
# Trust chain, all checked by Nix itself (outputHashMode "flat", outputHashAlgo "sha256"):
#   lock.base.manifest_digest ─▶ manifest FOD (its bytes hash to that digest)
#   manifest.config.digest    ─▶ config FOD   (must also equal lock.base.config_digest)
#   manifest.layers[].digest  ─▶ layer FODs   (count must equal lock.base.diff_ids)
#   lock.base.index_digest    ─▶ index FOD    (when the definition pins a multi-platform index; it
#                                              must list lock.base.manifest_digest)
# The layer digests are only known from the manifest, so evaluation reads the manifest FOD
# (import-from-derivation). `servimg build` re-verifies everything inside the image derivation
# (manifest digest, config digest, every diffID).
#
# Where the bytes come from:
#   - a registry ref (`HOST/REPO:TAG`): the FODs fetch by digest with servimg's own registry client
#     (nix/fetch-blob.py; anonymous pull);
#   - a local-only ref (`docker-daemon:`, `oci:`, `docker-archive:`; the demo): nothing to fetch. Each
#     FOD is named after its digest's hex, exactly like a file in an OCI layout's blobs/sha256/, so
#       nix-store --add-fixed sha256 DIR/blobs/sha256/*
#     on a layout holding the base (demo: `servimg base demo --to oci:DIR`) makes every FOD valid
#     without running its builder; otherwise its builder fails with these instructions.
{
  # toolchain: { system, shell, path, python, cacert, ... } (see nix/default.nix). Required.
  toolchain,
  # fetchScript: the registry fetcher run by the FODs of registry bases. Default: ./fetch-blob.py.
  fetchScript ? ./fetch-blob.py,
}:
# image: one entry of (import ./lock.nix { }).images. Required.
image:
let
  inherit (builtins) derivation foldl' fromJSON length readFile stringLength substring toJSON;

  base = image.base;
  hexOf = digest: substring 7 64 digest; # "sha256:<hex>" → "<hex>"
  isRegistry = image.base_transport == "registry";
  unique = foldl' (acc: x: if builtins.elem x acc then acc else acc ++ [ x ]) [ ];

  instructions = ''
    servimg: the base of ${image.definition} (${base.ref}) is local-only, so Nix cannot fetch it.
    Put its blobs into the Nix store by digest, then build again:
      servimg base demo --to oci:/tmp/servimg-base        # the demo base; any OCI layout holding it works
      nix-store --add-fixed sha256 /tmp/servimg-base/blobs/sha256/*
    (each blob must hash to the digest it is named after; the lock pins ${base.manifest_digest})
  '';

  # One blob (or the manifest) by digest: a flat sha256 FOD whose name is the digest's hex.
  blob = kind: digest:
    derivation ({
      name = hexOf digest;
      inherit (toolchain) system;
      outputHashMode = "flat";
      outputHashAlgo = "sha256";
      outputHash = hexOf digest;
      # Fetching is cheaper than asking a remote builder.
      preferLocalBuild = true;
    } // (if isRegistry then {
      builder = toolchain.python;
      args = [ fetchScript kind base.ref digest ];
      # A CA bundle for HTTPS (nixpkgs' cacert in the flake); proxies pass through as usual for FODs.
      SSL_CERT_FILE = toolchain.cacert;
      REQUESTS_CA_BUNDLE = toolchain.cacert;
      impureEnvVars = [ "http_proxy" "https_proxy" "no_proxy" "HTTP_PROXY" "HTTPS_PROXY" "NO_PROXY" ];
    } else {
      builder = toolchain.shell;
      args = [ "-c" "printf '%s' \"$instructions\" >&2; exit 1" ];
      inherit instructions;
    }));

  manifestBlob = blob "manifest" base.manifest_digest;
  # Import-from-derivation: the verified manifest names the config and the layer blobs.
  manifestText = readFile manifestBlob;
  manifest = fromJSON manifestText;
  configDigest = manifest.config.digest;
  layerDigests = map (l: l.digest) manifest.layers;

  checked =
    if configDigest != base.config_digest then
      throw "servimg (nix/base.nix): ${image.lock_file}: the base manifest's config is ${configDigest}, the lock pins ${base.config_digest}"
    else if length layerDigests != length base.diff_ids then
      throw "servimg (nix/base.nix): ${image.lock_file}: the base manifest has ${toString (length layerDigests)} layer(s), the lock pins ${toString (length base.diff_ids)} diffID(s)"
    else true;

  # A pin naming a multi-platform index: the index is fetched too (by its digest) and must list the
  # platform manifest the lock recorded (which platform was chosen is in the YAML definition, which
  # builtins cannot read; `servimg lock` made that choice).
  indexBlob = if base.index_digest == null then null else blob "manifest" base.index_digest;
  indexChecked =
    indexBlob == null
    || builtins.any (m: (m.digest or null) == base.manifest_digest) ((fromJSON (readFile indexBlob)).manifests or [ ])
    || throw "servimg (nix/base.nix): ${image.lock_file}: the pinned index ${base.index_digest} does not list the locked manifest ${base.manifest_digest}";

  blobs = unique (
    [ manifestBlob (blob "blob" configDigest) ]
    ++ map (blob "blob") layerDigests
    ++ (if indexBlob == null then [ ] else [ indexBlob ])
  );

  index = toJSON {
    schemaVersion = 2;
    mediaType = "application/vnd.oci.image.index.v1+json";
    manifests = [{
      mediaType = manifest.mediaType or "application/vnd.oci.image.manifest.v1+json";
      digest = base.manifest_digest;
      size = stringLength manifestText;
    }];
  };

  layout = derivation {
    name = "servimg-base-${image.name}";
    inherit (toolchain) system;
    builder = toolchain.shell;
    args = [ ./assemble-layout.sh ];
    PATH = toolchain.path;
    blobs = builtins.seq checked (builtins.seq indexChecked blobs);
    inherit index;
    ociLayout = ''{"imageLayoutVersion":"1.0.0"}'';
    # Symlinks only: cheap to build locally.
    preferLocalBuild = true;
  };
in
layout // {
  # The manifest (parsed) and the blob FODs, for inspection: nix eval .#demo-base.manifest
  inherit manifest manifestBlob;
  blobFODs = blobs;
}
