# Check derivations that need no nixpkgs (builtins.derivation; tools from `toolchain`, see
# nix/default.nix):
#   lockPins image   re-hashes every overlay patch with sha256sum inside a build and compares it with
#                    the lock (evaluation already refused drift via nix/lock.nix; this makes the verdict
#                    a buildable, cacheable check: `nix build .#checks.<system>.lock-<name>`).
#   probe image img  runs `servimg verify docker-archive:<img>/image.tar` (the in-image probe, chroot
#                    runner) on the image derivation's output.
{
  # toolchain: { system, shell, path, python, sandboxPath, ... }. Required.
  toolchain,
  # root: the repository root (a path). Default: the parent of this file's directory.
  root ? ../.,
  # builderScript: the in-sandbox wrapper of servimg's CLI (probe check). Default: ./servimg-sandboxed.py.
  builderScript ? ./servimg-sandboxed.py,
}:
let
  inherit (builtins) concatStringsSep derivation;
  at = rel: root + "/${rel}";
in
{
  lockPins = image:
    derivation {
      name = "servimg-lock-pins-${image.name}";
      inherit (toolchain) system;
      builder = toolchain.shell;
      args = [ ./check-lock.sh ];
      # sha256sum (coreutils).
      PATH = toolchain.path;
      lockDigest = image.digest;
      lockFile = at image.lock_file;
      # "<locked sha256>  <patch in the store>" per overlay: the `sha256sum -c` format.
      pins = concatStringsSep "\n" (map (o: "${o.patch_sha256}  ${at o.patch}") image.overlays) + "\n";
      preferLocalBuild = true;
    };

  probe = image: built:
    derivation {
      name = "servimg-probe-${image.name}";
      inherit (toolchain) system;
      builder = toolchain.python;
      args = [ builderScript "verify-image" ];
      PATH = toolchain.sandboxPath;
      SERVIMG_IMAGE_ARCHIVE = "${built}/image.tar";
      DOCKER_HOST = "unix:///nonexistent/servimg-nix-build-has-no-docker.sock";
      preferLocalBuild = true;
        };
}
