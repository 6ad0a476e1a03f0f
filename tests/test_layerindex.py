"""Layer indexes by diffID and the cached merged view of a chain (oci.layerindex, oci.fsindex).

The cached view must answer exactly what the in-memory merge of the tars answers (random stacks of
whiteouts, opaque dirs, files replacing dirs, hardlinks, symlinks, non-UTF-8 names), read no tar header
once warm, be keyed by the ORDERED diffIDs, and never trust a cache file it cannot read.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fakebase as fb
from fakebase import D, F, H, M, S
from servimg.core.digest import Digest
from servimg.core.errors import LayerError
from servimg.oci import fsindex
from servimg.oci.filesystem import LayeredFS
from servimg.oci.layerindex import IndexCache, LayerIndex


def _chain(tmp: Path, layers: list[list[M]]) -> list[tuple[Path, Digest]]:
    out = []
    for i, members in enumerate(layers):
        raw = fb.tar(members)
        path = tmp / f"layer{i}-{Digest.of_bytes(raw).hex[:8]}.tar"
        path.write_bytes(raw)
        out.append((path, Digest.of_bytes(raw)))
    return out


def _state(fs: LayeredFS) -> dict[str, object]:
    """Everything a caller can observe: every node, every listing, the dirs by name, file contents."""
    nodes = {n.path: n for n in fs.walk("")}
    out: dict[str, object] = {"nodes": nodes, "site": fs.dirs_named({"pkg", "x"})}
    for path, node in nodes.items():
        if node.is_dir:
            out[f"ls:{path}"] = fs.listdir(path)
            kids = [f"{path}/{name}" if path else name for name in fs.listdir(path)]
            out[f"links:{path}"] = sorted(fs.symlinks_in(path))
            assert out[f"links:{path}"] == [k for k in kids if nodes[k].is_symlink]  # one query = lstat each
            out[f"below:{path}"] = sorted(fs.paths_below(path))
            assert out[f"below:{path}"] == sorted(n.path for n in fs.below(path))
        elif node.is_file:
            out[f"read:{path}"] = fs.read(path, follow=False)
    return out


_name = st.sampled_from(["a", "b", "pkg", "x", "b\udcff"])
_path = st.lists(_name, min_size=1, max_size=3).map("/".join)


@st.composite
def _member(draw: st.DrawFn) -> M:
    path = draw(_path)
    kind = draw(st.sampled_from(["file", "dir", "symlink", "whiteout", "opaque", "hardlink"]))
    if kind == "file":
        return F(path, draw(st.binary(max_size=8)), draw(st.sampled_from([0o644, 0o755])))
    if kind == "dir":
        return D(path, draw(st.sampled_from([0o755, 0o700])))
    if kind == "symlink":
        return S(path, draw(st.sampled_from(["a", "/b/x", "../pkg"])))
    if kind == "hardlink":
        return H(path, draw(_path))
    parent, _, base = path.rpartition("/")
    marker = ".wh..wh..opq" if kind == "opaque" else f".wh.{base}"
    return F(f"{parent}/{marker}" if parent else marker)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layers=st.lists(st.lists(_member(), max_size=8), min_size=1, max_size=3))
def test_cached_view_equals_the_merge_of_the_tars(
    tmp_path_factory: pytest.TempPathFactory, layers: list[list[M]]
) -> None:
    tmp = tmp_path_factory.mktemp("chain")
    chain = _chain(tmp, layers)
    try:
        direct = _state(LayeredFS([p for p, _ in chain]))
    except LayerError as exc:  # a hostile stack (hardlink to nothing …) is refused the same way
        with pytest.raises(LayerError) as cold:
            LayeredFS.cached(chain, tmp / "cache")
        assert cold.value.message == exc.message
        return
    assert _state(LayeredFS.cached(chain, tmp / "cache")) == direct, "cold: built from the tars"
    assert _state(LayeredFS.cached(chain, tmp / "cache")) == direct, "warm: read from the chain's table"


def test_a_warm_chain_reads_no_tar_header(tmp_path: Path) -> None:
    chain = _chain(
        tmp_path,
        [
            [D("usr"), D("usr/lib"), D("usr/lib/site-packages"), F("usr/lib/site-packages/m.py", b"1")],
            [F("usr/lib/site-packages/m.py", b"22"), F("usr/lib/site-packages/.wh.gone")],
        ],
    )
    LayeredFS.cached(chain, tmp_path / "cache")
    # Headers gone (the data stays where the index says): the warm view must not need them.
    for path, _ in chain:
        raw = bytearray(path.read_bytes())
        raw[:512] = b"\x01" * 512
        path.write_bytes(bytes(raw))
    fs = LayeredFS.cached(chain, tmp_path / "cache")
    assert fs.dirs_named({"site-packages"}) == ["usr/lib/site-packages"]
    assert fs.listdir("usr/lib/site-packages") == ["m.py"]
    assert fs.read("usr/lib/site-packages/m.py") == b"22"
    with pytest.raises(LayerError, match="not a readable tar"):
        LayeredFS([p for p, _ in chain])  # the uncached reader does read them


def test_the_chain_key_is_the_ordered_diff_ids(tmp_path: Path) -> None:
    one = _chain(tmp_path, [[F("f", b"lower")], [F("f", b"upper")]])
    LayeredFS.cached(one, tmp_path / "cache")
    flipped = list(reversed(one))
    assert LayeredFS.cached(flipped, tmp_path / "cache").read("f") == b"lower"
    assert LayeredFS.cached(one[:1], tmp_path / "cache").read("f") == b"lower"
    assert LayeredFS.cached(one, tmp_path / "cache").read("f") == b"upper"
    assert len(list((tmp_path / "cache" / "fs-index").rglob("*.sqlite"))) == 3
    assert len(list((tmp_path / "cache" / "layer-index").rglob("*.json"))) == 2, "one index per diffID"


def test_an_unreadable_cache_file_is_made_again(tmp_path: Path) -> None:
    chain = _chain(tmp_path, [[D("d"), F("d/f", b"data")]])
    cache = tmp_path / "cache"
    LayeredFS.cached(chain, cache)
    table = fsindex.table_path(cache, [d for _, d in chain])
    index = IndexCache(cache).path(chain[0][1])
    table.write_bytes(b"not sqlite")
    index.write_bytes(b'{"format": "v0"}')
    assert LayeredFS.cached(chain, cache).read("d/f") == b"data"
    assert LayerIndex.from_bytes(index.read_bytes()) == LayerIndex.read(chain[0][0], 0)
    assert LayeredFS.cached(chain, cache).listdir("d") == ["f"]


def test_an_index_round_trips_names_that_are_not_utf8(tmp_path: Path) -> None:
    chain = _chain(tmp_path, [[D("d\udcff"), F("d\udcff/f\udcfe", b"x", 0o755), H("h", "d\udcff/f\udcfe")]])
    index = LayerIndex.read(chain[0][0], 0)
    assert LayerIndex.from_bytes(index.to_bytes()) == index
    LayeredFS.cached(chain, tmp_path / "cache")
    fs = LayeredFS.cached(chain, tmp_path / "cache")
    assert fs.listdir("d\udcff") == ["f\udcfe"]
    node = fs.lstat("h")
    assert node is not None and node.type == tarfile.REGTYPE and fs.read("h") == b"x"
