"""File-level diffs of layers, trees and images (`servimg diff --files`): which paths differ, and how."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from servimg import cli
from servimg.backends.layout import write_layout
from servimg.core.errors import LayerError
from servimg.oci.image import OCI_LAYER, OCI_LAYER_GZIP, Descriptor, Image, Layer
from servimg.oci.layer import Entry, Kind, write_layer
from servimg.oci.listing import (
    FileEntry,
    LayerListing,
    escape,
    listing_from_dir,
    listing_from_tar,
    parse_listing,
    render_listing,
    unescape,
)
from servimg.oci.store import BlobStore
from servimg.oci.treediff import (
    Change,
    compare_images,
    describe,
    diff_images,
    diff_listings,
    explain,
    summary,
)

MTIME = 1_767_225_600


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _f(path: str, data: bytes, mode: int = 0o644) -> FileEntry:
    return FileEntry(path, "f", mode, 0, 0, len(data), MTIME, _sha(data))


def _d(path: str, mode: int = 0o755) -> FileEntry:
    return FileEntry(path, "d", mode, 0, 0, 0, MTIME, "")


BASE = [
    Entry("bin", Kind.DIR, 0o755),
    Entry("bin/tool", Kind.FILE, 0o755, data=b"#!/bin/sh\n"),
    Entry("etc", Kind.DIR, 0o755),
    Entry("etc/shadow", Kind.FILE, 0o640, data=b"root:x:1\n"),
    Entry("old.txt", Kind.FILE, 0o644, data=b"old"),
    Entry("usr", Kind.DIR, 0o755),
    Entry("usr/lib", Kind.SYMLINK, 0o777, linkname="../lib"),
]
OTHER = [
    Entry("bin", Kind.DIR, 0o755),
    Entry("bin/tool", Kind.FILE, 0o700, data=b"#!/bin/sh\n"),  # mode
    Entry("etc", Kind.DIR, 0o755),
    Entry("etc/shadow", Kind.FILE, 0o640, data=b"root:x:12\n"),  # content
    Entry("new.txt", Kind.FILE, 0o600, data=b"new"),  # added; old.txt removed
    Entry("usr", Kind.DIR, 0o755),
    Entry("usr/lib", Kind.SYMLINK, 0o777, linkname="../lib"),
]
EXPECTED = (
    Change(
        "bin/tool",
        "changed",
        _f("bin/tool", b"#!/bin/sh\n", 0o755),
        _f("bin/tool", b"#!/bin/sh\n", 0o700),
        ("mode",),
    ),
    Change(
        "etc/shadow",
        "changed",
        _f("etc/shadow", b"root:x:1\n", 0o640),
        _f("etc/shadow", b"root:x:12\n", 0o640),
        ("size", "digest"),
    ),
    Change("new.txt", "added", None, _f("new.txt", b"new", 0o600)),
    Change("old.txt", "removed", _f("old.txt", b"old"), None),
)


def _listing(tmp: Path, entries: Sequence[Entry], name: str = "layer") -> LayerListing:
    write_layer(entries, tmp / name, mtime=MTIME)
    with (tmp / name).open("rb") as fh:
        return listing_from_tar(fh)


def test_layers_differ_in_exactly_the_changed_paths(tmp_path: Path) -> None:
    a, b = _listing(tmp_path, BASE, "a"), _listing(tmp_path, OTHER, "b")
    assert a.by_path()["usr/lib"] == FileEntry("usr/lib", "l", 0o777, 0, 0, 0, MTIME, "../lib")
    assert a.by_path()["etc"] == _d("etc")
    assert diff_listings(a, b) == EXPECTED
    assert diff_listings(a, a) == ()
    assert [c.what for c in diff_listings(b, a)] == ["changed", "changed", "removed", "added"]
    sa, sb = _sha(b"root:x:1\n"), _sha(b"root:x:12\n")
    assert [describe(c) for c in EXPECTED] == [
        "bin/tool: changed mode 0755 → 0700",
        f"etc/shadow: changed size 9 → 10, sha256 {sa[:8]}… → {sb[:8]}…",
        f"new.txt: added file, size 3, mode 0600, sha256 {_sha(b'new')[:8]}…",
        f"old.txt: removed file, size 3, mode 0644, sha256 {_sha(b'old')[:8]}…",
    ]


def test_describe_names_every_kind_of_change() -> None:
    a = FileEntry("x", "f", 0o644, 0, 0, 502, 1767225600, "1a2b3c4d" + "0" * 56)
    b = FileEntry("x", "f", 0o644, 1000, 0, 503, 1767311999, "5e6f7a8b" + "0" * 56)
    change = diff_listings(LayerListing((a,)), LayerListing((b,)))[0]
    assert change.fields == ("size", "digest", "uid", "mtime")
    assert describe(change) == (
        "x: changed size 502 → 503, sha256 1a2b3c4d… → 5e6f7a8b…, uid 0 → 1000, mtime 1767225600 → 1767311999"
    )
    link = FileEntry("x", "l", 0o777, 0, 0, 0, 1767225600, "/etc/target")
    change = diff_listings(LayerListing((a,)), LayerListing((link,)))[0]
    assert describe(change) == (
        "x: changed kind file → symlink, size 502 → 0, sha256 1a2b3c4d… → target '/etc/target', "
        "mode 0644 → 0777"
    )
    weird = FileEntry("a\nb", "p", 0o600, 0, 0, 0, 0, "")
    assert describe(Change("a\nb", "added", None, weird)) == "a\\nb: added fifo, mode 0600"


ODD = LayerListing.of(
    [
        _d("."),
        _f("a\tb\\c\nd\re", b"odd name"),
        _f("caf\udce9", b"not utf-8"),  # a Latin-1 name, kept by surrogateescape
        FileEntry("dev/null", "c", 0o666, 0, 0, 0, MTIME, "1,3"),
        FileEntry("dev/sda", "b", 0o660, 0, 6, 0, MTIME, "8,0"),
        FileEntry("hard", "h", 0o644, 0, 0, 0, MTIME, "a\tb\\c\nd\re"),
        FileEntry("link", "l", 0o777, 0, 0, 0, -5, "tab\there"),
        FileEntry("pipe", "p", 0o600, 65534, 65534, 0, MTIME, ""),
        _f("sbin/su", b"su", 0o4755),
    ]
)


def test_render_and_parse_round_trip() -> None:
    data = render_listing(ODD)
    assert data.endswith(b"\n") and data.count(b"\n") == len(ODD)
    assert parse_listing(data) == ODD
    assert render_listing(parse_listing(data)) == data
    for entry in ODD:
        assert FileEntry.from_line(entry.line()) == entry
        assert "\n" not in entry.line() and entry.line().count("\t") == 7
    assert b"sbin/su\tf\t4755\t0\t0\t2\t" in data
    assert render_listing(LayerListing()) == b"" and parse_listing(b"") == LayerListing()
    assert parse_listing(data.rstrip(b"\n")) == ODD, "a missing final newline is tolerated"


@given(st.text())
def test_escape_round_trips_any_text(text: str) -> None:
    escaped = escape(text)
    assert "\t" not in escaped and "\n" not in escaped and "\r" not in escaped
    assert unescape(escaped) == text


def test_parse_collects_every_problem() -> None:
    good = _f("b", b"b").line()
    bad = "\n".join(
        [
            good,
            "only\tthree\tfields",
            "c\tz\t0644\t0\t0\t0\t0\t",  # kind
            "d\tf\t644\tx\t0\t1\t0\tnothex",  # mode, uid, digest
            "./e\td\t0755\t0\t0\t0\t0\t",  # not normalised
            "../f\td\t0755\t0\t0\t0\t0\t",  # escapes
            "g\\q\td\t0755\t0\t0\t0\t0\t",  # bad escape
            "h\td\t0755\t0\t0\t7\t0\tzz",  # size and digest of a directory
            good,  # repeated: not after itself
            "",  # blank line
            "a\td\t0755\t0\t0\t0\t0\t",  # out of order
        ]
    ).encode()
    with pytest.raises(LayerError) as err:
        parse_listing(bad + b"\n")
    problems = err.value.problems
    assert [p.split(":", 1)[0] for p in problems] == [
        "line 2",
        "line 3",
        "line 4",
        "line 4",
        "line 5",
        "line 6",
        "line 7",
        "line 8",
        "line 8",
        "line 9",
        "line 10",
        "line 11",
    ]
    text = "\n".join(problems)
    for needle in (
        "expected 8 tab-separated fields, got 3",
        "kind 'z' is not one of f d l h c b p",
        "mode '644' is not 4 octal digits",
        "uid 'x' is not a non-negative integer",
        "is not normalised (expected 'e')",
        "escapes the image root",
        "bad escape '\\\\q'",
        "size 7 of a directory must be 0",
        "'b' is not after 'b'",
        "'a' is not after 'b'",
    ):
        assert needle in text, needle
    assert "line 4: digest" not in text, "kind checks only run on otherwise well-formed lines"
    with pytest.raises(LayerError, match="malformed listing line"):
        FileEntry.from_line("nope")
    with pytest.raises(LayerError, match="not sorted"):
        LayerListing((_f("b", b""), _f("a", b"")))


def _tree(root: Path) -> None:
    (root / "etc" / "deep").mkdir(parents=True)
    (root / "etc" / "conf").write_bytes(b"key = value\n")
    (root / "etc" / "deep" / "tab\tname").write_bytes(b"x" * 70000)
    (root / "empty").write_bytes(b"")
    (root / "run.sh").write_bytes(b"#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    (root / "etc" / "link").symlink_to("deep")  # a link to a directory is listed, not followed
    (root / "dangling").symlink_to("/nowhere")
    os.mkfifo(root / "fifo", 0o600)
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        for name in (*filenames, *dirnames):
            os.utime(Path(dirpath, name), (MTIME, MTIME + 1), follow_symlinks=False)


def test_listing_from_dir_agrees_with_a_tar_of_the_same_tree(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    root.mkdir()
    _tree(root)
    from_dir = listing_from_dir(root)
    paths = [e.path for e in from_dir]
    assert paths == sorted(paths) and "etc/deep/tab\tname" in paths and "etc/link/tab\tname" not in paths
    with tarfile.open(tmp_path / "tree.tar", "w") as tar:
        for path in paths:
            tar.add(root / path, arcname=path, recursive=False)
    with (tmp_path / "tree.tar").open("rb") as fh:
        from_tar = listing_from_tar(fh)
    assert from_tar == from_dir
    by_path = from_dir.by_path()
    assert by_path["etc/link"].kind == "l" and by_path["etc/link"].digest == "deep"
    assert by_path["fifo"].kind == "p" and by_path["run.sh"].mode == 0o755
    assert by_path["etc/deep/tab\tname"].digest == _sha(b"x" * 70000)
    assert by_path["etc/conf"].mtime == MTIME + 1


def test_tar_listing_keeps_the_root_entry_and_refuses_escapes(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, kind in (("./", tarfile.DIRTYPE), ("./a", tarfile.REGTYPE), ("./a", tarfile.REGTYPE)):
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = kind, 0o700, MTIME
            tar.addfile(info, io.BytesIO(b""))
        info = tarfile.TarInfo("b")
        info.type, info.linkname = tarfile.LNKTYPE, "./a"
        tar.addfile(info)
    buf.seek(0)
    listing = listing_from_tar(buf)
    assert [(e.path, e.kind, e.digest) for e in listing] == [
        (".", "d", ""),
        ("a", "f", _sha(b"")),
        ("b", "h", "a"),
    ]
    assert parse_listing(render_listing(listing)) == listing
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.addfile(tarfile.TarInfo("../../etc/passwd"), io.BytesIO(b""))
    buf.seek(0)
    with pytest.raises(LayerError, match="escapes"):
        listing_from_tar(buf)
    with pytest.raises(LayerError, match="not a readable"):
        listing_from_tar(io.BytesIO(b"\x1f\x8b not a tar" * 100))


# -- images --------------------------------------------------------------------------------------------
def _layer(store: BlobStore, entries: Sequence[Entry], *, compress: bool = False) -> Layer:
    tmp = store.root / "tmp"
    tmp.mkdir(exist_ok=True)
    dest = tmp / f"layer-{_sha(repr((entries, compress)).encode())[:16]}"
    blob = write_layer(entries, dest, mtime=MTIME, compress=compress)
    store.adopt(dest, blob.digest)
    return Layer(Descriptor(OCI_LAYER_GZIP if compress else OCI_LAYER, blob.digest, blob.size), blob.diff_id)


def _image(store: BlobStore, layers: list[Layer], label: str = "1") -> Image:
    config = {
        "architecture": "amd64",
        "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": [str(x.diff_id) for x in layers]},
        "config": {"Labels": {"build": label}, "Env": ["PATH=/usr/bin"]},
    }
    image = Image.create(config, layers)
    store.put_bytes(image.config_bytes)
    store.put_bytes(image.manifest_bytes)
    return image


BOTTOM = [Entry("lib", Kind.DIR, 0o755), Entry("lib/libc.so", Kind.FILE, 0o755, data=b"\x7fELF")]


def test_image_diff_names_the_layer_and_paths(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "cache")
    bottom = _layer(store, BOTTOM)
    a = _image(store, [bottom, _layer(store, BASE)])
    b = _image(store, [bottom, _layer(store, OTHER)], label="2")
    read: list[Layer] = []
    result = diff_images(a, b, store)

    def spy(layer: Layer) -> LayerListing:
        read.append(layer)
        with store.uncompressed(layer.descriptor.digest, layer.diff_id).open("rb") as fh:
            return listing_from_tar(fh)

    assert compare_images(a, b, spy) == result
    assert bottom not in read, "identical layers are never read"
    assert not result.identical
    assert [x.status for x in result.layers] == ["identical", "changed"]
    assert result.layers[0].changes == () and result.layers[1].changes == EXPECTED
    assert [c.key for c in result.config] == ["config.Labels", "rootfs"]
    assert result.config[0].before == '{"build":"1"}' and result.config[0].after == '{"build":"2"}'
    assert result.manifest == ()
    lines = explain(result)
    top_a, top_b = a.layers[1].diff_id, b.layers[1].diff_id
    assert lines[0] == f"manifest sha256:{a.digest.short}… ≠ sha256:{b.digest.short}…"
    assert '  config.Labels: {"build":"1"} → {"build":"2"}' in lines
    rootfs = next(line for line in lines if line.startswith("  rootfs: "))
    assert top_b.hex[:20] in rootfs, "long values are clipped around where they first differ"
    assert f"layer 0 (diffID sha256:{bottom.diff_id.short}…): identical" in lines
    head = f"layer 1 (diffID sha256:{top_a.short}… ≠ sha256:{top_b.short}…): 4 paths differ"
    assert lines[lines.index(head) + 1 :] == [f"  {describe(c)}" for c in EXPECTED]
    capped = explain(result, limit=1)
    assert capped[-2:] == ["  bin/tool: changed mode 0755 → 0700", "  … and 3 more"]
    assert summary(result) == "images differ: config (2 key(s)), layer 1 (4 path(s))"
    doc = json.loads(json.dumps(result.as_dict()))
    assert doc["layers"][1]["changes"][1]["fields"] == ["size", "digest"]
    assert doc["layers"][1]["changes"][2]["after"]["mode"] == "0600"
    assert explain(diff_images(a, a, store)) == [f"identical: manifest {a.digest}"]


def test_image_diff_reports_extra_layers_and_other_blobs(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "cache")
    plain, gz = _layer(store, BOTTOM), _layer(store, BOTTOM, compress=True)
    assert plain.diff_id == gz.diff_id and plain.descriptor != gz.descriptor
    extra = _layer(store, [Entry("x", Kind.FILE, data=b"x"), Entry("y", Kind.DIR)])
    result = diff_images(_image(store, [plain]), _image(store, [gz, extra]), store)
    assert [x.status for x in result.layers] == ["identical", "added"]
    assert result.layers[0].blob_differs and result.layers[0].changes == ()
    assert [(c.path, c.what) for c in result.layers[1].changes] == [("x", "added"), ("y", "added")]
    lines = explain(result)
    assert any("identical content, but blob" in line for line in lines)
    assert f"layer 1 (only in B, diffID sha256:{extra.diff_id.short}…): 2 paths added" in lines
    assert summary(result) == "images differ: config (1 key(s)), layer 0 blob, layer 1 only in B"
    back = diff_images(_image(store, [gz, extra]), _image(store, [plain]), store)
    assert back.layers[1].status == "removed" and {c.what for c in back.layers[1].changes} == {"removed"}


def test_cli_diff_files_on_two_layouts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = BlobStore(tmp_path / "build")
    bottom = _layer(store, BOTTOM)
    a = _image(store, [bottom, _layer(store, BASE)])
    b = _image(store, [bottom, _layer(store, OTHER)])
    write_layout(a, tmp_path / "a", store, tag="v1")
    write_layout(b, tmp_path / "b", store, tag="v1")
    write_layout(a, tmp_path / "a2", store, tag="v1")
    cache = ["--cache", str(tmp_path / "cache")]
    ref_a, ref_b, ref_a2 = (f"oci:{tmp_path / n}:v1" for n in ("a", "b", "a2"))

    assert cli.main(["diff", "--files", ref_a, ref_b, "--quiet", *cache]) == 1
    out = capsys.readouterr().out
    assert "etc/shadow: changed size 9 → 10" not in out, "--quiet: the FAIL line only"
    assert f"FAIL: {ref_a} {ref_b}: images differ: config (1 key(s)), layer 1 (4 path(s))" in out

    assert cli.main(["diff", "--files", ref_a, ref_b, *cache]) == 1
    out = capsys.readouterr().out
    assert "  etc/shadow: changed size 9 → 10, sha256" in out
    assert "  new.txt: added file" in out and "  old.txt: removed file" in out
    assert out.index("layer 1 (diffID") < out.index("FAIL:")

    assert cli.main(["diff", "--files", ref_a, ref_b, "--json", *cache]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["status"] == "FAIL" and doc["error"] == "ImagesDiffer"
    changes = doc["diff"]["layers"][1]["changes"]
    assert [c["path"] for c in changes] == ["bin/tool", "etc/shadow", "new.txt", "old.txt"]
    assert doc["diff"]["layers"][0]["status"] == "identical"

    assert cli.main(["diff", "--files", ref_a, ref_a2, *cache]) == 0
    out = capsys.readouterr().out
    assert f"OK: {ref_a} {ref_a2}" in out and str(a.digest) in out
    assert cli.main(["diff", "--files", ref_a, ref_a2, "--json", *cache]) == 0
    assert json.loads(capsys.readouterr().out)["identical"] is True

    args = cli.parser().parse_args(["diff", "x/y:1", "x/y:2"])
    assert args.files is False, "without --files: the provenance diff, as before"
