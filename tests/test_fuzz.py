"""Property/fuzz tests for every parser that reads untrusted bytes (docs/reliability.md).

Complements the properties already in test_overlay.py (difflib round trip, parse never raises anything
but OverlayError, created/renamed paths never leave the package), test_definition.py (any YAML value),
test_layer.py (file sets in any order) and test_attest.py (envelope/statement parsers never traceback).
Here: the same parsers fed structural mutations of VALID inputs and known attack shapes (deep nesting,
alias bombs, huge integers), the tar writer with every entry kind, the layered reader fed corrupted
tarballs, the overlay applied through base symlinks, and DSSE envelopes that must never verify once
altered. Every refusal is the module's own error with a collected problem list, never a traceback.
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import gzip
import hashlib
import json
import posixpath
import random
import shutil
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import fakebase as fb
from conftest import REPO
from servimg.assembly import pipeline as build
from servimg.backends.layout import read_layout
from servimg.core import canonical
from servimg.core.digest import Digest
from servimg.core.errors import DefinitionError, ImageError, LadderError, LayerError, LockError, ServimgError
from servimg.definitions.definition import ImageDefinition
from servimg.definitions.lock import Lock, PackageLock
from servimg.ladder.definition import LadderDefinition
from servimg.ladder.probeset import ProbeSet
from servimg.oci.filesystem import LayeredFS
from servimg.oci.image import OCI_LAYER, Descriptor, Image, Layer
from servimg.oci.layer import Entry, Kind, write_layer
from servimg.oci.store import BlobStore
from servimg.patching.overlay import apply_patch
from servimg.patching.patch import Patch
from servimg.signing.dsse import DsseError, Envelope, SigningKey, sign, verify
from servimg.statements import attest
from servimg.statements.attest import AttestationError

FAST = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_SCALARS = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(max_size=12)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every key/index path inside a JSON-like value."""
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*prefix, i))


@st.composite
def _mutated(draw: st.DrawFn, original: Any) -> Any:
    """`original` with 1-3 edits: a value replaced, a key deleted, or an unknown key added."""
    doc = copy.deepcopy(original)
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(doc) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = doc
        for part in path[:-1]:
            parent = parent[part]
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "replace":
            parent[path[-1]] = draw(_VALUES)
        elif action == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=6))] = draw(_VALUES)
    return doc


# ---------------------------------------------------------------------------------------- definitions
_DEFINITION = ImageDefinition.parse((REPO / "images" / "demo.yaml").read_text()).to_json()


@FAST
@given(_mutated(_DEFINITION))
def test_definition_mutations_give_a_collected_error_list(doc: Any) -> None:
    try:
        ImageDefinition.parse(yaml.safe_dump(doc))
    except DefinitionError as exc:
        assert exc.message and exc.hint
        for problem in exc.problems:
            where, sep, what = problem.partition(": ")
            assert sep and where and what, problem


_YAML_ALPHABET = st.sampled_from([*"{}[]:,&*!|>-#'\"?%@` \n\tab01.", "&a ", "*a", "!!", "<<: ", "\ufeff"])


@FAST
@given(st.lists(_YAML_ALPHABET, max_size=60).map("".join) | st.binary(max_size=80))
def test_definition_text_never_tracebacks(text: str | bytes) -> None:
    with contextlib.suppress(DefinitionError):
        ImageDefinition.parse(text)


_LAUGHS = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{n}: &{n} [{','.join(['*' + p] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi", strict=True)
)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("name: " + "[" * 5000 + "]" * 5000, "nested too deeply"),
        ("name: " + "{a: " * 5000 + "1" + "}" * 5000, "nested too deeply"),
        ("name: demo\nsource_date_epoch: " + "9" * 5000 + "\n", "digits"),
        ("{[1, 2]: 3}\n", "a mapping key must be a scalar"),
        ("name: !!python/object/apply:os.system ['true']\n", "could not determine a constructor"),
        ("a: &a {name: x}\n<<: *a\n", "could not determine a constructor"),
        ("base: &a {ref: *a}\n", "recursive"),
        (_LAUGHS + "name: x\n", "unknown key"),
        ("name: a\x00b\n", "unacceptable character"),
        ("name: x\nname: y\n", "duplicate key"),
    ],
    ids=[
        "deep-list",
        "deep-map",
        "huge-int",
        "unhashable-key",
        "python-tag",
        "merge-key",
        "recursive-alias",
        "alias-bomb",
        "nul",
        "duplicate-key",
    ],
)
def test_definition_attack_shapes_are_definition_errors(text: str, fragment: str) -> None:
    with pytest.raises(DefinitionError) as info:
        ImageDefinition.parse(text)
    assert fragment in str(info.value)


# -------------------------------------------------------------------------------------------- ladders
_LADDERS = [yaml.safe_load(p.read_text()) for p in sorted((REPO / "verify" / "ladders").glob("*.yaml"))]
_TOY_PROBES = json.loads((REPO / "tests" / "fixtures" / "ladder" / "toy-probes.json").read_bytes())


def _assert_collected(exc: LadderError) -> None:
    assert exc.problems, exc
    for problem in exc.problems:
        where, sep, what = problem.partition(": ")
        assert sep and where and what, problem


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(range(len(_LADDERS))).flatmap(lambda i: _mutated(_LADDERS[i])))
def test_ladder_mutations_are_accepted_or_give_a_collected_error_list(doc: Any) -> None:
    try:
        LadderDefinition.parse(yaml.safe_dump(doc))
    except LadderError as exc:
        _assert_collected(exc)


@FAST
@given(_mutated(_TOY_PROBES))
def test_probe_set_mutations_are_accepted_or_give_a_collected_error_list(doc: Any) -> None:
    try:
        ProbeSet.parse(json.dumps(doc).encode())
    except LadderError as exc:
        _assert_collected(exc)


@FAST
@given(_VALUES)
def test_any_yaml_or_json_value_is_a_ladder_error(value: Any) -> None:
    with pytest.raises(LadderError):
        LadderDefinition.parse(yaml.safe_dump(value))
    with pytest.raises(LadderError):
        ProbeSet.parse(json.dumps(value).encode())


@FAST
@given(st.lists(_YAML_ALPHABET, max_size=60).map("".join) | st.binary(max_size=80))
def test_ladder_text_never_tracebacks(text: str | bytes) -> None:
    with contextlib.suppress(LadderError):
        LadderDefinition.parse(text)


@pytest.mark.parametrize(
    "text",
    [
        "name: " + "[" * 2000 + "]" * 2000,
        "ladder_version: " + "9" * 5000 + "\n",
        "{[1, 2]: 3}\n",
        "name: !!python/object/apply:os.system ['true']\n",
        _LAUGHS + "name: x\n",
        "name: x\nname: y\n",
        "arms: !!set {a: null}\nserver: !!binary AAEC\nsampling: 2020-01-01\n",
    ],
    ids=["deep-list", "huge-int", "unhashable-key", "python-tag", "alias-bomb", "duplicate-key", "yaml-tags"],
)
def test_ladder_attack_shapes_are_ladder_errors(text: str) -> None:
    with pytest.raises(LadderError):
        LadderDefinition.parse(text)


# ---------------------------------------------------------------------------------------------- locks
_LOCK = json.loads((REPO / "images" / "demo.lock.json").read_bytes())


@FAST
@given(_mutated(_LOCK))
def test_lock_mutations_give_a_collected_error_list(doc: Any) -> None:
    try:
        Lock.from_json(doc)
    except LockError as exc:
        assert exc.problems and exc.hint
        assert all(": " in p for p in exc.problems)


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=64) | st.sampled_from([b"[" * 50_000, b'{"a":' * 50_000, b"1" * 5000, b"NaN"]))
def test_lock_files_of_any_bytes_are_lock_errors(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "x.lock.json"
        path.write_bytes(data)
        with pytest.raises(LockError):
            Lock.load(path)


# ------------------------------------------------------------------------------------ the tar writer
_NAME = st.sampled_from(["a", "b", "d", "d.py", "é", "x y", "long" * 30])


@st.composite
def _changeset(draw: st.DrawFn) -> tuple[list[Entry], dict[str, bytes]]:
    """A valid changeset with every kind (file, dir, symlink, hardlink, whiteout, opaque) over a lower
    layer of plain files. Returns (entries, lower files)."""
    lower = {
        "/".join(p): draw(st.binary(max_size=8))
        for p in draw(st.lists(st.lists(_NAME, min_size=1, max_size=2), max_size=5))
    }
    lower = {k: v for k, v in lower.items() if not any(o.startswith(k + "/") for o in lower)}
    entries: dict[str, Entry] = {}
    for parts in draw(st.lists(st.lists(_NAME, min_size=1, max_size=3), min_size=1, max_size=8)):
        path = "/".join(parts)
        kind = draw(st.sampled_from([Kind.FILE, Kind.DIR, Kind.SYMLINK, Kind.HARDLINK, Kind.WHITEOUT]))
        under_non_dir = any(path.startswith(e.path + "/") for e in entries.values() if e.kind is not Kind.DIR)
        has_children = any(e.startswith(path + "/") for e in entries)
        if path in entries or under_non_dir or (has_children and kind is not Kind.DIR):
            continue
        if kind is Kind.FILE:
            mode = draw(st.sampled_from([0o644, 0o755, 0o600, 0o4755]))
            entries[path] = Entry(path, kind, mode, data=draw(st.binary(max_size=16)))
        elif kind is Kind.DIR:
            entries[path] = Entry(path, kind, 0o755)
        elif kind is Kind.SYMLINK:
            link = draw(st.sampled_from(["a", "/etc", "../../x", "d/../a"]))
            entries[path] = Entry(path, kind, 0o777, linkname=link)
        elif kind is Kind.HARDLINK:
            targets = sorted(p for p, e in entries.items() if e.kind is Kind.FILE and p < path)
            if targets:
                entries[path] = Entry(path, kind, 0o644, linkname=draw(st.sampled_from(targets)))
        else:
            entries[path] = Entry(path, kind)
    for path in list(entries):  # explicit parent directories, as servimg writes them
        parent = posixpath.dirname(path)
        while parent:
            entries.setdefault(parent, Entry(parent, Kind.DIR, 0o755))
            parent = posixpath.dirname(parent)
    out = list(entries.values())
    out += [
        Entry(e.path, Kind.OPAQUE) for e in entries.values() if e.kind is Kind.DIR and draw(st.booleans())
    ]
    return out, lower


def _model(lower: dict[str, bytes], entries: list[Entry]) -> dict[str, tuple[str, Any]]:
    """An independent model of OCI changeset application: path -> (type, data/link)."""
    state: dict[str, tuple[str, Any]] = {}

    def remove(path: str) -> None:
        for p in [p for p in state if p == path or p.startswith(path + "/")]:
            del state[p]

    def put(path: str, value: tuple[str, Any]) -> None:
        parts = path.split("/")
        for i in range(1, len(parts)):
            ancestor = "/".join(parts[:i])
            if state.get(ancestor, ("dir", None))[0] != "dir":
                remove(ancestor)
            state.setdefault(ancestor, ("dir", None))
        if state.get(path, ("", None))[0] == "dir" and value[0] != "dir":
            remove(path)
        state[path] = value

    for path, data in lower.items():
        put(path, ("file", data))
    for e in entries:
        if e.kind is Kind.WHITEOUT:
            remove(e.path)
        elif e.kind is Kind.OPAQUE:
            for p in [p for p in state if p.startswith(e.path + "/")]:
                del state[p]
    for e in sorted(entries, key=lambda e: e.path):
        if e.kind is Kind.FILE:
            put(e.path, ("file", e.data))
        elif e.kind is Kind.DIR:
            put(e.path, ("dir", None))
        elif e.kind is Kind.SYMLINK:
            put(e.path, ("symlink", e.linkname))
        elif e.kind is Kind.HARDLINK:
            put(e.path, state[e.linkname])
    return state


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_changeset(), st.randoms(use_true_random=False), st.booleans())
def test_any_changeset_is_deterministic_and_reads_back(
    change: tuple[list[Entry], dict[str, bytes]], rnd: random.Random, compress: bool
) -> None:
    entries, lower = change
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        dirs = {posixpath.dirname(p) for p in lower} - {""}
        write_layer(
            [Entry(p, Kind.FILE, data=d) for p, d in lower.items()] + [Entry(d, Kind.DIR) for d in dirs],
            t / "l",
            mtime=5,
        )
        one = write_layer(entries, t / "a", mtime=9, compress=compress)
        shuffled = entries[:]
        rnd.shuffle(shuffled)
        assert write_layer(shuffled, t / "b", mtime=9, compress=compress) == one
        assert (t / "a").read_bytes() == (t / "b").read_bytes(), "identical bytes in any input order"
        upper = t / "a"
        if compress:
            upper = t / "a.tar"
            upper.write_bytes(gzip.decompress((t / "a").read_bytes()))
        assert Digest.of_bytes(upper.read_bytes()) == one.diff_id
        with tarfile.open(upper) as tar:
            members = tar.getmembers()
        assert all((m.uid, m.gid, m.uname, m.gname, m.mtime) == (0, 0, "", "", 9) for m in members)
        fs = LayeredFS([t / "l", upper])
        expected = _model(lower, entries)
        assert {n.path for n in fs.walk("") if n.path} == set(expected)
        for path, (kind, value) in expected.items():
            node = fs.lstat(path)
            assert node is not None
            if kind == "file":
                assert node.is_file and fs.read(path, follow=False) == value, path
            elif kind == "symlink":
                assert node.is_symlink and node.linkname == value, path
            else:
                assert node.is_dir, path


# ---------------------------------------------------------------------------------- the layer reader
@pytest.fixture(scope="module")
def valid_tar() -> bytes:
    return fb.tar(
        [
            *fb.package_members(),
            fb.S("link", "usr/bin/python3"),
            fb.H("hard", "usr/bin/python3"),
            fb.F("p" * 150, b"long name"),
            fb.F("caf\udce9", b"latin-1"),
        ],
        fmt=tarfile.PAX_FORMAT,
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_corrupted_layers_are_layer_errors(valid_tar: bytes, data: st.DataObject) -> None:
    raw = bytearray(valid_tar)
    for _ in range(data.draw(st.integers(1, 6))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        raw = raw[: data.draw(st.integers(0, len(raw)))]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "l.tar"
        path.write_bytes(bytes(raw))
        try:
            fs = LayeredFS([path])
        except LayerError:
            return
        for node in fs.walk(""):
            with contextlib.suppress(LayerError, FileNotFoundError, IsADirectoryError):
                fs.read(node.path, follow=False)


# ------------------------------------------------------------------------------------- image, layout
_LAYER = Digest.of_bytes(b"layer")
_IMAGE = Image.create(
    {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": ["A=1"], "Labels": {"x": "y"}},
        "rootfs": {"type": "layers", "diff_ids": [str(_LAYER)]},
        "history": [{"created_by": "x"}],
    },
    [Layer(Descriptor(OCI_LAYER, _LAYER, 5), _LAYER)],
)


@FAST
@given(_mutated(json.loads(_IMAGE.manifest_bytes)), _mutated(json.loads(_IMAGE.config_bytes)))
def test_mutated_manifests_and_configs_are_image_errors(manifest: Any, config: Any) -> None:
    config_bytes = canonical.dumps(config)
    if isinstance(manifest, dict) and isinstance(manifest.get("config"), dict):
        manifest["config"]["digest"] = str(Digest.of_bytes(config_bytes))  # keep the binding: go deeper
    try:
        image = Image.parse(canonical.dumps(manifest), config_bytes)
    except ImageError as exc:
        assert exc.problems
        return
    # What servimg reads from an accepted image never raises anything but its own errors.
    with contextlib.suppress(ServimgError):
        image.layers, image.labels, image.env, image.diff_ids  # noqa: B018
        image.with_layer(_IMAGE.layers[0], labels={"a": "b"}, created="2026-01-01T00:00:00Z", history="h")


@pytest.fixture(scope="module")
def layout_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fb.make_base(tmp_path_factory.mktemp("layout") / "base", [fb.tar(fb.package_members())]).layout


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_mutated_layouts_are_refused_with_servimg_errors(layout_dir: Path, data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "layout"
        shutil.copytree(layout_dir, root)
        index = json.loads((root / "index.json").read_bytes())
        if data.draw(st.booleans()):
            index = data.draw(_mutated(index))
        else:  # a mutated manifest, stored under its own digest so that the index still finds it
            entry = index["manifests"][0]
            manifest = json.loads((root / "blobs" / entry["digest"].replace(":", "/")).read_bytes())
            raw = canonical.dumps(data.draw(_mutated(manifest)))
            (root / "blobs" / "sha256" / Digest.of_bytes(raw).hex).write_bytes(raw)
            entry.update(digest=str(Digest.of_bytes(raw)), size=len(raw))
        (root / "index.json").write_bytes(json.dumps(index).encode())
        with contextlib.suppress(ServimgError):
            read_layout(root, BlobStore(Path(tmp) / "cache"))
        assert fb.cache_is_sound(Path(tmp) / "cache") == []


# ------------------------------------------------------------------------------------------ DSSE
@pytest.fixture(scope="module")
def key() -> SigningKey:
    return SigningKey.generate()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=48), st.data())
def test_an_altered_envelope_never_verifies(key: SigningKey, payload: bytes, data: st.DataObject) -> None:
    envelope = sign(attest.PAYLOAD_TYPE, payload, key)
    raw = bytearray(envelope.to_bytes())
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] = data.draw(st.integers(0, 255).filter(lambda b, old=raw[at]: b != old))
    try:
        parsed = Envelope.parse(bytes(raw))
    except DsseError as exc:
        assert exc.problems or exc.message
        return
    unchanged = (parsed.payload_type, parsed.payload, [s.sig for s in parsed.signatures]) == (
        envelope.payload_type,
        envelope.payload,
        [s.sig for s in envelope.signatures],
    )
    assert verify(parsed, [key.public_key]).verified == unchanged


_STATEMENT = json.loads(
    attest.statement(
        attest.image_subjects("reg/x", Digest.of_bytes(b"m"), Digest.of_bytes(b"c")),
        attest.TEST_RESULT_V01,
        attest.test_result(configuration=[attest.resource(name="l", digest=_LAYER)], passed=["a"]),
    )
)


@FAST
@given(_mutated(_STATEMENT))
def test_mutated_statements_are_attestation_errors(doc: Any) -> None:
    try:
        statement = attest.parse_statement(canonical.dumps(doc))
    except AttestationError as exc:
        assert exc.message
        return
    assert all(isinstance(d, Digest) for _, d in statement.subjects)


# --------------------------------------------------------------------- overlays through base symlinks
_LINK_TARGETS = st.sampled_from(
    [
        "/etc",
        "..",
        "../..",
        "/",
        "sub",
        "../pkg/sub",
        f"/{fb.SITE}/pkg/sub",
        f"/{fb.SITE}/other",
        "l1",
        "../other/x.py",
    ]
)
_PATCH_PATHS = st.sampled_from(
    ["pkg/l1/x.py", "pkg/sub/l2/x.py", "pkg/l3", "pkg/sub/x.py", "pkg/l1", "pkg/l3/y.py"]
)


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(st.sampled_from(["pkg/l1", "pkg/sub/l2", "pkg/l3"]), _LINK_TARGETS, max_size=3),
    _PATCH_PATHS,
    st.booleans(),
)
def test_overlays_never_write_outside_the_package_through_base_symlinks(
    links: dict[str, str], target: str, create: bool
) -> None:
    site = fb.SITE
    members = [
        fb.D("etc"),
        fb.F("etc/passwd", b"x\n"),
        *[
            fb.D(d)
            for d in (
                "usr",
                "usr/lib",
                "usr/lib/python3",
                site,
                f"{site}/pkg",
                f"{site}/pkg/sub",
                f"{site}/other",
            )
        ],
        fb.F(f"{site}/pkg/sub/x.py", b"x\n"),
        fb.F(f"{site}/other/x.py", b"x\n"),
        *[fb.S(f"{site}/{name}", to) for name, to in links.items()],
    ]
    if create:
        patch = b"--- /dev/null\n+++ b/%s\n@@ -0,0 +1 @@\n+new\n" % target.encode()
    else:
        patch = b"--- a/%s\n+++ b/%s\n@@ -1 +1 @@\n-x\n+y\n" % (target.encode(), target.encode())
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        (t / "l.tar").write_bytes(fb.tar(members))
        fs = LayeredFS([t / "l.tar"])
        (t / "fix.patch").write_bytes(patch)
        sha = hashlib.sha256(patch).hexdigest()
        definition = ImageDefinition.parse(
            f"name: x\nrepository: r/x\nbase: {{ref: 'oci:x', digest: 'sha256:{'0' * 64}'}}\n"
            "packages: {pkg: {distribution: pkg, version: '1'}}\n"
            f"overlays: [{{id: o, package: pkg, patch: fix.patch, sha256: {sha}}}]\n"
        )
        package = PackageLock("pkg", "pkg", "1", "/" + site, f"/{site}/pkg-1.dist-info", "0" * 64)
        try:
            _, changes = build._apply_overlays(definition, t, fs, (package,))
        except ServimgError:
            return
    root = fs.resolve(f"{site}/pkg")
    for change in changes:
        assert change.path.startswith(root + "/") and posixpath.normpath(change.path) == change.path


# ------------------------------------------------------------------------------- overlay, round trips
_LINES = st.lists(st.sampled_from([b"a\n", b"b\n", b"c\n", b"\n", b"x\r\n"]), max_size=8)


@st.composite
def _trees(draw: st.DrawFn) -> tuple[dict[str, bytes], dict[str, bytes]]:
    names = ["pkg/m.py", "pkg/sub/n.py", "pkg/o.py"]
    before = {n: b"".join(draw(_LINES)) for n in names if draw(st.booleans())}
    after = {n: b"".join(draw(_LINES)) for n in names if draw(st.booleans())}
    assume(before != after)
    return before, after


def _git_patch(before: dict[str, bytes], after: dict[str, bytes]) -> bytes:
    out: list[bytes] = []
    for name in sorted(set(before) | set(after)):
        a = before.get(name)
        b = after.get(name)
        if a == b:
            continue
        old = b"a/" + name.encode() if a is not None else b"/dev/null"
        new = b"b/" + name.encode() if b is not None else b"/dev/null"
        header = b"diff --git a/%s b/%s\n" % (name.encode(), name.encode())
        if a is None:
            header += b"new file mode 100644\n"
        elif b is None:
            header += b"deleted file mode 100644\n"
        body = list(
            difflib.diff_bytes(
                difflib.unified_diff, (a or b"").splitlines(True), (b or b"").splitlines(True), old, new, n=2
            )
        )
        if not body:
            out.append(header)  # an empty file created or deleted: no hunks
            continue
        for line in body:
            out.append(line if line.endswith(b"\n") else line + b"\n\\ No newline at end of file\n")
        out[-len(body)] = header + out[-len(body)]
    return b"".join(out)


@FAST
@given(_trees())
def test_multi_file_patches_apply_then_reverse_apply_round_trip(
    trees: tuple[dict[str, bytes], dict[str, bytes]],
) -> None:
    before, after = trees
    patch = Patch.parse(_git_patch(before, after))
    forward = {**before}
    for applied in apply_patch(patch, before.get, "pkg"):
        if applied.content is None:
            forward.pop(applied.path, None)
        else:
            forward[applied.path] = applied.content
    assert forward == after
    backward = {**after}
    for applied in apply_patch(patch.reversed(), after.get, "pkg"):
        if applied.content is None:
            backward.pop(applied.path, None)
        else:
            backward[applied.path] = applied.content
    assert backward == before
