"""Deterministic layers and the layered filesystem view (OCI changeset semantics)."""

from __future__ import annotations

import gzip
import random
import tarfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servimg.core.errors import LayerError
from servimg.oci.filesystem import LayeredFS
from servimg.oci.layer import Entry, Kind, diff_id_of, write_layer


def _layer(tmp: Path, name: str, entries: list[Entry], **kw: object) -> Path:
    write_layer(entries, tmp / name, mtime=1_700_000_000, **kw)  # type: ignore[arg-type]
    return tmp / name


def test_tar_headers_are_normalised(tmp_path: Path) -> None:
    path = _layer(tmp_path, "l", [Entry("b/x.py", Kind.FILE, 0o4755, data=b"x"), Entry("b", Kind.DIR, 0o700)])
    with tarfile.open(path) as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == ["b", "b/x.py"]
    for m in members:
        assert (m.uid, m.gid, m.uname, m.gname, m.mtime) == (0, 0, "", "", 1_700_000_000)
        assert "atime" not in m.pax_headers and "ctime" not in m.pax_headers
    assert members[1].mode == 0o4755


def test_gzip_header_has_no_time_or_name(tmp_path: Path) -> None:
    blob = write_layer([Entry("a", Kind.FILE, data=b"a")], tmp_path / "l.gz", mtime=0, compress=True)
    raw = (tmp_path / "l.gz").read_bytes()
    assert raw[:2] == b"\x1f\x8b"
    assert raw[3] & 0x08 == 0, "FNAME flag must be unset"
    assert raw[4:8] == b"\0\0\0\0", "gzip MTIME must be 0"
    assert diff_id_of(tmp_path / "l.gz") == blob.diff_id
    assert gzip.decompress(raw)[:1] == b"a"


def test_duplicate_entries_are_refused(tmp_path: Path) -> None:
    with pytest.raises(LayerError, match="duplicate"):
        write_layer(
            [Entry("a", Kind.FILE, data=b"1"), Entry("a", Kind.FILE, data=b"2")], tmp_path / "l", mtime=0
        )
    assert not (tmp_path / "l").exists() and not list(tmp_path.iterdir()), "no partial blob left behind"


def test_path_escape_is_refused(tmp_path: Path) -> None:
    with pytest.raises(LayerError, match="escapes"):
        LayeredFS([_layer(tmp_path, "l", [Entry("../etc/passwd", Kind.FILE, data=b"")])])


_names = st.text(alphabet="abcxyz_.", min_size=1, max_size=6).filter(lambda s: s not in (".", ".."))


@settings(max_examples=40, deadline=None)
@given(
    st.dictionaries(
        st.lists(_names, min_size=1, max_size=3).map("/".join),
        st.binary(max_size=64),
        min_size=1,
        max_size=12,
    ),
    st.randoms(),
)
def test_any_file_set_is_deterministic_in_any_order(files: dict[str, bytes], rnd: random.Random) -> None:
    import tempfile

    # Drop paths that are also a parent of another path (a file cannot also be a directory).
    keys = [k for k in files if not any(o.startswith(k + "/") for o in files)]
    entries = [Entry(k, Kind.FILE, 0o644, data=files[k]) for k in keys]
    with tempfile.TemporaryDirectory() as tmp:
        one = write_layer(entries, Path(tmp) / "a", mtime=7)
        shuffled = entries[:]
        rnd.shuffle(shuffled)
        two = write_layer(shuffled, Path(tmp) / "b", mtime=7)
        assert one == two
        fs = LayeredFS([Path(tmp) / "a"])
        for k in keys:
            assert fs.read(k) == files[k]


def test_whiteouts_opaque_and_replacement(tmp_path: Path) -> None:
    lower = _layer(
        tmp_path,
        "1",
        [
            Entry("d/keep", Kind.FILE, data=b"keep"),
            Entry("d/gone", Kind.FILE, data=b"gone"),
            Entry("o/old", Kind.FILE, data=b"old"),
            Entry("f/sub/x", Kind.FILE, data=b"x"),
            Entry("link", Kind.SYMLINK, linkname="/d"),
        ],
    )
    upper = _layer(
        tmp_path,
        "2",
        [
            Entry("d/gone", Kind.WHITEOUT),
            Entry("o", Kind.OPAQUE),
            Entry("o/new", Kind.FILE, data=b"new"),
            Entry("f", Kind.FILE, data=b"now a file"),
        ],
    )
    fs = LayeredFS([lower, upper])
    assert fs.listdir("d") == ["keep"]
    assert fs.listdir("o") == ["new"]
    assert fs.read("f") == b"now a file" and not fs.exists("f/sub/x")
    assert fs.read("link/keep") == b"keep"
    assert fs.resolve("link/../../../../d/keep") == "d/keep", "'..' never climbs above the root"


def test_symlink_loop_is_an_error(tmp_path: Path) -> None:
    fs = LayeredFS(
        [
            _layer(
                tmp_path,
                "l",
                [Entry("a", Kind.SYMLINK, linkname="b"), Entry("b", Kind.SYMLINK, linkname="a")],
            )
        ]
    )
    with pytest.raises(LayerError, match="symbolic links"):
        fs.resolve("a/x")
