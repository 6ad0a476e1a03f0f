# One image: `servimg build images/<name>.yaml --runner chroot --to docker-archive:$out/image.tar`, run
# by Nix offline (no network in the sandbox; no Docker Engine), from the locked inputs only. builtins
# only; the tools come from `toolchain` (nix/default.nix).
#
# Output ($out):
#   image.tar    docker-archive (`docker load < result/image.tar`)
#   digest       the OCI manifest digest, the same one `servimg build` prints
#   build.json   servimg's --json result (config digest, tag, lock digest, layer)
#
# The builder is nix/servimg-sandboxed.py, which calls servimg's CLI in-process (see its docstring for
# the three environment stopgaps). Nix starts it with an empty environment plus the attributes below
# and its own fixed variables (HOME=/homeless-shelter, PATH from here, TMPDIR, out, NIX_*):
# tests/test_nix.py builds this very derivation offline and compares its digest with the CLI's.
{
  # toolchain: { system, python, sandboxPath, ... } (see nix/default.nix). Required.
  toolchain,
  # src: the repository subset servimg build reads (images/, overlays/, verify/). Required.
  src,
  # builderScript: the in-sandbox wrapper of servimg's CLI. Default: ./servimg-sandboxed.py.
  builderScript ? ./servimg-sandboxed.py,
}:
{
  # image: one entry of (import ./lock.nix { }).images (forcing it checks the lock; throws on drift).
  image,
  # baseLayout: the base as an OCI layout in the store (nix/base.nix). Required.
  baseLayout,
}:
builtins.derivation {
  name = "servimg-image-${image.name}";
  inherit (toolchain) system;
  builder = toolchain.python;
  args = [ builderScript "build-image" ];
  # unshare (util-linux) and chroot (coreutils) for servimg's chroot runner and its probe.
  PATH = toolchain.sandboxPath;
  SERVIMG_SRC = src;
  SERVIMG_DEFINITION = image.definition;
  SERVIMG_BASE_LAYOUT = baseLayout;
  # The platform manifest the lock recorded, and the multi-platform index the definition pins ("" if none).
  SERVIMG_BASE_MANIFEST = image.base.manifest_digest;
  SERVIMG_BASE_INDEX = if image.base.index_digest == null then "" else image.base.index_digest;
  # The lock digest nix/lock.nix computed: the builder refuses a servimg that built from another lock.
  SERVIMG_LOCK_DIGEST = image.digest;
  # servimg takes the layer mtime and the `created` time from the lock, not from the environment; the
  # same value is exported so that any tool honouring SOURCE_DATE_EPOCH agrees with it.
  SOURCE_DATE_EPOCH = toString image.source_date_epoch;
  # There is no engine in a build: say so explicitly, so that servimg never finds one (in a Nix build
  # without a sandbox the host's /var/run/docker.sock would otherwise be visible).
  DOCKER_HOST = "unix:///nonexistent/servimg-nix-build-has-no-docker.sock";
  # A multi-hundred-MB copy of local inputs: not worth shipping to a remote builder.
  preferLocalBuild = true;
}
