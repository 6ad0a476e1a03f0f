# The servimg CLI from pyproject.toml, with nixpkgs' Python packaging (PEP 517 build, setuptools).
# Name, version and the runtime dependencies are read from pyproject.toml, so they cannot drift from it.
# With doCheck = true this is the test-suite check: pytest without the tests that need a Docker Engine,
# the registry, the demo base, root or nix (none of which a Nix build sandbox has).
{
  # lib: nixpkgs' lib (fileset, toLower). Required.
  lib,
  # python3Packages: the package set to build with (nixos-24.11: CPython 3.12). Required.
  python3Packages,
  # root: the repository root, a path. Default: the parent of this file's directory.
  root ? ../.,
  # doCheck: run the offline test subset (checks.<system>.tests). Default: false (the package).
  doCheck ? false,
  # pytestMarkers: the tests to run when doCheck. Default: every test that needs nothing outside the sandbox.
  pytestMarkers ? "not docker and not registry and not demo and not root and not nix",
}:
let
  pyproject = builtins.fromTOML (builtins.readFile (root + "/pyproject.toml"));
  project = pyproject.project;
  # "PyYAML>=6.0" → pyyaml: the nixpkgs attribute of each [project] dependency.
  attrOf = requirement: lib.toLower (builtins.head (builtins.match "([A-Za-z0-9_.-]+).*" requirement));
  dependency = requirement:
    let name = attrOf requirement; in
    python3Packages.${name} or (throw "nix/servimg.nix: pyproject dependency ${requirement}: no python3Packages.${name}");
in
python3Packages.buildPythonApplication {
  pname = project.name;
  inherit (project) version;
  # PEP 517 build from pyproject.toml (the build-system's setuptools), not setup.py.
  pyproject = true;
  # The package builds from pyproject.toml, README.md and src/ only; the test check takes the whole
  # (git-tracked, in a flake) tree, since tests read images/, overlays/ and fixtures of their own.
  src =
    if doCheck then root
    else
      lib.fileset.toSource {
        inherit root;
        fileset = lib.fileset.unions [ (root + "/pyproject.toml") (root + "/README.md") (root + "/src") ];
      };
  build-system = [ python3Packages.setuptools ];
  # pyyaml, docker, requests, rich, cryptography, pynacl, python-pkcs11, packaging (pyproject
  # [project].dependencies).
  dependencies = map dependency project.dependencies;

  inherit doCheck;
  nativeCheckInputs = [ python3Packages.pytestCheckHook python3Packages.hypothesis ];
  pytestFlagsArray = [ "-m" pytestMarkers "-p" "no:cacheprovider" ];
  # hypothesis writes its example database under $HOME.
  preCheck = ''
    export HOME=$(mktemp -d)
  '';
  pythonImportsCheck = [ "servimg" "servimg.cli" ];

  meta = {
    description = project.description;
    license = lib.licenses.asl20;
    mainProgram = "servimg";
    platforms = lib.platforms.linux;
  };
}
