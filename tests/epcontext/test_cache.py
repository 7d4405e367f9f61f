"""CompileCache on real files: round trips, corruption, temp files, keys, LRU, two processes."""

from __future__ import annotations

import hashlib
import logging
import multiprocessing
import os
import queue
import random
import re
import time
from pathlib import Path

import pytest

from nxrt_tvm.api.errors import EpError
from nxrt_tvm.epcontext.cache import CacheEntry, CacheError, CompileCache, cache_key
from nxrt_tvm.fileio import new_file_mode

LOGGER = "nxrt_tvm.epcontext.cache"


def key(name: str) -> str:
    return cache_key(name)


def entry_file(cache: CompileCache, k: str) -> Path:
    return Path(cache.directory) / "v1" / k[:2] / f"{k}.entry"


def temp_files(directory: Path) -> list[Path]:
    return sorted(directory.rglob(".tmp-*"))


@pytest.mark.parametrize("meta", [{}, {"partition": "p" * 37}, {"n": list(range(100))}])
def test_a_blob_starts_64_byte_aligned_in_its_entry_file(tmp_path, meta):
    """A hit maps a large blob's constants from the entry file, which TVM takes only 64-byte aligned."""
    cache = CompileCache(tmp_path / "c")
    k, blob = key("aligned"), os.urandom(3 << 20)
    cache.put(k, blob, meta)
    data = entry_file(cache, k).read_bytes()
    assert len(data) % 64 == len(blob) % 64 and data.endswith(blob)
    got = cache.get(k)
    assert got is not None and got.blob == blob and got.meta == meta


def test_put_get_round_trip(tmp_path):
    cache = CompileCache(tmp_path / "c")
    k, blob, meta = key("a"), os.urandom(10_000), {"target": "llvm", "nested": {"n": [1, 2.5, None]}}
    cache.put(k, blob, meta)
    got = cache.get(k)
    assert got == CacheEntry(k, blob, meta, hashlib.sha256(blob).hexdigest())
    assert k in cache and "blob=" not in repr(got)  # a 200 MB blob must stay out of reprs
    [info] = cache.entries()
    assert info.key == k and info.size == cache.total_bytes() > len(blob)
    assert abs(info.last_used - time.time()) < 60
    assert entry_file(cache, k).is_file() and temp_files(tmp_path) == []
    assert (
        entry_file(cache, k).stat().st_mode & 0o777 == new_file_mode()
    )  # a cache shared by a team stays readable


def test_second_instance_sees_entries_and_put_replaces(tmp_path):
    CompileCache(tmp_path).put(key("a"), b"one", {"v": 1})
    cache = CompileCache(tmp_path)
    assert cache.get(key("a")).blob == b"one"
    cache.put(key("a"), b"two!", {"v": 2})
    assert cache.get(key("a")) == CacheEntry(key("a"), b"two!", {"v": 2}, hashlib.sha256(b"two!").hexdigest())
    assert len(cache.entries()) == 1


def test_miss(tmp_path):
    cache = CompileCache(tmp_path)
    assert cache.get(key("absent")) is None
    assert key("absent") not in cache
    assert cache.entries() == [] and cache.total_bytes() == 0


def test_empty_blob_and_bytearray(tmp_path):
    cache = CompileCache(tmp_path)
    cache.put(key("e"), b"", {})
    cache.put(key("b"), bytearray(b"xyz"), {})
    assert cache.get(key("e")).blob == b"" and cache.get(key("b")).blob == b"xyz"


def _assert_corrupt_then_recovers(cache: CompileCache, k: str, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert cache.get(k) is None
    assert any("corrupt" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
    assert not entry_file(cache, k).exists() and k not in cache
    cache.put(k, b"rebuilt", {"again": True})
    assert cache.get(k) == CacheEntry(k, b"rebuilt", {"again": True}, hashlib.sha256(b"rebuilt").hexdigest())


def test_flipped_byte_is_warned_deleted_and_missed(tmp_path, caplog):
    cache = CompileCache(tmp_path)
    k = key("flip")
    cache.put(k, bytes(range(256)) * 40, {"m": 1})
    path = entry_file(cache, k)
    data = bytearray(path.read_bytes())
    data[-100] ^= 0x01
    path.write_bytes(data)
    # the header alone is read for the metadata (what a partition is judged by); `get` verifies the blob
    assert cache.meta(k) == {"m": 1} and cache.meta(key("absent")) is None
    _assert_corrupt_then_recovers(cache, k, caplog)


@pytest.mark.parametrize("damage", ["truncated", "header"])
def test_meta_misses_an_entry_whose_header_does_not_fit_the_file(tmp_path, caplog, damage):
    cache = CompileCache(tmp_path)
    k = key(damage)
    cache.put(k, b"payload" * 100, {"m": "x"})
    path = entry_file(cache, k)
    if damage == "truncated":
        os.truncate(path, path.stat().st_size - 10)
    else:
        data = bytearray(path.read_bytes())
        data[data.index(b'{"key"')] = ord("[")
        path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        assert cache.meta(k) is None
    assert "is corrupt" in caplog.text and not path.exists()


def test_truncated_blob(tmp_path, caplog):
    cache = CompileCache(tmp_path)
    k = key("trunc")
    cache.put(k, os.urandom(5000), {})
    path = entry_file(cache, k)
    os.truncate(path, path.stat().st_size - 1000)
    _assert_corrupt_then_recovers(cache, k, caplog)


@pytest.mark.parametrize("damage", ["garbage_header", "empty_file", "not_a_dict", "wrong_magic"])
def test_garbage_metadata(tmp_path, caplog, damage):
    cache = CompileCache(tmp_path)
    k = key(damage)
    cache.put(k, b"payload" * 100, {"m": "x" * 50})
    path = entry_file(cache, k)
    data = bytearray(path.read_bytes())
    start = data.index(b'{"key"')  # the header JSON follows magic and length
    if damage == "garbage_header":
        data[start : start + 20] = b"\xff}{not json at all!!"[:20]
    elif damage == "empty_file":
        data = bytearray()
    elif damage == "not_a_dict":
        data[start] = ord("[")
    else:
        data[0:4] = b"ELF\x7f"
    path.write_bytes(bytes(data))
    _assert_corrupt_then_recovers(cache, k, caplog)


def test_leftover_temp_file_is_never_read_and_is_cleaned(tmp_path):
    cache = CompileCache(tmp_path)
    k = key("victim")
    cache.put(k, b"complete entry", {})
    shard = entry_file(cache, k).parent
    # A killed writer leaves a full-looking temp file: it must not be served as the entry.
    stale = shard / ".tmp-killed"
    os.replace(entry_file(cache, k), stale)
    old = time.time() - 2 * 3600
    os.utime(stale, (old, old))
    fresh = shard / ".tmp-inflight"
    fresh.write_bytes(b"half an entry")
    assert cache.get(k) is None and k not in cache
    assert cache.entries() == [] and cache.total_bytes() == 0
    cache.put(key("other"), b"x", {})  # a later put sweeps stale temp files
    assert not stale.exists()
    assert fresh.exists()  # may belong to a live writer: left alone
    assert cache.get(k) is None


def test_clear(tmp_path):
    cache = CompileCache(tmp_path)
    for i in range(5):
        cache.put(key(str(i)), b"z" * 100, {"i": i})
    assert len(cache.entries()) == 5
    cache.clear()
    assert cache.entries() == [] and cache.total_bytes() == 0 and cache.get(key("0")) is None
    cache.put(key("0"), b"back", {})
    assert cache.get(key("0")).blob == b"back"


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "abc",
        "a" * 15,
        "a" * 129,
        "../../../../etc/passwd",
        "g" * 32,
        "ab" * 8 + "/x",
        "ab" * 8 + "\x00",
        " " + "ab" * 8,
        1234,
        None,
        b"ab" * 8,
    ],
)
def test_invalid_keys_are_rejected(tmp_path, bad):
    cache = CompileCache(tmp_path)
    with pytest.raises(ValueError, match="invalid cache key"):
        cache.get(bad)
    with pytest.raises(ValueError, match="invalid cache key"):
        cache.put(bad, b"x", {})
    assert bad not in cache
    assert list(tmp_path.rglob("*.entry")) == []


def test_key_case_is_normalised(tmp_path):
    cache = CompileCache(tmp_path)
    k = key("case")
    cache.put(k.upper(), b"x", {})
    assert cache.get(k).key == k and k.upper() in cache


def test_bad_blob_or_meta_rejected_without_writing(tmp_path):
    cache = CompileCache(tmp_path)
    with pytest.raises(ValueError, match="not JSON-serialisable"):
        cache.put(key("m"), b"x", {"obj": object()})
    with pytest.raises(TypeError):
        cache.put(key("m"), "a string", {})
    with pytest.raises(TypeError):
        cache.put(key("m"), b"x", [("not", "a dict")])
    assert cache.entries() == [] and temp_files(tmp_path) == []


def test_lru_eviction_keeps_recently_hit_entries(tmp_path):
    probe = CompileCache(tmp_path / "probe", max_bytes=None)
    probe.put(key("a"), b"\0" * 1000, {"i": 0})
    one = probe.total_bytes()
    cache = CompileCache(tmp_path / "c", max_bytes=3 * one + one // 2)  # room for three
    for name in "abc":
        cache.put(key(name), b"\0" * 1000, {"i": 0})
    assert cache.get(key("a")) is not None  # a is now the most recently used
    cache.put(key("d"), b"\0" * 1000, {"i": 0})  # evicts b, the least recently used
    assert {e.key for e in cache.entries()} == {key(n) for n in "acd"}
    assert cache.get(key("b")) is None
    cache.put(key("e"), b"\0" * 1000, {"i": 0})  # then c
    assert [e.key for e in cache.entries()] == [key(n) for n in "eda"]
    assert cache.total_bytes() <= cache.max_bytes


def test_oversized_entry_is_kept_alone(tmp_path):
    cache = CompileCache(tmp_path, max_bytes=500)
    cache.put(key("small"), b"s", {})
    cache.put(key("huge"), b"h" * 10_000, {})  # never evicts the entry just written
    assert [e.key for e in cache.entries()] == [key("huge")]
    assert cache.get(key("huge")).blob == b"h" * 10_000


def test_unbounded(tmp_path):
    cache = CompileCache(tmp_path, max_bytes=None)
    for i in range(20):
        cache.put(key(str(i)), b"u" * 1000, {})
    assert len(cache.entries()) == 20


def test_unusable_directories_raise_cache_error(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("not a directory")
    for bad in (afile, afile / "below"):
        with pytest.raises(CacheError, match="unusable"):
            CompileCache(bad)
    assert issubclass(CacheError, EpError)
    with pytest.raises(ValueError):
        CompileCache(tmp_path / "ok", max_bytes=-1)


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores permissions")
def test_read_only_directory_raises_cache_error(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(CacheError):
            CompileCache(ro / "cache")
    finally:
        ro.chmod(0o700)


def test_cache_key_is_unambiguous():
    assert cache_key("ab", "c") != cache_key("a", "bc")
    assert cache_key("abc") != cache_key("ab", "c") != cache_key("abc", "")
    assert cache_key("x", b"y") == cache_key("x", b"y")
    assert cache_key("x") != cache_key(b"x")  # type-tagged
    k = cache_key(b"graph", b"weights", "llvm", "0.27")
    assert re.fullmatch("[0-9a-f]{64}", k), k  # a sha256 hex digest
    with pytest.raises(TypeError):
        cache_key("a", 1)


# -- two processes -----------------------------------------------------------------------------

SHARED = [cache_key("shared", str(i)) for i in range(3)]
HOT = cache_key("hot")
OPS = 100
MAX_BYTES = 600_000  # small enough that eviction runs concurrently with reads and writes


def _check(entry: CacheEntry, k: str) -> None:
    assert entry.key == k and entry.blob.startswith(k.encode())
    assert entry.meta["sha"] == hashlib.sha256(entry.blob).hexdigest()


def _worker(directory: str, wid: int, barrier, done, results) -> None:
    """Phase 1: mixed puts and gets of shared and private keys. Phase 2: worker 1 rewrites
    one hot key while worker 2 reads it in a tight loop, which must never see it missing."""
    warnings: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            warnings.append(record.getMessage())

    logging.getLogger(LOGGER).addHandler(Collect(logging.WARNING))
    try:
        rng = random.Random(wid)
        cache = CompileCache(directory, max_bytes=MAX_BYTES)
        keys = SHARED + [cache_key("private", str(wid), str(i)) for i in range(2)]
        stats = {"hits": 0, "hot_reads": 0, "hot_misses_after_hit": 0}
        barrier.wait(timeout=60)
        for _ in range(OPS):
            k = rng.choice(keys)
            if rng.random() < 0.5:
                blob = k.encode() + bytes([wid]) * rng.randrange(1, 200_000)
                cache.put(k, blob, {"sha": hashlib.sha256(blob).hexdigest(), "writer": wid})
            elif (entry := cache.get(k)) is not None:
                stats["hits"] += 1
                _check(entry, k)
        barrier.wait(timeout=60)
        if wid == 1:
            for i in range(30):
                blob = HOT.encode() + bytes([i]) * rng.randrange(100_000, 300_000)
                cache.put(HOT, blob, {"sha": hashlib.sha256(blob).hexdigest(), "writer": wid})
            done.set()
        else:
            seen = False
            while not done.is_set():
                entry = cache.get(HOT)
                stats["hot_reads"] += 1
                if entry is None:
                    stats["hot_misses_after_hit"] += seen
                else:
                    seen = True
                    _check(entry, HOT)
        results.put((wid, None, warnings, stats))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        done.set()
        results.put((wid, repr(e), warnings, {}))


def test_two_processes_share_a_consistent_cache(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    barrier, done, results = ctx.Barrier(2), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(str(tmp_path), wid, barrier, done, results)) for wid in (1, 2)]
    for p in procs:
        p.start()
    try:
        reports = {wid: rest for wid, *rest in (results.get(timeout=60) for _ in procs)}
    except queue.Empty:
        pytest.fail(f"a worker did not report; exit codes {[p.exitcode for p in procs]}")
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    for wid, (error, warnings, stats) in reports.items():
        assert error is None, f"worker {wid}: {error}"
        assert warnings == [], f"worker {wid} saw corruption: {warnings}"
    hot = reports[2][2]
    assert hot["hot_reads"] > 30 and hot["hot_misses_after_hit"] == 0, hot  # replaces are atomic
    cache = CompileCache(tmp_path, max_bytes=MAX_BYTES)
    infos = cache.entries()
    assert infos[0].key == HOT and cache.total_bytes() <= MAX_BYTES
    for info in infos:
        entry = cache.get(info.key)
        assert entry is not None
        _check(entry, info.key)
    assert temp_files(tmp_path) == []
