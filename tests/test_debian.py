"""servimg.bases.debian: pin files, the pinned-only download, the archive-moved report, the local mirror
and the neutralisation steps. Fast: a real .deb made by dpkg-deb and a real HTTP server on 127.0.0.1
stand in for the archive; the real bootstrap runs in tests/test_reproducible.py."""

from __future__ import annotations

import functools
import hashlib
import http.server
import lzma
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from servimg.bases import catalog as bases
from servimg.bases import debfetch, debian, debpins
from servimg.bases.debpins import ArchiveMovedError, DebianError, DebianPins, DebPin

SHA = "a" * 64


def _pins(*packages: DebPin, mirror: str = "http://127.0.0.1:9/debian") -> DebianPins:
    return DebianPins(
        suite="bookworm",
        mirror=mirror,
        variant="minbase",
        include=("python3",),
        release="Debian 12.99 (bookworm), test",
        packages=tuple(sorted(packages)),
    )


# ------------------------------------------------------------------------------------ pin file


def test_pin_file_round_trips_canonically() -> None:
    pins = _pins(
        DebPin("libc6", "2.36-9+deb12u13", "amd64", "optional", 2757936, SHA, "pool/main/g/glibc/libc6.deb"),
        DebPin("adduser", "3.134", "all", "important", 183272, "b" * 64, "pool/main/a/adduser/adduser.deb"),
    )
    text = pins.render()
    assert DebianPins.parse(text) == pins
    assert DebianPins.parse(text).render() == text
    assert text.index("adduser=") < text.index("libc6="), "packages are sorted"
    assert pins.key() == DebianPins.parse(text).key()


def test_pin_file_errors_are_collected_and_say_how_to_repin() -> None:
    text = (
        "suite: bookworm\nsuite: trixie\nvariant: minbase\n"
        "libc6=1 amd64 optional 10 sha256:" + SHA + " pool/x.deb\n"
        "libc6=2 amd64 optional 10 sha256:" + SHA + " pool/y.deb\n"
        "garbage line\n"
    )
    with pytest.raises(DebianError) as info:
        DebianPins.parse(text, "pins.txt")
    problems = "\n".join(info.value.problems)
    assert "suite given twice" in problems
    assert "pins.txt:6: not `name=version" in problems
    assert "missing `mirror: …`" in problems and "missing `include: …`" in problems
    assert "libc6 pinned more than once" in problems
    assert "--repin" in info.value.hint


def test_the_committed_pins_match_what_each_base_asks_for() -> None:
    for name, base in bases.BASES.items():
        pins = debpins.load_pins(name)
        assert (pins.suite, pins.variant, pins.include) == (
            base.suite,
            base.variant,
            base.include,
        ), name
        assert pins.mirror == bases.MIRROR
        assert all(p.filename.startswith("pool/main/") for p in pins.packages)
        names = {p.name for p in pins.packages}
        assert set(base.include) <= names and {"dpkg", "libc6", "apt"} <= names


def test_moved_lists_every_changed_pin() -> None:
    old = _pins(
        DebPin("a", "1", "amd64", "required", 1, SHA, "pool/a.deb"),
        DebPin("b", "1", "amd64", "required", 1, SHA, "pool/b.deb"),
    )
    new = _pins(
        DebPin("a", "2", "amd64", "required", 1, SHA, "pool/a.deb"),
        DebPin("c", "1", "amd64", "required", 1, SHA, "pool/c.deb"),
    )
    assert bases.moved(old, new) == ["a: 1 → 2", "b: 1 → (removed)", "c: (not pinned) → 1"]


# ------------------------------------------------------------------------------------ a real .deb


def _make_deb(tmp: Path, name: str, version: str, priority: str = "optional") -> Path:
    root = tmp / f"{name}-{version}-src"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "usr/share/doc" / name).mkdir(parents=True)
    (root / "usr/share/doc" / name / "README").write_text(f"{name} {version}\n")
    (root / "DEBIAN/control").write_text(
        f"Package: {name}\nVersion: {version}\nArchitecture: all\nMaintainer: servimg <t@servimg.invalid>\n"
        f"Priority: {priority}\nDescription: servimg test package\n"
    )
    out = tmp / f"{name}_{version}_all.deb"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(root), str(out)],
        check=True,
        capture_output=True,
        env={**os.environ, "SOURCE_DATE_EPOCH": "1767225600"},
    )
    return out


def _pin_of(deb: Path, name: str, version: str, priority: str = "required") -> DebPin:
    data = deb.read_bytes()
    return DebPin(
        name, version, "all", priority, len(data), hashlib.sha256(data).hexdigest(), f"pool/main/{deb.name}"
    )


needs_dpkg = pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb")


class _Archive:
    """A directory served over HTTP on 127.0.0.1, shaped like a Debian archive."""

    def __init__(self, root: Path) -> None:
        self.root = root
        handler = functools.partial(_QuietHandler, directory=str(root))
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/debian"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def publish(self, debs: list[tuple[Path, DebPin]], suite: str = "bookworm") -> None:
        pool = self.root / "debian/pool/main"
        pool.mkdir(parents=True, exist_ok=True)
        stanzas = []
        for deb, pin in debs:
            shutil.copyfile(deb, pool / deb.name)
            stanzas.append(
                f"Package: {pin.name}\nVersion: {pin.version}\nArchitecture: {pin.arch}\n"
                f"Filename: {pin.filename}\nSize: {pin.size}\nSHA256: {pin.sha256}\n"
            )
        index = lzma.compress("\n".join(stanzas).encode())
        dists = self.root / "debian/dists" / suite
        (dists / "main/binary-amd64").mkdir(parents=True, exist_ok=True)
        (dists / "main/binary-amd64/Packages.xz").write_bytes(index)
        digest = hashlib.sha256(index).hexdigest()
        (dists / "Release").write_text(
            f"Suite: {suite}\nSHA256:\n {digest} {len(index)} main/binary-amd64/Packages.xz\n"
        )


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def archive(tmp_path: Path) -> Iterator[_Archive]:
    served = _Archive(tmp_path / "www")
    yield served
    served.server.shutdown()


@needs_dpkg
def test_pinned_files_are_downloaded_verified_and_cached(tmp_path: Path, archive: _Archive) -> None:
    deb = _make_deb(tmp_path, "hello", "1.0")
    pin = _pin_of(deb, "hello", "1.0")
    archive.publish([(deb, pin)])
    pins = _pins(pin, mirror=archive.url)
    found = debfetch.fetch_debs(pins, tmp_path / "cache", lambda _: None)
    assert found[pin].read_bytes() == deb.read_bytes()
    assert found[pin].name == f"{pin.sha256}.deb"
    shutil.rmtree(tmp_path / "www" / "debian")  # the cache alone suffices now: no network needed
    assert debfetch.fetch_debs(pins, tmp_path / "cache", lambda _: None) == found


@needs_dpkg
def test_a_moved_archive_stops_the_build_naming_each_package_and_the_repin_command(
    tmp_path: Path, archive: _Archive
) -> None:
    old_a, new_a = _make_deb(tmp_path, "alpha", "1.0"), _make_deb(tmp_path, "alpha", "1.1")
    beta = _make_deb(tmp_path, "beta", "2.0")
    gone = _make_deb(tmp_path, "gamma", "3.0")
    pins = _pins(
        _pin_of(old_a, "alpha", "1.0"),
        _pin_of(beta, "beta", "2.0"),
        _pin_of(gone, "gamma", "3.0"),
        mirror=archive.url,
    )
    # The point release: alpha 1.0 replaced by 1.1, gamma dropped, beta unchanged.
    archive.publish([(new_a, _pin_of(new_a, "alpha", "1.1")), (beta, _pin_of(beta, "beta", "2.0"))])
    with pytest.raises(ArchiveMovedError) as info:
        debfetch.fetch_debs(pins, tmp_path / "cache", lambda _: None)
    assert info.value.problems == (
        "alpha: pinned 1.0, the archive now serves 1.1",
        "gamma: pinned 3.0, the archive no longer serves gamma",
    )
    assert "servimg base <base> --repin" in info.value.hint
    assert "2 pinned package(s)" in info.value.message
    # Nothing half-done: only the verified file that was still served is in the cache.
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [
        f"{_pin_of(beta, 'beta', '2.0').sha256}.deb"
    ]


@needs_dpkg
def test_a_file_with_other_bytes_under_the_pinned_name_is_refused(tmp_path: Path, archive: _Archive) -> None:
    deb = _make_deb(tmp_path, "hello", "1.0")
    pin = _pin_of(deb, "hello", "1.0")
    archive.publish([(deb, pin)])
    (tmp_path / "www/debian" / pin.filename).write_bytes(b"tampered")
    with pytest.raises(DebianError) as info:
        debfetch.fetch_debs(_pins(pin, mirror=archive.url), tmp_path / "cache", lambda _: None)
    assert "hello=1.0" in str(info.value)
    assert not list((tmp_path / "cache").glob("*.deb"))


def test_an_unreachable_archive_is_reported_as_such(tmp_path: Path) -> None:
    pin = DebPin("hello", "1.0", "all", "required", 3, SHA, "pool/main/hello.deb")
    with pytest.raises(DebianError) as info:
        debfetch.fetch_debs(_pins(pin), tmp_path / "cache", lambda _: None)
    assert not isinstance(info.value, ArchiveMovedError)
    assert "unreachable" in info.value.message and "network" in info.value.hint


@needs_dpkg
def test_the_local_mirror_holds_exactly_the_pins_with_the_archive_priority(tmp_path: Path) -> None:
    deb = _make_deb(tmp_path, "hello", "1.0", priority="optional")
    pin = _pin_of(deb, "hello", "1.0", priority="required")
    pins = _pins(pin)
    with debian.local_mirror(pins, {pin: deb}) as source:
        assert source.startswith("deb [trusted=yes] file:///tmp/servimg-debian-mirror-")
        root = Path(source.split()[2].removeprefix("file://"))
        packages = (root / "dists/bookworm/main/binary-amd64/Packages").read_text()
        stanza = next(debfetch.parse_stanzas(packages))
        assert stanza["Package"] == "hello" and stanza["Priority"] == "required"
        assert stanza["SHA256"] == pin.sha256 and int(stanza["Size"]) == pin.size
        assert (root / stanza["Filename"]).read_bytes() == deb.read_bytes()
        assert "Codename: bookworm" in (root / "dists/bookworm/Release").read_text()
    assert not root.exists(), "the mirror is removed afterwards"


# ------------------------------------------------------------------------------------ neutralise


def test_installed_set_must_equal_the_pins(tmp_path: Path) -> None:
    (tmp_path / "var/lib/dpkg").mkdir(parents=True)
    (tmp_path / "var/lib/dpkg/status").write_text(
        "Package: a\nStatus: install ok installed\nArchitecture: amd64\nVersion: 1\n\n"
        "Package: extra\nStatus: install ok installed\nArchitecture: all\nVersion: 9\n\n"
        "Package: gone\nStatus: deinstall ok config-files\nArchitecture: all\nVersion: 1\n"
    )
    pins = _pins(
        DebPin("a", "1", "amd64", "required", 1, SHA, "pool/a.deb"),
        DebPin("b", "1", "amd64", "required", 1, SHA, "pool/b.deb"),
    )
    with pytest.raises(DebianError) as info:
        debian.check_installed(pins, tmp_path)
    assert info.value.problems == (
        "extra:all=9 installed but not pinned",
        "b:amd64=1 pinned but not installed",
    )


def test_neutralise_fixes_host_and_clock_dependent_files(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("chown to root needs root")
    etc = tmp_path / "etc"
    (etc / "apt").mkdir(parents=True)
    (etc / "apt/sources.list").write_text(
        "deb [trusted=yes] file:///tmp/servimg-debian-mirror-x bookworm main\n"
    )
    (etc / "hostname").write_text("buildhost-42\n")
    (etc / "resolv.conf").write_text("nameserver 10.0.0.1\n")
    (etc / "machine-id").write_text("0123456789abcdef\n")
    (etc / "shadow").write_text("root:*:20788:0:99999:7:::\nnobody:*::0:99999:7:::\n")
    (etc / "shadow").chmod(0o640)
    (tmp_path / "var/log").mkdir(parents=True)
    (tmp_path / "var/log/dpkg.log").write_text("2026-12-01 install\n")
    (tmp_path / "old").write_text("from a package")
    os.utime(tmp_path / "old", (1000, 1000))
    epoch = 1767225600

    debian.neutralise(tmp_path, _pins(), epoch)

    assert (etc / "apt/sources.list").read_text() == "deb http://127.0.0.1:9/debian bookworm main\n"
    assert (etc / "hostname").read_text() == "localhost\n" and (etc / "resolv.conf").read_text() == ""
    assert (etc / "machine-id").read_text() == ""
    assert (etc / "shadow").read_text() == "root:*:20454:0:99999:7:::\nnobody:*::0:99999:7:::\n"
    assert (etc / "shadow").stat().st_mode & 0o777 == 0o640
    assert not (tmp_path / "var/log/dpkg.log").exists()
    assert os.lstat(tmp_path / "old").st_mtime == 1000, "older package times are kept"
    assert all(st.st_mtime <= epoch for _, st in debian.walk(tmp_path)), "newer ones are clamped"


def test_faketime_clock_stages_its_library_inside_the_chroot_and_removes_it(tmp_path: Path) -> None:
    clock = debian.FaketimeClock("+3d")
    if clock.library() is None or not Path(clock.path).is_file():
        pytest.skip("needs Debian's faketime")
    (tmp_path / "tmp").mkdir()
    with debian.chroot_clock(tmp_path, clock) as env:
        staged = tmp_path / env["LD_PRELOAD"].lstrip("/")
        assert staged.is_file() and env["FAKETIME"] == "+3d" and env["NO_FAKE_STAT"] == "1"
    assert list((tmp_path / "tmp").iterdir()) == []
    with debian.chroot_clock(tmp_path, debian.SystemClock()) as env:
        assert env == {}
