"""The architecture, as tests: the import graph of src/servimg reads top-down, no test patches a private name
of servimg, and every lazy (function-level) import of a servimg module is listed with its reason.

Layers (lowest first; docs/architecture.md): `core` < `cache` < `oci` < `inimage` < `backends` < the concerns
(`ladder`; then the build's rooms, each above the one before: `definitions` < `patching` < `proof` <
`assembly` < `authoring`; then `bases`, and the provenance rooms, each above the one before: `signing` <
`statements` < `formats` < `judging` < `reports` < `attesting`) < `invocation` / `render` < `commands` <
`cli`. The CLI runs in the process the user started: there is no resident server (issue 39). A module imports
only from its own layer or lower ones, at module level and inside functions alike: a function-level import is
still a dependency, only a later one. Among the concerns, `ladder` is the lowest (it runs and judges an image
it is given); the build's rooms may use `ladder` (the build bundles and locks the ladder, and ships the
witness hook); the provenance rooms and `bases` may use the build's rooms and `ladder`.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import get_args, get_origin

from servimg import __version__ as servimg_version
from servimg import cli
from servimg.assembly import context as assembly_context
from servimg.assembly import seams
from servimg.core import context as core_context
from servimg.oci import store

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
PACKAGE = SRC / "servimg"

_BELOW_CONCERNS = {"core", "cache", "oci", "inimage", "backends"}
# The build's rooms (issue 39: builder/ split by concept), lowest first: each may use the ones before it.
BUILD_ROOMS = ("definitions", "patching", "proof", "assembly", "authoring")
# What was provenance/ (issue 49: five concepts in one folder), lowest first: keys and envelopes; what a
# build states; the formats those statements take at a place; judging an image by them; reports made
# from the judgement; and the attesting sink and promotion, which use all of these.
PROVENANCE_ROOMS = ("signing", "statements", "formats", "judging", "reports", "attesting")
PROVENANCE_PACKAGES = tuple(f"servimg.{room}" for room in PROVENANCE_ROOMS)
_CONCERNS = {*BUILD_ROOMS, *PROVENANCE_ROOMS, "ladder", "placement", "bases"}
MAY_IMPORT: dict[str, set[str]] = {
    "core": {"core"},
    "cache": {"core", "cache"},
    "oci": {"core", "cache", "oci"},
    "inimage": {"core", "oci", "inimage"},
    "backends": _BELOW_CONCERNS,
    "ladder": _BELOW_CONCERNS | {"ladder"},
    # Where a ladder's chains run when not here (slurm, k8s, the node-side entry): above the ladder it
    # places, used only by the ladder command (issue 49 took it out of ladder/).
    "placement": _BELOW_CONCERNS | {"ladder", "placement"},
    **{room: _BELOW_CONCERNS | {"ladder", *BUILD_ROOMS[: i + 1]} for i, room in enumerate(BUILD_ROOMS)},
    **{
        room: _BELOW_CONCERNS | {*BUILD_ROOMS, "ladder", *PROVENANCE_ROOMS[: i + 1]}
        for i, room in enumerate(PROVENANCE_ROOMS)
    },
    "bases": _BELOW_CONCERNS | {*BUILD_ROOMS, "bases"},
    # One run of a command at the command line's edge (flags, parameters, outcomes, context, session):
    # what every command module uses, so below them; issue 49 took it out of commands/.
    "invocation": _BELOW_CONCERNS | _CONCERNS | {"invocation"},
    "commands": _BELOW_CONCERNS | _CONCERNS | {"invocation", "commands"},
    "cli": _BELOW_CONCERNS | _CONCERNS | {"invocation", "commands", "cli"},
}
# Top-level modules (not in a subpackage) and the layer each belongs to.
TOP_LEVEL = {
    "servimg": "core",
    "servimg.commands": "commands",
    "servimg.render": "invocation",
    "servimg.cli": "cli",
    "servimg.__main__": "cli",  # `python -m servimg`: the CLI, nothing else
}

# Every lazy import of a servimg module in src/, by (importer, imported), with what forces it (the import
# cycle that hoisting it would close, as its chain). Empty: the redesign hoisted every one, and no cycle
# forces any. The list only ever shrinks back to empty; a new entry needs its reason.
LAZY_ALLOWED: dict[tuple[str, str], str] = {}

# Modules that must have no lazy servimg import at all.
HOISTED = (
    "servimg.core.",
    "servimg.oci.",
    "servimg.inimage.",
    "servimg.definitions.definition",
    "servimg.definitions.lock",
    "servimg.patching.overlay",
    "servimg.ladder.definition",
)


@dataclass(frozen=True)
class Edge:
    importer: str
    imported: str
    where: str  # path:line
    lazy: bool  # inside a function: runs at call time, not at import time
    type_only: bool  # under `if TYPE_CHECKING:`: never runs

    def __str__(self) -> str:
        return f"{self.importer} -> {self.imported} ({self.where})"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> str | None:
    if module in TOP_LEVEL:
        return TOP_LEVEL[module]
    parts = module.split(".")
    if len(parts) >= 2 and parts[1] in MAY_IMPORT:
        return parts[1]
    if len(parts) >= 2 and f"servimg.{parts[1]}" in TOP_LEVEL:  # a top-level module grown into a package
        return TOP_LEVEL[f"servimg.{parts[1]}"]
    return None


def _resolve(name: str, known: dict[str, Path]) -> str:
    """The deepest servimg module `name` names (`servimg.oci.image.Image` → `servimg.oci.image`)."""
    while name not in known and "." in name:
        name = name.rpartition(".")[0]
    return name


def _imports(tree: ast.AST) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool, bool]]:
    """Every import statement with (lazy, type_only)."""

    def walk(
        node: ast.AST, lazy: bool, type_only: bool
    ) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                yield child, lazy, type_only
            child_lazy = lazy or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            guarded = isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test)
            if guarded:
                assert isinstance(child, ast.If)
                for stmt in child.body:
                    yield from walk(ast.Module(body=[stmt], type_ignores=[]), child_lazy, True)
                for stmt in child.orelse:
                    yield from walk(ast.Module(body=[stmt], type_ignores=[]), child_lazy, type_only)
            else:
                yield from walk(child, child_lazy, type_only)

    yield from walk(tree, False, False)


def edges() -> list[Edge]:
    known = modules()
    out = []
    for importer, path in known.items():
        package = importer if path.name == "__init__.py" else importer.rpartition(".")[0]
        for node, lazy, type_only in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                names = [f"{base}.{alias.name}" for alias in node.names]
            for name in names:
                if name != "servimg" and not name.startswith("servimg."):
                    continue
                imported = _resolve(name, known)
                if imported != importer:
                    where = f"{path.relative_to(ROOT)}:{node.lineno}"
                    out.append(Edge(importer, imported, where, lazy, type_only))
    return out


# ----------------------------------------------------------------------------------------- (a) layers
def test_every_module_has_a_layer() -> None:
    unplaced = sorted(m for m in modules() if layer_of(m) is None)
    assert unplaced == [], f"modules in no layer (add them to a subpackage or to TOP_LEVEL): {unplaced}"


def test_imports_go_only_to_the_same_or_a_lower_layer() -> None:
    upward = []
    for edge in edges():
        src, dst = layer_of(edge.importer), layer_of(edge.imported)
        if src is not None and dst is not None and dst not in MAY_IMPORT[src]:
            kind = "lazy " if edge.lazy else ""
            upward.append(f"{kind}import {edge}: layer {src!r} may not import from {dst!r}")
    assert upward == [], "imports against the layer order:\n" + "\n".join(upward)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _path(graph: dict[str, set[str]], start: str, goal: str) -> list[str]:
    """A shortest import chain start → … → goal (breadth first)."""
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph.get(v, ())):
                if w == goal:
                    chain = [w, v]
                    while chain[-1] != start:
                        chain.append(previous[chain[-1]])
                    return chain[::-1]
                if w not in previous and w != start:
                    previous[w] = v
                    nxt.append(w)
        frontier = nxt
    return []


def import_time_graph() -> dict[str, set[str]]:
    """Edges that run when a module is imported (no function-level, no TYPE_CHECKING imports)."""
    graph: dict[str, set[str]] = {}
    for edge in edges():
        if not edge.lazy and not edge.type_only:
            graph.setdefault(edge.importer, set()).add(edge.imported)
    return graph


def test_no_import_cycles() -> None:
    graph = import_time_graph()
    cycles = [" -> ".join(_path(graph, c[0], c[0])) for c in _cycles(graph)]
    assert cycles == [], "import cycles at module level:\n" + "\n".join(cycles)


# --------------------------------------------------------------------------------------- (c) lazy imports
def test_lazy_imports_are_only_the_listed_ones() -> None:
    graph = import_time_graph()
    unlisted = set()
    for edge in edges():
        if edge.lazy and (edge.importer, edge.imported) not in LAZY_ALLOWED:
            chain = _path(graph, edge.imported, edge.importer)
            why = (
                f"hoisting it closes the cycle {' -> '.join([edge.importer, *chain])}: break the cycle, or "
                f"list ({edge.importer!r}, {edge.imported!r}) in LAZY_ALLOWED with that chain"
                if chain
                else "no cycle forces it: hoist it to the top of the module"
            )
            unlisted.add(f"{edge} is a function-level import; {why}")
    assert sorted(unlisted) == [], "\n".join(sorted(unlisted))


def test_hoisted_modules_have_no_lazy_imports() -> None:
    lazy = sorted(str(e) for e in edges() if e.lazy and e.importer.startswith(HOISTED))
    listed = sorted(f"{a} -> {b}" for a, b in LAZY_ALLOWED if a.startswith(HOISTED))
    assert lazy == [], f"function-level imports in modules kept free of them: {lazy}"
    assert listed == [], f"LAZY_ALLOWED may not name these modules: {listed}"


# ------------------------------------------------------------------------------ (b) no private patches
SCANNED = ("tests", "scripts", "nix", "benchmarks")


def _servimg_names(tree: ast.AST) -> set[str]:
    """Local names bound to a servimg module, to something imported from one (`from servimg.x import
    y [as z]`, `import servimg.x as z`) or to what calling one of those returned (`s = BlobStore(...)`,
    `with RegistryClient(...) as c`): what an assignment to `NAME._private` would patch."""
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("servimg"):
            bound |= {alias.asname or alias.name for alias in node.names}
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("servimg"):
                    bound.add(alias.asname or alias.name.split(".")[0])
    made: set[str] = set()
    for node in ast.walk(tree):
        pairs: list[tuple[ast.expr, ast.expr | None]] = []
        if isinstance(node, ast.Assign):
            pairs = [(t, node.value) for t in node.targets]
        elif isinstance(node, ast.AnnAssign):
            pairs = [(node.target, node.value)]
        elif isinstance(node, ast.With):
            pairs = [(i.optional_vars, i.context_expr) for i in node.items if i.optional_vars is not None]
        for target, value in pairs:
            if (
                isinstance(target, ast.Name)
                and isinstance(value, ast.Call)
                and _root_name(value.func) in bound
            ):
                made.add(target.id)
    return bound | made


def _root_name(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_patches(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    servimg = _servimg_names(tree)
    found = []

    def on_servimg(target: ast.expr) -> bool:
        return _root_name(target) in servimg

    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            if isinstance(target, ast.Attribute) and _private(target.attr) and on_servimg(target.value):
                found.append(f"{shown}:{target.lineno}: assigns {ast.unparse(target)}")
        if isinstance(node, ast.Call) and len(node.args) >= 2:
            func = ast.unparse(node.func)
            obj, attr = node.args[0], node.args[1]
            dotted = obj.value if isinstance(obj, ast.Constant) and isinstance(obj.value, str) else ""
            if func.endswith("monkeypatch.setattr") and dotted.startswith("servimg."):
                if _private(dotted.rpartition(".")[2]):  # monkeypatch.setattr("servimg.x.y._z", value)
                    found.append(f"{shown}:{node.lineno}: {func}({dotted!r})")
            elif (func == "setattr" or func.endswith("monkeypatch.setattr")) and on_servimg(obj):
                if not isinstance(attr, ast.Constant):
                    found.append(f"{shown}:{node.lineno}: {func} of a computed name")
                elif isinstance(attr.value, str) and _private(attr.value):
                    found.append(f"{shown}:{node.lineno}: {func}({ast.unparse(obj)}, {attr.value!r})")
    return found


def test_nothing_patches_a_private_name_of_servimg() -> None:
    files = [p for top in SCANNED for p in sorted((ROOT / top).rglob("*.py")) if "__pycache__" not in p.parts]
    assert files
    found = [hit for path in files for hit in private_patches(path)]
    assert found == [], "private names of servimg patched (pass a seam instead):\n" + "\n".join(found)


def test_the_private_patch_scan_sees_what_it_looks_for(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from servimg.oci.store import BlobStore\nimport servimg.backends.layout as layout\n"
        "BlobStore._writer = None\nsetattr(layout, '_write_file', None)\n"
        "store = BlobStore(None)\nstore._root = None\nother = object()\nother._x = 1\n"
        "def t(monkeypatch):\n    monkeypatch.setattr(layout, '_copy_blob', None)\n"
        "    monkeypatch.setattr(layout, 'write_layout', None)\n"
        "    monkeypatch.setattr('servimg.backends.layout._copy_blob', None)\n"
    )
    hits = private_patches(sample)
    assert sorted(h.split(": ", 1)[1] for h in hits) == [
        "assigns BlobStore._writer",
        "assigns store._root",
        "monkeypatch.setattr('servimg.backends.layout._copy_blob')",
        "monkeypatch.setattr(layout, '_copy_blob')",
        "setattr(layout, '_write_file')",
    ]


# --------------------------------------------------------------------------- (d) what a command loads
# Third-party packages a command pays for only when it needs them (≈0.1–0.3 s each to import).
HEAVY = ("docker", "requests", "urllib3", "pydantic", "yaml", "cryptography", "rich")


def _loaded_after(code: str) -> list[str]:
    """The modules a fresh interpreter holds after running `code` (servimg from this checkout; printed
    with repr, so the probe itself imports nothing)."""
    probe = f"import sys\n{code}\nprint(repr(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", probe],
        env={"PYTHONPATH": str(SRC)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return list(ast.literal_eval(out))


def _heavy(modules: list[str]) -> list[str]:
    return sorted({m.split(".")[0] for m in modules if m.split(".")[0] in HEAVY})


def test_parsing_imports_no_command_and_no_concern_behind_one() -> None:
    """`servimg --help`, `--version` and every parse: the CLI imports the session (reporter, context,
    exit status) statically, and names each command's function as a string in its one table, loaded as
    that command runs; so parsing imports no command module, no provenance, ladder runner, base builder
    or build pipeline, and no third-party package (not even yaml: nothing is read before a command runs)."""
    loaded = _loaded_after("import servimg.cli; servimg.cli.parser().parse_args(['build', 'x.yaml'])")
    commands = {c.run.function.partition(":")[0] for c in cli.COMMANDS}
    commands |= {c.run.signed.partition(":")[0] for c in cli.COMMANDS if c.run.signed}
    assert sorted(commands & set(loaded)) == []
    behind = (*PROVENANCE_PACKAGES, "servimg.ladder.runner", "servimg.bases", "servimg.assembly.pipeline")
    assert [m for m in loaded if m.startswith(behind)] == []
    assert _heavy(loaded) == []


CLI_IMPORT_BUDGET = 12  # servimg modules that `import servimg.cli` may load (issue 49; it loaded 69)


def test_importing_the_cli_loads_the_parser_only() -> None:
    """`servimg --help` imports the CLI: its table, flags and parameters, and no context, seam, backend,
    proof, cache or image code (the session that runs a command is loaded with the command)."""
    loaded = [m for m in _loaded_after("import servimg.cli") if m == "servimg" or m.startswith("servimg.")]
    assert len(loaded) <= CLI_IMPORT_BUDGET, loaded
    below = ("servimg.backends", "servimg.proof", "servimg.assembly", "servimg.oci", "servimg.cache")
    assert [m for m in loaded if m.startswith(below)] == []
    assert cli.SESSION.partition(":")[0] not in loaded


def test_the_only_string_imports_are_the_cli_table() -> None:
    """Static imports everywhere (readers and tools follow cli → command): `importlib` loads servimg code
    only in the CLI's command table (cli.load); core.lazy defers two third-party packages by attribute."""
    users = sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if "import_module(" in path.read_text() and not path.is_relative_to(PACKAGE / "inimage")
    )
    assert users == ["cli.py", "core/lazy.py"]
    lazy = (PACKAGE / "core" / "lazy.py").read_text()
    assert "servimg." not in lazy.split('"""')[-1], "core.lazy defers third-party modules only"


def test_a_command_loads_only_what_it_needs() -> None:
    """A plain build (to an OCI layout) loads neither the provenance stack, the ladder runner, the
    Debian base builder, the Docker SDK nor requests (servimg.core.lazy: imported when an engine or a
    registry is first asked)."""
    loaded = _loaded_after("import servimg.commands.build, servimg.invocation.session")
    assert not [
        m for m in loaded if m.startswith((*PROVENANCE_PACKAGES, "servimg.bases", "servimg.ladder.runner"))
    ]
    assert _heavy(loaded) == ["yaml"], "no docker, requests, urllib3, pydantic, cryptography or rich"
    keys = _loaded_after("import servimg.commands.keys")
    assert not [m for m in keys if m.startswith(("servimg.assembly.pipeline", "servimg.ladder.runner"))]


def test_a_build_reads_its_definition_lock_and_ladder_without_a_schema_library() -> None:
    """Every build reads an image definition, its lock and its bundled ladder: their validating
    constructors are plain code (servimg.core.fields, servimg.ladder.readers), so reading them costs no
    pydantic import and no schema build (≈0.25 s each, a fifth of a cold build: docs/benchmarks.md)."""
    loaded = _loaded_after(
        "import servimg.definitions.definition, servimg.definitions.lock, servimg.core.strictyaml, "
        "servimg.ladder.definition"
    )
    assert [m for m in loaded if m.split(".")[0] in ("pydantic", "pydantic_core")] == []
    assert _heavy(loaded) == ["yaml"]


def test_the_cli_runs_in_the_process_the_user_started() -> None:
    """No resident server (issue 39): the console script is the CLI's main, no module forks a server or
    talks to one, and `servimg server` is not a command."""
    project = (ROOT / "pyproject.toml").read_text()
    assert 'servimg = "servimg.cli:main"' in project
    assert not (PACKAGE / "resident").exists()
    assert not [c.name for c in cli.COMMANDS if c.name[0] == "server"]
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        assert "SERVIMG_SERVER" not in text and "servimg.resident" not in text, path


def test_python_dash_m_servimg_is_the_cli() -> None:
    """`python -m servimg` runs the same CLI as the `servimg` script (same output, same exit status)."""
    ran = subprocess.run(
        [sys.executable, "-m", "servimg", "--version"], capture_output=True, text=True, check=False
    )
    assert ran.returncode == 0 and ran.stdout.strip() == f"servimg {servimg_version}", ran
    bad = subprocess.run([sys.executable, "-m", "servimg", "no-such"], capture_output=True, text=True)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


PLACE_KINDS = {"engine", "oci", "archive", "registry"}
PLACE_PREFIXES = ("docker-daemon:", "oci:", "docker-archive:", "docker://")


def _is_prefix(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and str(node.value).startswith(PLACE_PREFIXES)


def _place_spellings(tree: ast.AST) -> list[int]:
    """Lines that compare a `.kind` with a place kind, or build or test a transport prefix in code: what
    only backends/ may know (a place says what a caller needs: `holds`, `named_tag`, `text()`, …)."""
    lines = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Compare)
            and isinstance(node.left, ast.Attribute)
            and node.left.attr == "kind"
        ):
            values = [c for c in node.comparators if isinstance(c, ast.Constant | ast.Tuple)]
            names = {
                e.value
                for v in values
                for e in ([v] if isinstance(v, ast.Constant) else v.elts)
                if isinstance(e, ast.Constant)
            }
            if names & PLACE_KINDS:
                lines.append(node.lineno)
        elif isinstance(node, ast.JoinedStr) and node.values:
            head = node.values[0]
            if isinstance(head, ast.Constant) and str(head.value).startswith(PLACE_PREFIXES):
                lines.append(node.lineno)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("startswith", "removeprefix")
            and any(
                isinstance(a, ast.Constant) and str(a.value).startswith(PLACE_PREFIXES) for a in node.args
            )
        ):
            lines.append(node.lineno)
    return lines


def test_only_the_backends_know_how_a_place_is_spelt() -> None:
    """Issue 30: outside backends/ no module holds a transport prefix string or a `.kind ==` on a place."""
    package = SRC / "servimg"
    offenders = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        if rel.parts[0] == "backends":
            continue
        offenders += [f"{rel}:{n}" for n in _place_spellings(ast.parse(path.read_text()))]
    assert offenders == []


PLACE_CLASSES = {"EngineTarget", "LayoutTarget", "ArchiveTarget", "RegistryTarget", "Place"}
# Dispatch tables by the kind of place, each over the places that hold what it needs (checked first).
PLACE_DISPATCH = {
    "judging/evidence.py": {"EngineTarget", "LayoutTarget", "ArchiveTarget", "RegistryTarget"},
    "attesting/attach.py": {"LayoutTarget", "RegistryTarget"},
    "reports/matrix.py": {"LayoutTarget", "RegistryTarget"},
}


def test_outside_backends_a_place_is_asked_not_tested() -> None:
    """Issue 49: a place is a closed sum (`backends.target`); code outside backends/ asks it what it holds
    or names and never tests its kind: the concrete kinds are imported only by the dispatch tables listed."""
    package = SRC / "servimg"
    found: dict[str, set[str]] = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        if rel.parts[0] == "backends":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "servimg.backends.target":
                named = {a.name for a in node.names} & PLACE_CLASSES
                if named:
                    found.setdefault(rel.as_posix(), set()).update(named)
            if isinstance(node, ast.Attribute) and node.attr in (
                "in_engine",
                "in_registry",
                "is_layout",
                "is_archive",
                "holds_attestations",
            ):
                found.setdefault(rel.as_posix(), set()).add(node.attr)
    assert found == PLACE_DISPATCH


def test_below_the_cli_code_takes_the_context_not_store_and_log() -> None:
    """Issue 49: a command's Context is passed whole (below `assembly/` as `oci.store.Io`, the same
    class), never unpacked into `store` and `log` parameters again. The last exception, the ladder's tiny
    model, takes the one directory it keeps models in."""
    package = SRC / "servimg"
    found = set()
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                names = {a.arg for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]}
                if {"store", "log"} <= names:
                    found.add(f"{path.relative_to(package).as_posix()}:{node.name}")
    assert found == set()


def test_the_context_is_one_class_in_core() -> None:
    """Issue 49: `Context` lives in `core/`, generic over the store and the seams (both above `core`); the
    build's (`assembly.context.Context`) and the one the rooms below `assembly/` take (`oci.store.Io`) are
    that one class with those types bound, so a command's Context is passed to every room as it is."""
    assert core_context.Context.__module__ == "servimg.core.context"
    assert get_origin(assembly_context.Context) is core_context.Context
    assert get_origin(store.Io) is core_context.Context
    assert get_args(assembly_context.Context) == (store.BlobStore, seams.Seams)
    assert get_args(store.Io) == (store.BlobStore, object)


CACHE_MODULES = ("servimg.patching.resultcache", "servimg.cache.results", "servimg.patching.basefacts")


def test_the_pipeline_imports_no_cache_module() -> None:
    """The caches that stay (compiled bytecode, facts of a base) sit behind seams: the compiler seam
    (`seams.CachedCompiler`) and the base scan (`basescan`); the pipeline that builds and proves an image
    reaches them only through those (issue 39)."""
    pipeline = sorted({e.imported for e in edges() if e.importer == "servimg.assembly.pipeline"})
    assert [m for m in pipeline if m in CACHE_MODULES] == [], pipeline


# ------------------------------------------------------------------------------------------ rooms (issue 49)
ROOM_LIMIT = 16  # modules per folder, its __init__ counted
MODULE_LIMIT = 700  # lines per module; the in-image probe is one file by design (it is copied into images)


def test_every_room_holds_one_concept_of_a_readable_size() -> None:
    """No folder over 16 modules (provenance/ had 25 of five concepts), and no folder named like build
    output (`build/`, which tree and packaging tools skip)."""
    rooms = {d.name: len(list(d.glob("*.py"))) for d in PACKAGE.iterdir() if (d / "__init__.py").exists()}
    assert {name: n for name, n in rooms.items() if n > ROOM_LIMIT} == {}
    assert "build" not in rooms and "dist" not in rooms


def test_no_module_is_over_700_lines_but_the_probe() -> None:
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MODULE_LIMIT and p != PACKAGE / "inimage" / "probe.py"
    }
    assert long == {}
