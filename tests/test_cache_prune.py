"""`servimg cache status|prune` and SERVIMG_CACHE_MAX_SIZE (servimg.cache.layout, cachestate, cachehold):
sizes per section with hard links counted once, least recently used first, a base layout and its blobs
as one, nothing outside the sections touched, and never an entry a running command holds: a real build
frozen mid-way (tests/fakebase.py's FAKEBASE_STALL) keeps its cache whole until it ends.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fakebase as fb
from servimg.cache import hold as cachehold
from servimg.cache import layout as cachelayout
from servimg.cache import state as cachestate
from servimg.core.digest import Digest

DAY = 86400.0


def _env(**extra: str) -> dict[str, str]:
    return fb.cli_env(**extra)


def _popen(*args: str, **env: str) -> subprocess.Popen[str]:
    return fb.cli_popen(*args, **env)


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return fb.cli_run(*args, **env)


def _last_json(text: str) -> dict[str, object]:
    result: dict[str, object] = json.loads(text.strip().splitlines()[-1])
    return result


def _put(path: Path, size: int, age_days: float) -> Path:
    """A file of `size` bytes last used `age_days` ago."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    stamp = time.time() - age_days * DAY
    os.utime(path, (stamp, stamp))
    return path


def _age(path: Path, age_days: float) -> None:
    stamp = time.time() - age_days * DAY
    for p in [path, *path.rglob("*")] if path.is_dir() else [path]:
        os.utime(p, (stamp, stamp), follow_symlinks=False)


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    """A cache with an entry in most sections, each of a known size and age; a base layout whose blob
    is a hard link to blobs/ (as the cache's own base layouts are); a file no section names."""
    root = tmp_path / "cache"
    blob = _put(root / "blobs/sha256" / ("a" * 64), 4000, 30)
    _put(root / "blobs/sha256" / ("b" * 64), 3000, 1)
    layout = root / "demo-base" / ("c" * 64)
    (layout / "blobs/sha256").mkdir(parents=True)
    os.link(blob, layout / "blobs/sha256" / ("a" * 64))
    (layout / "index.json").write_text("{}")
    _age(layout, 2)
    _put(root / "results/build/v1/sha256/k1.json", 500, 10)
    _put(root / "wheels/old-1.0-py3-none-any.whl", 2000, 20)
    _put(root / "debs" / ("d" * 64 + ".deb"), 1000, 5)
    rootfs = root / "rootfs/2" / ("e" * 64)
    _put(rootfs / "usr/lib/x.so", 1500, 3)
    (rootfs / "usr").chmod(0o555)  # a warm root keeps the base's modes
    _age(rootfs, 3)
    _put(root / "README-of-the-user.txt", 10, 100)
    return root


def test_sizes_are_in_binary_units_and_bad_sizes_say_what_is_accepted() -> None:
    assert cachelayout.parse_size("20G") == 20 << 30
    assert cachelayout.parse_size("20GiB") == cachelayout.parse_size("20gb") == 20 << 30
    assert cachelayout.parse_size("512M") == 512 << 20
    assert cachelayout.parse_size("1.5K") == 1536
    assert cachelayout.parse_size("1048576") == 1 << 20
    assert cachelayout.parse_size("0") == 0
    for bad in ("", "twenty", "12Q", "G"):
        with pytest.raises(ValueError, match="K, M, G or T"):
            cachelayout.parse_size(bad)
    with pytest.raises(ValueError, match="negative"):
        cachelayout.parse_size("-1G")
    assert cachelayout.format_size(20 << 30) == "20.0 GiB" and cachelayout.format_size(12) == "12 B"


def test_status_counts_each_section_and_a_hard_linked_blob_once(cache: Path) -> None:
    usage = cachestate.usage(cache)
    by = {s.name: s for s in usage.sections}
    assert (by["blobs"].entries, by["blobs"].size) == (2, 7000)
    assert (by["bases"].entries, by["bases"].size) == (1, 2), "its blob is blobs/'s inode: counted there"
    assert (by["rootfs"].size, by["results"].size, by["wheels"].size, by["debs"].size) == (
        1500,
        500,
        2000,
        1000,
    )
    assert usage.size == 7000 + 2 + 1500 + 500 + 2000 + 1000
    assert [s.name for s in usage.sections] == [s.name for s in cachelayout.SECTIONS]


def test_status_command_lists_sections_and_json(cache: Path) -> None:
    proc = _cli("cache", "status", "--cache", str(cache))
    assert proc.returncode == 0, proc.stderr
    assert "blobs" in proc.stdout and "rootfs" in proc.stdout and "OK: cache" in proc.stdout
    doc = _last_json(_cli("cache", "status", "--cache", str(cache), "--json").stdout)
    assert doc["size_bytes"] == 12002 and doc["held_by"] == []
    assert doc["max_size_bytes"] == cachelayout.DEFAULT_MAX_SIZE, "bounded by default (README, Cache)"
    unbounded = _cli("cache", "status", "--cache", str(cache), "--json", SERVIMG_CACHE_MAX_SIZE="none")
    assert _last_json(unbounded.stdout)["max_size_bytes"] is None
    capped = _last_json(
        _cli("cache", "status", "--cache", str(cache), "--json", SERVIMG_CACHE_MAX_SIZE="1M").stdout
    )
    assert capped["max_size_bytes"] == 1 << 20


def test_prune_removes_least_recently_used_first_and_a_base_with_its_blobs(cache: Path) -> None:
    # 12002 bytes; to fit 6000 the oldest go first: the 30-day blob is a hard link of the base layout
    # (used 2 days ago), so it only frees when the layout goes with it, as one group used 2 days ago.
    with cachehold.exclusive(cache):
        pruned = cachestate.prune(cache, 6000)
    gone = {e.path.relative_to(cache).parts[0] for e in pruned.removed}
    assert gone == {"wheels", "results", "debs", "rootfs", "blobs", "demo-base"}
    assert pruned.after <= 6000 and pruned.before == 12002
    assert (cache / "blobs/sha256" / ("b" * 64)).is_file(), "the most recently used blob stays"
    assert not (cache / "rootfs/2" / ("e" * 64)).exists(), "a read-only warm root is removed whole"
    assert (cache / "README-of-the-user.txt").is_file(), "nothing outside the sections is touched"
    assert not list((cache / "tmp").iterdir()), "no half-removed directory is left in tmp/"


def test_prune_to_a_size_it_already_fits_removes_nothing(cache: Path) -> None:
    with cachehold.exclusive(cache):
        assert cachestate.prune(cache, 1 << 30).removed == ()
    assert cachestate.usage(cache).size == 12002


def test_prune_command_dry_run_all_and_errors(cache: Path) -> None:
    dry = _cli("cache", "prune", "--cache", str(cache), "--all", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert len(_last_json(dry.stdout)["removed"]) == 7 and cachestate.usage(cache).size == 12002  # type: ignore[arg-type]
    within = _cli("cache", "prune", "--cache", str(cache), "--json")  # to the default bound: it fits
    assert within.returncode == 0 and _last_json(within.stdout)["removed"] == []
    missing = _cli("cache", "prune", "--cache", str(cache), SERVIMG_CACHE_MAX_SIZE="none")
    assert missing.returncode == 1 and "--max-size" in missing.stdout + missing.stderr
    both = _cli("cache", "prune", "--cache", str(cache), "--all", "--max-size", "1G")
    assert both.returncode == 1 and "contradict" in both.stdout + both.stderr
    bad_env = _cli("cache", "prune", "--cache", str(cache), SERVIMG_CACHE_MAX_SIZE="lots")
    assert bad_env.returncode == 1 and "SERVIMG_CACHE_MAX_SIZE" in bad_env.stdout + bad_env.stderr
    everything = _cli("cache", "prune", "--cache", str(cache), "--all", "--json")
    assert everything.returncode == 0 and _last_json(everything.stdout)["after_bytes"] == 0
    assert (cache / "README-of-the-user.txt").is_file()


def test_the_size_cap_prunes_after_a_command(cache: Path, tmp_path: Path) -> None:
    """SERVIMG_CACHE_MAX_SIZE: a command that used the cache prunes it to the cap when it ends."""
    proc = _cli(
        "key",
        "generate",
        "--out",
        str(tmp_path / "keys"),
        "--cache",
        str(cache),
        SERVIMG_CACHE_MAX_SIZE="6000",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert cachestate.usage(cache).size <= 6000
    assert (cache / "blobs/sha256" / ("b" * 64)).is_file()


def _holder(cache: Path, release: Path) -> subprocess.Popen[str]:
    """Another process holding the cache as a running command does, until `release` exists."""
    code = (
        "import sys, time, pathlib\n"
        "from servimg.cache import hold as cachehold\n"
        f"with cachehold.held(pathlib.Path({str(cache)!r})):\n"
        "    print('held', flush=True)\n"
        f"    while not pathlib.Path({str(release)!r}).exists(): time.sleep(0.02)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=_env())
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_prune_refuses_while_a_command_holds_the_cache_and_names_it(cache: Path, tmp_path: Path) -> None:
    release = tmp_path / "release"
    holder = _holder(cache, release)
    try:
        assert [h.pid for h in cachehold.holders(cache)] == [holder.pid]
        proc = _cli("cache", "prune", "--cache", str(cache), "--all")
        assert proc.returncode == 1
        assert f"pid {holder.pid}" in proc.stdout + proc.stderr and "--wait" in proc.stdout + proc.stderr
        assert cachestate.usage(cache).size == 12002, "nothing removed"
        status = _last_json(_cli("cache", "status", "--cache", str(cache), "--json").stdout)
        assert [h["pid"] for h in status["held_by"]] == [holder.pid]  # type: ignore[attr-defined]
    finally:
        release.touch()
        holder.wait(timeout=30)
    assert cachehold.holders(cache) == []


def test_a_dead_holders_name_is_stale_and_blocks_nothing(cache: Path) -> None:
    holds = cachelayout.CacheLayout(cache).holds
    holds.mkdir(parents=True, exist_ok=True)
    (holds / "999999-deadbeef").write_text("servimg build images/x.yaml")  # nobody flocks it
    assert cachehold.holders(cache) == [] and not (holds / "999999-deadbeef").exists()
    with cachehold.exclusive(cache):
        pass


def test_a_command_starting_during_a_prune_waits_for_it(cache: Path, tmp_path: Path) -> None:
    order = tmp_path / "order"
    with cachehold.exclusive(cache):
        waiter = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import pathlib\nfrom servimg.cache import hold as cachehold\n"
                f"with cachehold.held(pathlib.Path({str(cache)!r})):\n"
                f"    p = pathlib.Path({str(order)!r}); p.write_text(p.read_text() + 'command\\n')\n",
            ],
            env=_env(),
        )
        time.sleep(1.0)
        assert waiter.poll() is None, "it waits while the prune holds the cache"
        order.write_text("prune ended\n")
    assert waiter.wait(timeout=30) == 0
    assert order.read_text() == "prune ended\ncommand\n"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("prune-repo")
    layers = [
        fb.tar([fb.D("opt"), fb.F("opt/base.bin", os.urandom(4096) * 300)]),
        fb.tar(fb.package_members()),
    ]
    base = fb.make_base(root / "base", layers, gzip_layers=[True, False])
    definition = fb.make_repo(root / "repo", base, name="prunable")
    lock = _cli("lock", str(definition), "--cache", str(root / "lock-cache"), "--quiet")
    assert lock.returncode == 0, lock.stdout + lock.stderr
    return definition


def test_a_prune_never_removes_what_a_running_build_holds(repo: Path, tmp_path: Path) -> None:
    """A real build, frozen while it writes its overlay layer into the cache: `prune --all` refuses and
    names it; `prune --all --wait` waits for it; the build then ends as it would have, and so does the
    prune. Then the cache is empty, and a new build fills it again to the same digest."""
    cache, marker, resume = tmp_path / "cache", tmp_path / "stalled", tmp_path / "resume"
    reference = _cli(
        "build",
        str(repo),
        "--to",
        f"oci:{tmp_path / 'ref'}",
        "--cache",
        str(tmp_path / "ref-cache"),
        "--json",
    )
    assert reference.returncode == 0, reference.stdout + reference.stderr
    digest = _last_json(reference.stdout)["digest"]

    build = _popen(
        "build", str(repo), "--to", f"oci:{tmp_path / 'out'}", "--cache", str(cache), "--json",
        FAKEBASE_STALL="layer", FAKEBASE_MARKER=str(marker),
        FAKEBASE_RESUME=str(resume),
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert build.poll() is None, build.communicate()
        assert time.monotonic() < deadline, "the build never reached the stall point"
        time.sleep(0.02)
    before = sorted(str(p.relative_to(cache)) for p in cache.rglob("*") if p.is_file())
    assert any(p.startswith("blobs/") for p in before), "the build has put its base into the cache"

    refused = _cli("cache", "prune", "--cache", str(cache), "--all")
    assert refused.returncode == 1 and f"pid {build.pid}" in refused.stdout + refused.stderr
    waiting = _popen("cache", "prune", "--cache", str(cache), "--all", "--wait", "120", "--json")
    time.sleep(0.5)
    assert waiting.poll() is None, "the prune waits for the build"
    after = sorted(str(p.relative_to(cache)) for p in cache.rglob("*") if p.is_file())
    assert set(before) <= set(after), "nothing the build wrote was removed while it ran"

    resume.touch()
    out, err = build.communicate(timeout=120)
    assert build.returncode == 0, out + err
    assert _last_json(out)["digest"] == digest
    pruned_out, pruned_err = waiting.communicate(timeout=120)
    assert waiting.returncode == 0, pruned_out + pruned_err
    assert _last_json(pruned_out)["after_bytes"] == 0
    assert fb.cache_is_sound(cache) == [] and cachestate.usage(cache).size == 0

    again = _cli("build", str(repo), "--to", f"oci:{tmp_path / 'again'}", "--cache", str(cache), "--json")
    assert again.returncode == 0 and _last_json(again.stdout)["digest"] == digest, again.stdout + again.stderr


def test_only_the_cache_layout_names_where_a_section_lies() -> None:
    """Every path into the cache comes from cache.layout (`BlobStore.layout`): a module that spells
    `store.root / "…"` defines the cache's layout on its own, which `servimg cache prune` would not know."""
    spelled = re.compile(r"\b(store\.root|cache_root)\s*/\s*[\"']")
    src = Path(cachelayout.__file__).resolve().parents[1]
    offenders = [
        f"{path.relative_to(src)}:{number}"
        for path in sorted(src.rglob("*.py"))
        if path.name != "cachelayout.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if spelled.search(line)
    ]
    assert offenders == []


def test_status_says_what_each_base_costs(tmp_path: Path) -> None:
    """A base is an image whose layer chain has a warm root: its cost is its layers plus that root."""
    from servimg.cache.bases import cached_bases
    from servimg.oci.fsindex import chain_key

    root = tmp_path / "cache"
    blobs = root / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def put(data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return digest

    layer = put(b"x" * 3000)
    diff_id = "sha256:" + "d" * 64
    config = put(
        json.dumps(
            {
                "config": {"Labels": {"org.opencontainers.image.title": "a base"}},
                "rootfs": {"diff_ids": [diff_id]},
            }
        ).encode()
    )
    manifest = put(
        json.dumps(
            {
                "config": {"digest": f"sha256:{config}"},
                "layers": [{"digest": f"sha256:{layer}", "size": 3000}],
            }
        ).encode()
    )
    warm = root / "rootfs" / "v1" / chain_key([Digest.parse(diff_id)]).hex
    (warm / "usr").mkdir(parents=True)
    (warm / "usr" / "f").write_bytes(b"y" * 5000)
    (base,) = cached_bases(root)
    assert (str(base.manifest), base.title, base.layers, base.warm_root) == (
        f"sha256:{manifest}",
        "a base",
        3000,
        5000,
    )
    shown = _cli("cache", "status", "--cache", str(root))
    assert "what each base costs" in shown.stdout and f"sha256:{manifest}  a base" in shown.stdout
