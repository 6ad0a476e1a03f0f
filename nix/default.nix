# Everything servimg's flake exposes that needs no nixpkgs, as a function of a `toolchain` (the programs
# the builders run). flake.nix passes nixpkgs' tools; tests/test_nix.py passes the host's (/bin/sh,
# /usr/bin, the project's venv) to evaluate and build offline. builtins only.
#
#   images.<name>      the image (nix/image.nix): $out/image.tar, $out/digest, $out/build.json
#   bases.<name>       its base as an OCI layout of fixed-output blobs (nix/base.nix)
#   checks.lock-<name> lock pins (nix/checks.nix), checks.probe-<name> the probe on the built image
#   locks              nix/lock.nix's result (locks.images.<name>: the parsed, checked lock)
{
  # root: the repository root, a path. Default: the parent of this file's directory.
  root ? ../.,
  # toolchain: the programs the builders run, all absolute paths. Required. Attributes:
  #   system       the derivations' system, e.g. "x86_64-linux"
  #   shell        a POSIX sh (assemble-layout.sh, check-lock.sh)
  #   path         $PATH for those scripts: mkdir, ln, sha256sum (coreutils)
  #   python       a python3 that can `import servimg` (image, probe and registry-fetch builders)
  #   sandboxPath  $PATH for servimg in a build: unshare (util-linux) and chroot (coreutils)
  #   cacert       a CA bundle file for registry fetches (registry bases only; may be null otherwise)
  toolchain,
}:
let
  inherit (builtins) attrNames listToAttrs mapAttrs stringLength substring;

  locks = import ./lock.nix { inherit root; };

  # The repository subset `servimg build` reads: images/ (definitions, locks), overlays/ (patches) and
  # the bundled ladders and probes (verify/ladders, verify/probes).
  # Other edits (src/, docs/, tests/) do not rebuild images; servimg itself comes in via toolchain.python.
  prefix = toString root + "/";
  relative = path: substring (stringLength prefix) (stringLength path) path;
  under = dir: rel: rel == dir || substring 0 (stringLength dir + 1) rel == "${dir}/";
  src = builtins.path {
    path = root;
    name = "servimg-image-inputs";
    filter = path: _type: let rel = relative (toString path); in
      under "images" rel || under "overlays" rel
      # The ladders and probe sets a definition bundles (`ladder:`): "verify" itself, to descend.
      || rel == "verify" || under "verify/ladders" rel || under "verify/probes" rel;
  };

  base = import ./base.nix { inherit toolchain; };
  image = import ./image.nix { inherit toolchain src; };
  checks = import ./checks.nix { inherit toolchain root; };

  bases = mapAttrs (_: lock: base lock) locks.images;
  images = mapAttrs (name: lock: image { image = lock; baseLayout = bases.${name}; }) locks.images;
  named = f: listToAttrs (map (name: { name = f.prefix + name; value = f.value name; }) (attrNames locks.images));
in
{
  inherit locks src bases images;
  checks =
    named { prefix = "lock-"; value = name: checks.lockPins locks.images.${name}; }
    // named { prefix = "probe-"; value = name: checks.probe locks.images.${name} images.${name}; };
}
