"""Malicious base layers (docs/reliability.md): each refused or handled with a specific message; nothing
written outside the work directory (a sentinel directory beside it is snapshotted before and compared after);
no tag created (no output layout, no lock rewritten).

Fixtures are built locally with `tarfile` (tests/fakebase.py), wrapped into images with `Image.create`
and written as OCI layouts; the build-level cases run the real CLI over a tiny fake base with the host's
Python standing in for the image's interpreter (the base has none).
"""

from __future__ import annotations

import functools
import gzip
import io
import json
import os
import tarfile
import tempfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import fakebase as fb
from fakebase import D, F, H, M, S
from servimg.backends.archive import read_archive
from servimg.backends.layout import read_layout
from servimg.core.digest import Digest
from servimg.core.errors import BytecodeError, LayerError, ServimgError
from servimg.oci.filesystem import LayeredFS
from servimg.oci.store import BlobStore
from servimg.patching.bytecode import ChrootRunner, extract_runtime

SITE = fb.SITE


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The work directory (every temp file lands under it) with a sentinel directory beside it that no
    input may touch. Yields the work dir; the sentinel is `work.parent / "sentinel"`."""
    sentinel = tmp_path / "sentinel"
    (sentinel / "etc").mkdir(parents=True)
    (sentinel / "keep").write_text("untouched")
    (sentinel / "etc" / "passwd").write_text("root:x:0:0\n")
    before = fb.snapshot(sentinel)
    work = tmp_path / "work"
    (work / "tmp").mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(work / "tmp"))
    yield work
    assert fb.snapshot(sentinel) == before, "something was written outside the work directory"


def sentinel_of(work: Path) -> Path:
    return work.parent / "sentinel"


def up(work: Path) -> str:
    """A relative prefix that climbs from any in-image path to the host root (more `..` than needed)."""
    return "../" * (len(work.parts) + 8)


def layer_file(work: Path, raw: bytes, name: str = "layer.tar") -> Path:
    path = work / name
    path.write_bytes(raw)
    return path


def fs_of(work: Path, *layers: list[M]) -> LayeredFS:
    return LayeredFS([layer_file(work, fb.tar(m), f"layer{i}.tar") for i, m in enumerate(layers)])


# ----------------------------------------------------------------------------------- refused by the reader
def _refusals(work: Path) -> dict[str, tuple[list[list[M]], str]]:
    s = str(sentinel_of(work))
    return {
        "dotdot-entry": ([[F(up(work) + s.lstrip("/") + "/pwned", b"x")]], "path escapes the image root"),
        "dotdot-in-the-middle": ([[F("usr/../../pwned", b"x")]], "path escapes the image root"),
        "absolute-dotdot": ([[F("/../../pwned", b"x")]], "path escapes the image root"),
        "whiteout-dotdot": ([[F("../.wh.keep")]], "path escapes the image root"),
        "hardlink-dotdot": ([[F("a", b"a"), H("b", "../../etc/passwd")]], "hardlink 'b' target"),
        "hardlink-to-host-file": ([[H("b", s + "/keep")]], "the target is not in this or a lower layer"),
        "hardlink-missing-target": ([[H("b", "nope")]], "the target is not in this or a lower layer"),
        "hardlink-before-target": ([[H("b", "a"), F("a", b"a")]], "the target is not in this or a lower"),
        "hardlink-to-directory": ([[D("d"), H("b", "d")]], "the target is a directory"),
        "hardlink-empty-target": ([[H("b", "")]], "the target is not in this or a lower layer"),
        "gnu-sparse-member": ([[M("sparse", tarfile.GNUTYPE_SPARSE)]], "GNU sparse member"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "dotdot-entry",
        "dotdot-in-the-middle",
        "absolute-dotdot",
        "whiteout-dotdot",
        "hardlink-dotdot",
        "hardlink-to-host-file",
        "hardlink-missing-target",
        "hardlink-before-target",
        "hardlink-to-directory",
        "hardlink-empty-target",
        "gnu-sparse-member",
    ],
)
def test_reader_refuses(case: str, work: Path) -> None:
    layers, fragment = _refusals(work)[case]
    with pytest.raises(LayerError) as info:
        fs_of(work, *layers)
    assert fragment in str(info.value)
    assert "layer 0 (layer0.tar)" in str(info.value), "the message names the layer"


def test_not_a_tar_and_truncated_tar_are_refused(work: Path) -> None:
    with pytest.raises(LayerError, match="is not a readable tar"):
        LayeredFS([layer_file(work, os.urandom(700) + b"\x01" * 512)])
    whole = fb.tar([F("a", b"x" * 5000), F("b", b"y")])
    with pytest.raises(LayerError, match="is not a readable tar"):
        LayeredFS([layer_file(work, whole[:1000], "cut.tar")])


# ----------------------------------------------------------------------------------- handled, confined
def test_absolute_paths_are_read_inside_the_image_root(work: Path) -> None:
    s = str(sentinel_of(work))
    fs = fs_of(work, [F("/etc/evil", b"e"), F(s + "/pwned", b"p")])
    assert fs.read("etc/evil") == b"e"
    assert fs.read(s.lstrip("/") + "/pwned") == b"p"
    root = work / "root"
    root.mkdir()
    extract_runtime(fs, root, packages=True)
    assert (root / "etc" / "evil").read_bytes() == b"e"
    assert (root / s.lstrip("/") / "pwned").read_bytes() == b"p"


def test_symlinks_escaping_the_root_resolve_inside_it_and_are_never_written_through(work: Path) -> None:
    s = str(sentinel_of(work))
    fs = fs_of(
        work,
        [
            S("abs", s),  # absolute: the host's sentinel, if anyone followed it on the host
            S("rel", up(work) + s.lstrip("/")),  # relative, climbing far above the root
            S("same", s),
            F("same/pwned", b"x"),  # same layer: a child under the symlink replaces it by a directory
            D("etc"),
            F("etc/passwd", b"image passwd\n"),
        ],
        [F("abs/pwned", b"x"), F("rel/pwned", b"x")],  # a later layer writes "through" them
    )
    for name in ("abs", "rel", "same"):
        node = fs.lstat(name)
        assert node is not None and node.is_dir, f"{name}: a child replaced the symlink by a directory"
    root = work / "root"
    root.mkdir()
    extract_runtime(fs, root, packages=True)
    for name in ("abs", "rel", "same"):
        assert (root / name / "pwned").read_bytes() == b"x"
    only_links = fs_of(work, [S("abs", s), S("rel", up(work) + s.lstrip("/")), S("up", up(work) + "etc")])
    assert only_links.resolve("rel/x") == s.lstrip("/") + "/x", "'..' never climbs above the image root"
    assert only_links.read_or_none("abs/keep") is None, "the host's file is not the image's"
    assert only_links.resolve("up/passwd") == "etc/passwd"
    root2 = work / "root2"
    root2.mkdir()
    extract_runtime(only_links, root2, packages=True)
    assert os.readlink(root2 / "abs") == s, "symlinks are written as-is, resolved only by the chroot"


def test_extraction_never_writes_through_a_planted_symlink(work: Path) -> None:
    """The "symlinked parent dir" trick: a root that already holds `usr -> <outside>`."""
    fs = fs_of(work, [D("usr"), F("usr/pwned", b"x")])
    root = work / "root"
    root.mkdir()
    (root / "usr").symlink_to(sentinel_of(work))
    with pytest.raises(BytecodeError, match="exists and is not a directory"):
        extract_runtime(fs, root, packages=True)
    (root / "usr").unlink()
    (root / "usr").mkdir()
    (root / "usr" / "pwned").symlink_to(sentinel_of(work) / "keep")
    with pytest.raises(BytecodeError, match="it already exists"):  # O_EXCL|O_NOFOLLOW
        extract_runtime(fs, root, packages=True)


def test_the_chroot_runner_over_a_hostile_base_stays_in_its_root(work: Path) -> None:
    """The real runner (extraction, work dir, chroot) over symlinks and device nodes aimed at the host:
    the stand-in interpreter cannot run, so it fails, but nothing outside its root was touched."""
    s = str(sentinel_of(work))
    fs = fs_of(
        work,
        [
            *fb.package_members(),
            S(".servimg-compile", s),
            S("tmp", s),
            M("dev-null", tarfile.CHRTYPE, devmajor=1, devminor=3),
            F(s + "/pwned", b"x"),
        ],
        [F("tmp/pwned", b"x")],
    )
    jobs = work / "jobs"
    (jobs / "out").mkdir(parents=True)
    (jobs / "jobs.json").write_text("[]")
    with pytest.raises(BytecodeError, match="chroot runner: /usr/bin/python3 failed"):
        ChrootRunner(fs).run(jobs, "/usr/bin/python3")


def test_the_runner_work_dir_cannot_be_provided_by_the_base(work: Path) -> None:
    fs = fs_of(work, [S(".servimg-compile", str(sentinel_of(work))), D("bin")])
    root = work / "root"
    root.mkdir()
    extract_runtime(fs, root)
    assert not os.path.lexists(root / ".servimg-compile")
    assert (root / "bin").is_dir()


def test_device_nodes_and_fifos_are_kept_as_nodes_but_never_created_on_the_host(work: Path) -> None:
    fs = fs_of(
        work,
        [
            D("dev"),
            M("dev/null", tarfile.CHRTYPE, mode=0o666, devmajor=1, devminor=3),
            M("dev/sda", tarfile.BLKTYPE, mode=0o660, devmajor=8, devminor=0),
            M("dev/fifo", tarfile.FIFOTYPE),
        ],
    )
    null = fs.lstat("dev/null")
    assert null is not None and null.type == tarfile.CHRTYPE, "what the image carries is kept"
    with pytest.raises(LayerError, match="is not a regular file"):
        fs.read("dev/sda")
    root = work / "root"
    root.mkdir()
    extract_runtime(fs, root, packages=True)
    assert os.listdir(root / "dev") == []


def test_setuid_setgid_and_sticky_bits_are_dropped_on_extraction(work: Path) -> None:
    fs = fs_of(work, [D("bin"), F("bin/su", b"x", 0o4755), F("bin/sg", b"x", 0o2755), D("tmp", 0o1777)])
    assert fs.lstat("bin/su").mode == 0o4755  # type: ignore[union-attr]
    root = work / "root"
    root.mkdir()
    extract_runtime(fs, root, packages=True)
    for path in ("bin/su", "bin/sg", "tmp"):
        assert (root / path).stat().st_mode & 0o7000 == 0, path


def test_duplicate_entries_last_one_wins_as_when_unpacked(work: Path) -> None:
    fs = fs_of(work, [F("a", b"first"), F("a", b"second"), D("d"), F("d/x", b"x"), F("d", b"now a file")])
    assert fs.read("a") == b"second"
    assert fs.read("d") == b"now a file" and not fs.exists("d/x")


def test_a_file_replaced_by_a_directory_in_a_later_layer(work: Path) -> None:
    fs = fs_of(work, [F("p", b"file")], [D("p"), F("p/child", b"c")])
    assert fs.listdir("p") == ["child"]
    with pytest.raises(IsADirectoryError):
        fs.read("p")


def test_hardlinks_resolve_when_applied(work: Path) -> None:
    """A hardlink keeps its data when the target is whited out later (one inode, as unpacked), may
    name a file of a lower layer, and a hardlink to a symlink is that symlink."""
    fs = fs_of(
        work,
        [F("a", b"data", 0o755), H("b", "a"), S("s", "a")],
        [F(".wh.a"), H("c", "b"), H("t", "s")],
    )
    assert not fs.exists("a")
    assert fs.read("b") == b"data" and fs.read("c") == b"data"
    assert fs.lstat("c").mode == 0o755  # type: ignore[union-attr]
    assert fs.lstat("t").is_symlink  # type: ignore[union-attr]


def test_non_utf8_names_are_kept_byte_exact(work: Path) -> None:
    gnu = fb.tar([D("d"), F("d/caf\udce9.py", b"gnu")], fmt=tarfile.GNU_FORMAT)
    pax = fb.tar([F("d/na\udcefve-" + "x" * 120, b"pax")], fmt=tarfile.PAX_FORMAT)
    assert b"hdrcharset=BINARY" in pax
    fs = LayeredFS([layer_file(work, gnu, "gnu.tar"), layer_file(work, pax, "pax.tar")])
    assert fs.read("d/caf\udce9.py") == b"gnu"
    root = work / "root"
    root.mkdir()
    extract_runtime(fs, root, packages=True)
    assert sorted(os.listdir(os.fsencode(root / "d"))) == sorted([b"caf\xe9.py", b"na\xefve-" + b"x" * 120])


# ------------------------------------------------------------------------------------ blobs and layouts
@functools.cache
def _bomb() -> bytes:
    """A gzip'd tar holding one 256 MiB file of zeros: ~260 KB compressed (ratio ~1000)."""
    info = tarfile.TarInfo("bomb")
    info.size = 256 << 20
    comp = zlib.compressobj(6, zlib.DEFLATED, 31)
    out = [comp.compress(info.tobuf(tarfile.GNU_FORMAT))]
    zeros = bytes(1 << 20)
    for _ in range(256):
        out.append(comp.compress(zeros))
    out.append(comp.compress(bytes(1024)))
    out.append(comp.flush())
    return b"".join(out)


def test_gzip_bomb_is_refused_and_leaves_nothing(work: Path) -> None:
    store = BlobStore(work / "cache")
    digest = store.put_bytes(_bomb())
    with pytest.raises(LayerError, match="refusing a possible gzip bomb"):
        store.uncompressed(digest, Digest("sha256", "0" * 64))
    assert os.listdir(work / "cache" / "diffs" / "sha256") == [], "no partial diff left behind"


def test_gzip_limits_are_configurable(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = fb.tar([F("zeros", bytes(4 << 20))])
    store = BlobStore(work / "cache")
    digest = store.put_bytes(gzip.compress(raw))
    monkeypatch.setenv("SERVIMG_MAX_LAYER_BYTES", str(1 << 20))
    with pytest.raises(LayerError, match="more than 1048576 bytes"):
        store.uncompressed(digest, Digest.of_bytes(raw))
    monkeypatch.delenv("SERVIMG_MAX_LAYER_BYTES")
    assert store.uncompressed(digest, Digest.of_bytes(raw)).read_bytes() == raw


def test_corrupt_gzip_is_a_layer_error(work: Path) -> None:
    raw = fb.tar([F("a", os.urandom(4096))])
    store = BlobStore(work / "cache")
    digest = store.put_bytes(gzip.compress(raw)[:-40])
    with pytest.raises(LayerError, match="corrupt gzip stream"):
        store.uncompressed(digest, Digest.of_bytes(raw))


def test_diff_id_mismatch_is_refused_plain_and_gzip(work: Path) -> None:
    raw = fb.tar([F("a", b"a")])
    store = BlobStore(work / "cache")
    lie = Digest.of_bytes(b"something else")
    with pytest.raises(LayerError, match="its diffID must be"):
        store.uncompressed(store.put_bytes(raw), lie)
    with pytest.raises(LayerError, match="but the image config says diffID"):
        store.uncompressed(store.put_bytes(gzip.compress(raw)), lie)


def _honest(work: Path) -> fb.Base:
    return fb.make_base(work / "base", [fb.tar(fb.package_members())])


def test_layout_manifest_naming_a_missing_layer_blob(work: Path) -> None:
    base = _honest(work)
    base.blob(base.image.layer_descriptors[0].digest).unlink()
    with pytest.raises(ServimgError, match=r"manifest.layers\[0\] names blob sha256:\w+, which is missing"):
        read_layout(base.layout, BlobStore(work / "cache"))


def test_layout_manifest_naming_a_missing_config_blob(work: Path) -> None:
    base = _honest(work)
    base.blob(base.image.config_digest).unlink()
    with pytest.raises(ServimgError, match="is missing"):
        read_layout(base.layout, BlobStore(work / "cache"))


def test_layout_blob_that_does_not_hash_to_its_name(work: Path) -> None:
    base = _honest(work)
    blob = base.blob(base.image.layer_descriptors[0].digest)
    data = bytearray(blob.read_bytes())
    data[600] ^= 1
    blob.write_bytes(bytes(data))
    with pytest.raises(ServimgError, match="blob digest mismatch"):
        read_layout(base.layout, BlobStore(work / "cache"))
    assert fb.cache_is_sound(work / "cache") == []


@pytest.mark.parametrize("how", ["own-cache", "read-only"])
def test_layout_blobs_are_linked_not_copied_and_still_verified(work: Path, how: str) -> None:
    """The base cache's own layout (link=True) and a layout whose blobs have no write bit (a Nix store
    path) are hard-linked into the store, each blob hashed first: a bit flip is still refused."""
    base = _honest(work)
    blob = base.blob(base.image.layer_descriptors[0].digest)
    if how == "read-only":
        blob.chmod(0o444)
    store = BlobStore(work / "cache")
    read_layout(base.layout, store, link=how == "own-cache")
    assert store.path(base.image.layer_descriptors[0].digest).stat().st_ino == blob.stat().st_ino
    with blob.open("rb") as again:  # the same bytes read again (a `docker save`) keep the one copy
        store.put_stream(again)
    assert store.path(base.image.layer_descriptors[0].digest).stat().st_ino == blob.stat().st_ino
    if how == "own-cache":  # a user's writable layout is copied: its later edits never reach the store
        copied = BlobStore(work / "copied")
        read_layout(base.layout, copied)
        assert copied.path(base.image.layer_descriptors[0].digest).stat().st_ino != blob.stat().st_ino
    flipped = _honest(work / "flipped")
    bad = flipped.blob(flipped.image.layer_descriptors[0].digest)
    data = bytearray(bad.read_bytes())
    data[600] ^= 1
    bad.write_bytes(bytes(data))
    with pytest.raises(ServimgError, match="blob digest mismatch"):
        read_layout(flipped.layout, BlobStore(work / "cache2"), link=True)
    assert not BlobStore(work / "cache2").has(flipped.image.layer_descriptors[0].digest)


def test_layout_descriptor_that_lies_about_size(work: Path) -> None:
    from servimg.oci.image import Descriptor, Image, Layer

    good = _honest(work)
    layer = good.image.layers[0]
    lying = Layer(Descriptor(layer.descriptor.media_type, layer.descriptor.digest, 7), layer.diff_id)
    image = Image.assemble(good.image.config_bytes, [lying])
    from servimg.backends.layout import write_layout

    write_layout(image, work / "lying", BlobStore(work / ".base-store"), tag=None)
    with pytest.raises(ServimgError, match="says 7 bytes"):
        read_layout(work / "lying", BlobStore(work / "cache"))


def test_layout_index_with_a_path_traversal_digest(work: Path) -> None:
    base = _honest(work)
    index = fb.read_json(base.layout / "index.json")
    index["manifests"][0]["digest"] = "sha256:../../../../etc/passwd"
    (base.layout / "index.json").write_text(json.dumps(index))
    with pytest.raises(ServimgError) as info:
        read_layout(base.layout, BlobStore(work / "cache"))
    assert "malformed sha256 digest" in str(info.value)


def test_layout_manifest_that_is_not_an_object(work: Path) -> None:
    base = _honest(work)
    bad = b"[1, 2, 3]"
    digest = Digest.of_bytes(bad)
    base.blob(digest).write_bytes(bad)
    index = fb.read_json(base.layout / "index.json")
    index["manifests"][0].update(digest=str(digest), size=len(bad))
    (base.layout / "index.json").write_text(json.dumps(index))
    with pytest.raises(ServimgError, match="is not a JSON object"):
        read_layout(base.layout, BlobStore(work / "cache"))


def _archive(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as t:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_docker_archive_hostile_member_names_and_bad_manifests(work: Path) -> None:
    s = str(sentinel_of(work))
    layer = fb.tar([F("a", b"a")])
    config = b'{"rootfs":{"type":"layers","diff_ids":["%s"]}}' % str(Digest.of_bytes(layer)).encode()
    ok_manifest = b'[{"Config":"c.json","RepoTags":[],"Layers":["%s/../../x/layer.tar"]}]' % s.encode()
    members = {
        "c.json": config,
        f"{s}/../../x/layer.tar": layer,
        s + "/keep": b"pwned",
        "manifest.json": ok_manifest,
    }
    path = work / "hostile.tar"
    path.write_bytes(_archive(members))
    image = read_archive(path, BlobStore(work / "cache"))  # member names are only keys: nothing written
    assert image.layers[0].diff_id == Digest.of_bytes(layer)
    cases = {
        b"{not json": "manifest.json is not valid JSON",
        b'{"Config": 1}': "manifest.json is not a list",
        b'[{"Config":"c.json","Layers":["a","b"]}]': "lists 1 diff_ids for 2 layers",
        b'[{"Config":"missing.json","Layers":[]}]': "missing its config",
    }
    for manifest, fragment in cases.items():
        path.write_bytes(_archive({**members, "manifest.json": manifest}))
        with pytest.raises(ServimgError, match=fragment):
            read_archive(path, BlobStore(work / "cache"))
    lie = b'{"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' % (b"0" * 64)
    path.write_bytes(_archive({**members, "c.json": lie}))
    with pytest.raises(ServimgError, match="config says diffID"):
        read_archive(path, BlobStore(work / "cache"))


# ------------------------------------------------------------------------------ the build, end to end
Mutation = Callable[[Path], fb.Base]


def _on_top(*extra: list[M], gz: bool = False) -> Mutation:
    def make(work: Path) -> fb.Base:
        layers = [fb.tar(fb.package_members()), *(fb.tar(m) for m in extra)]
        return fb.make_base(work / "hostile", layers, gzip_layers=[gz] * len(layers))

    return make


def _missing_blob(work: Path) -> fb.Base:
    base = _on_top([F("x", b"x")])(work)
    base.blob(base.image.layer_descriptors[1].digest).unlink()
    return base


def _lying_diff_id(gz: bool) -> Mutation:
    def make(work: Path) -> fb.Base:
        raw = fb.tar(fb.package_members())
        return fb.make_base(
            work / "hostile", [raw], gzip_layers=[gz], diff_ids=[Digest.of_bytes(raw + b"\0" * 512)]
        )

    return make


def _bomb_base(work: Path) -> fb.Base:
    layers = [fb.tar(fb.package_members()), fb.Blob(_bomb(), Digest("sha256", "0" * 64))]
    return fb.make_base(work / "hostile", layers)


BUILD_FAILURES: dict[str, tuple[Mutation, str]] = {
    "dotdot-entry": (_on_top([F("../../../../pwned", b"x")]), "path escapes the image root"),
    "hardlink-escape": (_on_top([H("evil", "../../../../etc/passwd")]), "hardlink 'evil' target"),
    "hardlink-missing": (_on_top([H("evil", "etc/shadow")]), "the target is not in this or a lower layer"),
    "sparse-member": (_on_top([M("s", tarfile.GNUTYPE_SPARSE)]), "GNU sparse member"),
    "diff-id-mismatch": (_lying_diff_id(False), "its diffID must be"),
    "diff-id-mismatch-gzip": (_lying_diff_id(True), "but the image config says diffID"),
    "gzip-bomb": (_bomb_base, "refusing a possible gzip bomb"),
    "missing-blob": (_missing_blob, "which is missing from the layout"),
    "whiteout-of-the-patched-file": (
        _on_top([F(f"{SITE}/tinypkg/.wh.mod.py")]),
        "cannot modify: the file does not exist",
    ),
    "file-replaced-by-directory": (
        _on_top([D(f"{SITE}/tinypkg/mod.py"), F(f"{SITE}/tinypkg/mod.py/x", b"")]),
        "cannot modify: the file does not exist",
    ),
    "patched-file-is-a-symlink-out-of-the-package": (
        _on_top([S(f"{SITE}/tinypkg/mod.py", "/etc/passwd")]),
        "outside the package root",
    ),
    "patched-file-is-a-device": (
        _on_top([M(f"{SITE}/tinypkg/mod.py", tarfile.CHRTYPE, devmajor=1, devminor=3)]),
        "is not a regular file",
    ),
    "package-hidden-by-opaque-dir": (
        _on_top([F(f"{SITE}/.wh..wh..opq")]),
        "expected exactly one tinypkg==1.0",
    ),
    "interpreter-symlink-loop": (
        _on_top([S("usr/bin/python3", "python3.x"), S("usr/bin/python3.x", "python3")]),
        "too many levels of symbolic links",
    ),
}


@pytest.fixture
def repo(work: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A repository over the honest tiny base, locked; its definition is then pointed at a hostile one."""
    definition = fb.make_repo(work / "repo", _honest(work))
    assert fb.main(["lock", str(definition), "--cache", str(work / "cache"), "--quiet"]) == 0
    return definition


@pytest.mark.parametrize("case", sorted(BUILD_FAILURES))
def test_build_over_a_hostile_base_fails_clearly_and_leaves_nothing(
    case: str, work: Path, repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mutate, fragment = BUILD_FAILURES[case]
    hostile = mutate(work)
    repo.write_text(fb.definition_text(hostile))
    lock_path = repo.with_name("tiny.lock.json")
    lock_before = lock_path.read_bytes()
    out = work / "out" / "tiny"
    capsys.readouterr()
    for command in (["lock", str(repo)], ["build", str(repo), "--to", f"oci:{out}"]):
        code = fb.main([*command, "--cache", str(work / "cache")])
        printed = capsys.readouterr().out
        assert code == 1, printed
        assert printed.startswith("FAIL: "), printed
        assert fragment in printed, printed
        assert "hint:" in printed and "internal error" not in printed and "Traceback" not in printed
    assert lock_path.read_bytes() == lock_before, "the lock was not rewritten"
    assert not (work / "out").exists(), "nothing published, no tag"
    assert fb.cache_is_sound(work / "cache") == []


def test_build_over_a_base_with_odd_but_legal_content_succeeds(
    work: Path, repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Device nodes, FIFOs, setuid files, duplicates, absolute names and a non-UTF-8 pyc name in the
    base are passed through untouched; the overlay layer never carries a device node, a setuid bit or
    a name it could not record, and the patched file loses its setuid bit."""
    extra = [
        D("dev"),
        M("dev/null", tarfile.CHRTYPE, mode=0o666, devmajor=1, devminor=3),
        M("dev/fifo", tarfile.FIFOTYPE),
        F("/etc/absolute", b"a"),
        F("dup", b"1"),
        F("dup", b"2"),
        D(f"{SITE}/tinypkg/__pycache__"),
        F(f"{SITE}/tinypkg/__pycache__/mod.cpython-311.pyc", b"stale"),
        F(f"{SITE}/tinypkg/__pycache__/mod.cpython-310.pyc", b"stale"),
        F(f"{SITE}/tinypkg/__pycache__/mod.\udcff.pyc", b"odd"),
        F(f"{SITE}/tinypkg/mod.py", fb.MOD, 0o4755),
    ]
    base = _on_top(extra)(work)
    repo.write_text(fb.definition_text(base))
    cache = work / "cache"
    assert fb.main(["lock", str(repo), "--cache", str(cache), "--quiet"]) == 0
    out = work / "out" / "tiny"
    assert fb.main(["build", str(repo), "--to", f"oci:{out}", "--cache", str(cache), "--json"]) == 0, (
        capsys.readouterr()
    )
    index = fb.read_json(out / "index.json")
    manifest = fb.read_json(out / "blobs" / index["manifests"][0]["digest"].replace(":", "/"))
    assert manifest["layers"][:2] == [d.to_json() for d in base.image.layer_descriptors], "passed through"
    ours = fb.layer_members(out / "blobs" / manifest["layers"][-1]["digest"].replace(":", "/"))
    assert not any(m.ischr() or m.isblk() or m.isfifo() for m in ours.values())
    assert not any(m.mode & 0o7000 for m in ours.values())
    assert ours[f"{SITE}/tinypkg/mod.py"].mode == 0o755
    assert ours[f"{SITE}/tinypkg/__pycache__/mod.cpython-311.pyc"].isfile(), "fresh bytecode"
    assert f"{SITE}/tinypkg/__pycache__/.wh.mod.cpython-310.pyc" in ours, "stale bytecode whited out"
    assert all(name.encode("utf-8") for name in ours)


def test_writing_a_layout_again_mends_a_truncated_blob(work: Path) -> None:
    """A layer blob cut short in a layout (an interrupted copy) is replaced when the image is written there
    again, not kept because a file of that name exists; the layout then reads back whole."""
    from servimg.backends.layout import write_layout

    base = _honest(work)
    store = BlobStore(work / ".base-store")
    out = work / "out"
    write_layout(base.image, out, store, tag="t")
    blob = out / "blobs" / "sha256" / base.image.layer_descriptors[0].digest.hex
    cut = blob.read_bytes()[:100]
    blob.unlink()  # a file of its own: the layout's blob may be a hard link to the store's
    blob.write_bytes(cut)
    with pytest.raises(ServimgError):
        read_layout(out, BlobStore(work / "cache"))
    write_layout(base.image, out, store, tag="t")
    assert read_layout(out, BlobStore(work / "cache2")) == base.image
