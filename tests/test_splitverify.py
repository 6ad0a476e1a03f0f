"""Split build verification (builder.splitverify) must not weaken anything the whole probe catches.

On the tiny test image (bookworm, python3.11; built once for the module): the split verdicts equal the
whole probe's (`verify_image_value`, what `servimg verify` runs) check by check, for the clean image and
for servimg layers with a defect planted IN them (a shadowing `.pth`, a changed untouched file the
layer now carries, a deleted RECORD'd file); a base verdict cached for one base is never used for another
(a second base = the first + a layer that changes an untouched file of the declared distribution: the
RECORD mismatch is caught, under another cache key).
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import tarfile
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from conftest import _require, docker_available
from servimg.backends import engine
from servimg.builder import warmroot
from servimg.builder.splitverify import Setting, base_key, verify_split
from servimg.builder.verify import VerifyReport, verify_image_value
from servimg.oci.image import Descriptor, Image, Layer
from servimg.oci.layer import Entry, Kind, write_layer
from servimg.oci.layerindex import OPAQUE, LayerIndex
from servimg.oci.store import BlobStore
from tinyimage import Tiny, build_tiny

pytestmark = [pytest.mark.docker, pytest.mark.root]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tiny]:
    _require(os.geteuid() == 0 and shutil.which("mmdebstrap") is not None, "needs root and mmdebstrap")
    _require(docker_available(), "needs a running Docker Engine")
    _require(warmroot.available(), "needs overlayfs in a private mount namespace")
    store = BlobStore()
    built = build_tiny("bookworm", store, tmp_path_factory.mktemp("split") / "repo", print)
    yield built
    engine.remove(built.image.config_digest)


def _verdicts(report: VerifyReport) -> list[tuple[str, str, str]]:
    return [(f.code, f.subject, f.status.value) for f in report.findings]


def _layer_entries(tar: Path) -> list[Entry]:
    """The servimg layer's own entries (to write it again with a defect in it)."""
    index = LayerIndex.read(tar, 0)
    out = []
    with tar.open("rb") as fh:
        for m in index.members:
            if m.type == tarfile.DIRTYPE:
                out.append(Entry(m.path, Kind.DIR, m.mode))
            elif m.type == tarfile.SYMTYPE:
                out.append(Entry(m.path, Kind.SYMLINK, linkname=m.linkname))
            else:
                fh.seek(m.offset_data)
                out.append(Entry(m.path, Kind.FILE, m.mode, data=fh.read(m.size)))
    out += [Entry(p, Kind.OPAQUE if k == OPAQUE else Kind.WHITEOUT) for p, k in index.deletions]
    return out


def _on(tiny: Tiny, base: Image, entries: Sequence[Entry], label: str) -> Image:
    """`base` + one layer of `entries` (parents added), its blob in the store."""
    have = {e.path for e in entries}
    parents = {p.rpartition("/")[0] for p in have} - have - {""}
    while any(p.rpartition("/")[0] not in have | parents | {""} for p in parents):
        parents |= {p.rpartition("/")[0] for p in parents} - have - {""}
    full = [*entries, *(Entry(p, Kind.DIR, 0o755) for p in sorted(parents))]
    dest = tiny.store.root / "tmp" / f"split-{uuid.uuid4().hex}"
    dest.parent.mkdir(exist_ok=True)
    blob = write_layer(full, dest, mtime=tiny.lock.source_date_epoch)
    tiny.store.adopt(dest, blob.digest)
    created = dt.datetime.fromtimestamp(tiny.lock.source_date_epoch, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    media = tiny.image.layers[-1].descriptor.media_type
    return base.with_layer(
        Layer(Descriptor(media, blob.digest, blob.size), blob.diff_id),
        labels={"io.servimg.test.split": label},
        created=created,
        history=label,
    )


def _servimg_layer(tiny: Tiny) -> list[Entry]:
    top = tiny.image.layers[-1]
    return _layer_entries(tiny.store.uncompressed(top.descriptor.digest, top.diff_id))


def _with_defect(tiny: Tiny, extra: Sequence[Entry], label: str) -> Image:
    paths = {e.path for e in extra}
    kept = [e for e in _servimg_layer(tiny) if e.path not in paths]
    return _on(tiny, tiny.base, [*kept, *extra], label)


def _whole(tiny: Tiny, image: Image) -> VerifyReport:
    existed = engine.has_image(image.config_digest)
    try:
        return verify_image_value(image, tiny.store, print, base_config=tiny.base.config_digest)
    finally:
        if not existed:
            engine.remove(image.config_digest)


def test_the_clean_image_gets_the_whole_probes_verdicts(tiny: Tiny) -> None:
    split = verify_split(tiny.image, tiny.store, print)
    assert split.ok, split.problems()
    whole = verify_image_value(tiny.image, tiny.store, print)
    assert _verdicts(split) == _verdicts(whole)
    assert split.spec_sha256 == whole.spec_sha256, "the verdict answers the image's own spec"
    record = [f for f in split.findings if f.code == "RECORD"]
    assert [f.details.get("verified") for f in record] == [
        f.details.get("verified") for f in whole.findings if f.code == "RECORD"
    ], "the merged count is the whole probe's count"


def test_a_shadowing_pth_in_the_servimg_layer_is_caught_on_a_cached_base(tiny: Tiny) -> None:
    verify_split(tiny.image, tiny.store, print)  # the base verdict is cached now
    shadow = "opt/shadow"
    planted = _with_defect(
        tiny,
        [
            Entry(
                f"{tiny.site.lstrip('/')}/00-shadow.pth",
                Kind.FILE,
                0o644,
                data=f"import sys; sys.path.insert(0, '/{shadow}')\n".encode(),
            ),
            Entry(f"{shadow}/tinypkg/__init__.py", Kind.FILE, 0o644, data=b""),
            Entry(f"{shadow}/tinypkg/core.py", Kind.FILE, 0o644, data=b"x = 1\n"),
        ],
        "shadowing .pth",
    )
    split = verify_split(planted, tiny.store, print)
    assert not split.ok
    assert any(f.code == "ORIGIN" and f.status.value == "FAIL" for f in split.findings), split.problems()
    assert _verdicts(split) == _verdicts(_whole(tiny, planted))


def test_a_layer_that_changes_or_deletes_recorded_files_fails_record(tiny: Tiny) -> None:
    util = f"{tiny.pkg.lstrip('/')}/util.py"
    changed = _with_defect(tiny, [Entry(util, Kind.FILE, 0o644, data=b"# not tinypkg's\n")], "changed util")
    split = verify_split(changed, tiny.store, print)
    record = [f for f in split.findings if f.code == "RECORD"]
    assert [f.status.value for f in record] == ["FAIL"] and "util.py: differs from RECORD" in record[
        0
    ].message
    assert _verdicts(split) == _verdicts(_whole(tiny, changed))
    deleted = _with_defect(tiny, [Entry(util, Kind.WHITEOUT)], "deleted util")
    split = verify_split(deleted, tiny.store, print)
    assert "util.py: missing" in next(f.message for f in split.findings if f.code == "RECORD")
    assert _verdicts(split) == _verdicts(_whole(tiny, deleted))


def test_a_cached_base_verdict_is_never_used_for_another_base(tiny: Tiny) -> None:
    seen_a: list[str] = []
    verify_split(tiny.image, tiny.store, seen_a.append)  # base A's verdict: cached, PASS
    util = f"{tiny.pkg.lstrip('/')}/util.py"
    base_b = _on(tiny, tiny.base, [Entry(util, Kind.FILE, 0o644, data=b"# planted in base B\n")], "base B")
    on_b = _on(tiny, base_b, _servimg_layer(tiny), "servimg layer on base B")
    seen_b: list[str] = []
    report = verify_split(on_b, tiny.store, seen_b.append)
    record = next(f for f in report.findings if f.code == "RECORD")
    assert record.status.value == "FAIL" and "util.py: differs from RECORD" in record.message
    key_a = [m for m in seen_a if m.startswith("base verdict: cached (")]
    assert key_a and not any(key_a[0] in m for m in seen_b), "base B did not get base A's verdict"
    spec = {"interpreter": {}, "distributions": []}
    setting = Setting("/usr/bin/python3", (), None, {}, "/")
    assert base_key(tiny.base.diff_ids, b"p", spec, setting) != base_key(base_b.diff_ids, b"p", spec, setting)
    assert base_key(tiny.base.diff_ids, b"p", spec, setting) != base_key(
        tiny.base.diff_ids, b"q", spec, setting
    )


# -- UNCHECKED_PYC: the base's list merged with what the layer changes ------------------------------
def _unchecked_pyc(tiny: Tiny) -> bytes:
    """An unchecked-hash pyc header for the image's interpreter (flags 0b01), then any code."""
    return bytes.fromhex(tiny.lock.interpreter.magic) + (1).to_bytes(4, "little") + bytes(8) + b"\xe3"


def _unchecked_findings(report: VerifyReport) -> list[tuple[str, str, str, object]]:
    return [
        (f.status.value, f.message, f.hint, f.details.get("pycs"))
        for f in report.findings
        if f.code == "UNCHECKED_PYC"
    ]


def test_an_unchecked_pyc_in_the_servimg_layer_is_reported_as_the_whole_probe_does(tiny: Tiny) -> None:
    verify_split(tiny.image, tiny.store, print)  # the base verdict is cached now
    planted_paths = [tiny.pyc(f"{tiny.pkg}/util.py"), f"{tiny.pkg}/legacy.pyc"]
    planted = _with_defect(
        tiny,
        [Entry(p.lstrip("/"), Kind.FILE, 0o644, data=_unchecked_pyc(tiny)) for p in planted_paths],
        "unchecked pycs in the layer",
    )
    seen: list[str] = []
    split = verify_split(planted, tiny.store, seen.append)
    assert "UNCHECKED_PYC: merged from the base verdict for tinypkg" in seen
    [(status, message, _, pycs)] = _unchecked_findings(split)
    assert status == "WARN" and "2 unchecked-hash pyc(s)" in message
    assert pycs == [f"{tiny.pkg}/legacy.pyc", tiny.pyc(f"{tiny.pkg}/util.py")], "the walk's order"
    whole = _whole(tiny, planted)
    assert _verdicts(split) == _verdicts(whole)
    assert _unchecked_findings(split) == _unchecked_findings(whole), "the whole probe's words"


def test_an_unchecked_pyc_of_the_base_is_kept_unless_the_layer_removes_it(tiny: Tiny) -> None:
    pyc = tiny.pyc(f"{tiny.pkg}/util.py")
    base_c = _on(tiny, tiny.base, [Entry(pyc.lstrip("/"), Kind.FILE, 0o644, data=_unchecked_pyc(tiny))], "C")
    kept = _on(tiny, base_c, _servimg_layer(tiny), "servimg layer on base C")
    seen: list[str] = []
    split = verify_split(kept, tiny.store, seen.append)
    assert "UNCHECKED_PYC: merged from the base verdict for tinypkg" in seen
    assert [(s, p) for s, _, _, p in _unchecked_findings(split)] == [("WARN", [pyc])]
    assert _unchecked_findings(split) == _unchecked_findings(_whole(tiny, kept))
    assert _verdicts(split) == _verdicts(_whole(tiny, kept))
    removed = _on(tiny, base_c, [*_servimg_layer(tiny), Entry(pyc.lstrip("/"), Kind.WHITEOUT)], "rm pyc")
    split = verify_split(removed, tiny.store, print)
    assert [s for s, *_ in _unchecked_findings(split)] == ["PASS"]
    assert _unchecked_findings(split) == _unchecked_findings(_whole(tiny, removed))
    # the layer's own checked-hash pyc over it: the base's unchecked one is replaced, so PASS
    checked = next(e for e in _servimg_layer(tiny) if e.path.endswith(".pyc"))
    over = Entry(pyc.lstrip("/"), Kind.FILE, 0o644, data=checked.data)
    replaced = _on(tiny, base_c, [*_servimg_layer(tiny), over], "checked pyc over it")
    split = verify_split(replaced, tiny.store, print)
    assert [s for s, *_ in _unchecked_findings(split)] == ["PASS"]
    assert _unchecked_findings(split) == _unchecked_findings(_whole(tiny, replaced))


def test_a_pycache_the_layer_turns_into_a_link_is_walked_whole(tiny: Tiny) -> None:
    """A link in the layer under the package root: the merge is not used; the walk in the final tree is."""
    pycache = f"{tiny.pkg}/__pycache__"
    elsewhere = "opt/elsewhere"
    linked = _with_defect(
        tiny,
        [
            Entry(f"{elsewhere}/util.{tiny.cache_tag}.pyc", Kind.FILE, 0o644, data=_unchecked_pyc(tiny)),
            Entry(
                f"{tiny.pkg.lstrip('/')}/extra.pyc",
                Kind.SYMLINK,
                linkname=f"/{elsewhere}/util.{tiny.cache_tag}.pyc",
            ),
        ],
        f"a linked pyc under {pycache}",
    )
    seen: list[str] = []
    split = verify_split(linked, tiny.store, seen.append)
    assert any(m.endswith("walked whole for tinypkg") for m in seen), seen
    assert [s for s, *_ in _unchecked_findings(split)] == ["WARN"]
    assert _unchecked_findings(split) == _unchecked_findings(_whole(tiny, linked))
