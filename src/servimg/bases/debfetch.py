"""Every pinned `.deb` from the content-addressed cache or the archive, checked against its pin before
anything is installed; the archive's Packages indexes, to name what a point release moved (bases.debian).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import lzma
import os
import shutil
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

from servimg.bases.debpins import ArchiveMovedError, DebianError, DebianPins, DebPin
from servimg.core.context import Log
from servimg.core.digest import Digest, sha256_hex

_DOWNLOAD_WORKERS = 4


# ---------------------------------------------------------------------------------------------- fetch


def fetch_debs(pins: DebianPins, cache_dir: Path, log: Log) -> dict[DebPin, Path]:
    """Every pinned .deb from the content-addressed cache, downloading what is missing; each is verified.

    When some cannot be downloaded, the archive's current Packages index explains which moved, and the
    build stops before any work with the one command that re-pins.
    """
    cache_dir.mkdir(parents=True, exist_ok=True)
    missing = [p for p in pins.packages if not (cache_dir / p.cache_name).is_file()]
    if missing:
        log(f"debian: downloading {len(missing)} of {len(pins.packages)} pinned packages from {pins.mirror}")
        failed: list[tuple[DebPin, str]] = []
        with concurrent.futures.ThreadPoolExecutor(_DOWNLOAD_WORKERS) as pool:
            for pin, error in zip(
                missing, pool.map(lambda p: _download(pins.mirror, p, cache_dir), missing), strict=True
            ):
                if error:
                    failed.append((pin, error))
        if failed:
            raise _moved_error(pins, failed)
    found: dict[DebPin, Path] = {}
    for pin in pins.packages:
        path = cache_dir / pin.cache_name
        verify_deb(pin, path)
        found[pin] = path
    return found


def verify_deb(pin: DebPin, path: Path) -> None:
    """Raise unless `path` has the pinned size and sha256."""
    size = path.stat().st_size
    actual = Digest.of_file(str(path)).hex
    if size != pin.size or actual != pin.sha256:
        raise DebianError(
            f"{path}: {pin.name}={pin.version} has size {size} and sha256 {actual}, pinned {pin.size} "
            f"and {pin.sha256}",
            hint=f"delete {path} and build again; if it recurs, the mirror serves other bytes",
        )


def _download(mirror: str, pin: DebPin, cache_dir: Path) -> str:
    """Download one pinned file into the cache (temp name, verified, renamed); return an error or ""."""
    url = f"{mirror.rstrip('/')}/{pin.filename}"
    fd, tmp = tempfile.mkstemp(prefix=".download-", dir=cache_dir)
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=60) as response:
            shutil.copyfileobj(response, out, 1 << 20)
        verify_deb(pin, Path(tmp))
        os.replace(tmp, cache_dir / pin.cache_name)
        return ""
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        return str(getattr(exc, "reason", exc))
    except DebianError as exc:
        return exc.message
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _moved_error(pins: DebianPins, failed: Sequence[tuple[DebPin, str]]) -> DebianError:
    """Name each package whose pinned file is gone, with what the archive serves now (if it answers)."""
    try:
        served = archive_versions(pins.mirror, pins.suite, pins.arch)
    except DebianError as exc:
        return DebianError(
            f"{len(failed)} pinned Debian package(s) could not be downloaded from {pins.mirror}, and its "
            f"Packages index is unreachable too ({exc.message})",
            problems=[f"{pin.name}={pin.version}: {error}" for pin, error in failed],
            hint="check the network or proxy settings (the pins need the Debian archive once per machine)",
        )
    problems = []
    moved = 0
    for pin, error in failed:
        now = served.get((pin.name, pin.arch))
        if now is None:
            problems.append(f"{pin.name}: pinned {pin.version}, the archive no longer serves {pin.name}")
            moved += 1
        elif now[0] != pin.version or now[1] != pin.sha256:
            problems.append(f"{pin.name}: pinned {pin.version}, the archive now serves {now[0]}")
            moved += 1
        else:
            problems.append(f"{pin.name}={pin.version}: still served, but the download failed: {error}")
    if moved:
        return ArchiveMovedError(
            f"the Debian archive moved: {moved} pinned package(s) of {pins.suite} are gone "
            f"(release pinned: {pins.release}); nothing was built",
            problems=problems,
            hint="re-pin deliberately, then review the diff: servimg base <base> --repin",
        )
    return DebianError(
        f"{len(failed)} pinned Debian package(s) could not be downloaded from {pins.mirror}",
        problems=problems,
        hint="check the network or proxy settings and build again",
    )


def archive_versions(mirror: str, suite: str, arch: str) -> dict[tuple[str, str], tuple[str, str]]:
    """(package, arch) → (version, sha256) the archive's main/binary-<arch> Packages index serves now.

    Only explains a failed download; nothing is installed from this answer, so it is read over plain
    HTTP and its hash checked against the suite's Release file.
    """
    base = f"{mirror.rstrip('/')}/dists/{suite}"
    name = f"main/binary-{arch}/Packages.xz"
    release = _get(f"{base}/Release").decode("utf-8", "replace")
    expected = _release_sha256(release).get(name)
    data = _get(f"{base}/{name}")
    if expected is not None and sha256_hex(data) != expected:
        raise DebianError(f"{base}/{name} does not match the sha256 its Release file lists")
    served: dict[tuple[str, str], tuple[str, str]] = {}
    for stanza in parse_stanzas(lzma.decompress(data).decode("utf-8", "replace")):
        key = (stanza.get("Package", ""), stanza.get("Architecture", ""))
        served[key] = (stanza.get("Version", ""), stanza.get("SHA256", ""))
    return served


def _get(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            data: bytes = response.read()
            return data
    except (urllib.error.URLError, OSError) as exc:
        raise DebianError(f"{url}: {getattr(exc, 'reason', exc)}") from None


def _release_sha256(release: str) -> dict[str, str]:
    """The `SHA256:` section of a Release file: path → sha256."""
    found: dict[str, str] = {}
    in_section = False
    for line in release.splitlines():
        if not line.startswith(" "):
            in_section = line.strip() == "SHA256:"
            continue
        if in_section:
            parts = line.split()
            if len(parts) == 3:
                found[parts[2]] = parts[0]
    return found


def parse_stanzas(text: str) -> Iterator[dict[str, str]]:
    """RFC 822-style stanzas (Packages, status, control) as dicts; continuation lines are joined."""
    stanza: dict[str, str] = {}
    last = ""
    for line in text.splitlines():
        if not line.strip():
            if stanza:
                yield stanza
            stanza, last = {}, ""
        elif line[0] in " \t" and last:
            stanza[last] += "\n" + line
        else:
            key, _, value = line.partition(":")
            last = key
            stanza[key] = value.strip()
    if stanza:
        yield stanza
