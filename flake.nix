{
  # The Nix wrapper of servimg (docs/nix.md). Nix never re-implements the builder: each image is
  # `servimg build images/<name>.yaml --runner chroot --to docker-archive:$out/image.tar`, run offline
  # in a derivation whose base blobs are fixed-output derivations pinned by the lock.
  description = "servimg: reproducible, provably-patched serving images for vLLM + LMCache";

  # Pinned in flake.lock by rev + narHash (nixos-24.11). No flake-utils.
  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-24.11";

  outputs = { self, nixpkgs }:
    let
      lib = nixpkgs.lib;
      systems = [ "x86_64-linux" "aarch64-linux" ];
      forAllSystems = f: lib.genAttrs systems (system: f system nixpkgs.legacyPackages.${system});

      # nix/lock.nix (builtins only): the parsed locks; forcing one refuses drift like `servimg build`.
      locks = import ./nix/lock.nix { root = ./.; };

      perSystem = system: pkgs:
        let
          servimg = import ./nix/servimg.nix {
            inherit lib;
            inherit (pkgs) python3Packages;
            root = ./.;
          };
          # The interpreter the builders run: python3 with servimg (and its dependencies) importable.
          python = pkgs.python3.withPackages (_: [ (pkgs.python3Packages.toPythonModule servimg) ]);
          toolchain = {
            inherit system;
            shell = "${pkgs.bash}/bin/sh";
            path = lib.makeBinPath [ pkgs.coreutils ];
            python = "${python}/bin/python3";
            sandboxPath = lib.makeBinPath [ pkgs.util-linux pkgs.coreutils ];
            cacert = "${pkgs.cacert}/etc/ssl/certs/ca-bundle.crt";
          };
          wrapped = import ./nix/default.nix { root = ./.; inherit toolchain; };
          # `nix run .#check -- REF` = `servimg check REF`; `nix run .#ladder -- …` = `servimg ladder …`.
          app = command: {
            type = "app";
            program = "${pkgs.writeShellScriptBin "servimg-${command}" ''exec ${servimg}/bin/servimg ${command} "$@"''}/bin/servimg-${command}";
          };
        in
        {
          inherit servimg wrapped app;
          tests = import ./nix/servimg.nix {
            inherit lib;
            inherit (pkgs) python3Packages;
            root = ./.;
            doCheck = true;
          };
        };

      each = f: forAllSystems (system: pkgs: f (perSystem system pkgs) pkgs);
    in
    {
      # packages.<system>.servimg: the CLI. packages.<system>.<name>: the image of images/<name>.yaml
      # (result/image.tar, result/digest). packages.<system>.<name>-base: its base as an OCI layout.
      packages = each (s: _:
        s.wrapped.images
        // lib.mapAttrs' (name: value: lib.nameValuePair "${name}-base" value) s.wrapped.bases
        // { servimg = s.servimg; default = s.servimg; });

      apps = each (s: _: {
        default = { type = "app"; program = "${s.servimg}/bin/servimg"; };
        check = s.app "check";
        ladder = s.app "ladder";
      });

      # lock-<name>: lock pins; probe-<name>: the in-image probe on the built image; tests: pytest.
      checks = each (s: _: s.wrapped.checks // { tests = s.tests; });

      formatter = forAllSystems (_: pkgs: pkgs.nixpkgs-fmt);

      # The parsed locks (system-independent): nix eval .#lib.locks.images.demo.digest
      lib = { inherit locks; };
    };
}
