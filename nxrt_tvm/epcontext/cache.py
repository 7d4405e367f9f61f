"""A content-keyed, cross-process-safe on-disk cache of compiled partitions.

Why: compiling a partition with TVM takes 0.2-10 s; a second session on the same model should
load the library instead. The caller keys it on everything that shapes the output (see
`cache_key`); the cache only stores, verifies and evicts opaque blobs plus a small JSON dict.

Layout -- one file per entry, so a single `os.replace` publishes blob and metadata together
and no reader can ever pair a new blob with old metadata::

    <directory>/.lock                       filelock: writers and eviction serialise on it
    <directory>/v1/<key[:2]>/<key>.entry    MAGIC | u64 BE header length | header JSON | blob
    <directory>/v1/<key[:2]>/.tmp-*         in-flight writes; never read, removed after 1 h

The header JSON is {"key", "size", "sha256", "created", "meta"}, padded with blanks so that the
blob starts 64-byte aligned: a hit maps a large blob's constants from the file (`map_blob`). The
entry file's mtime is its last-used time: a hit touches it and eviction removes the oldest
first. Reads take no lock: they read (or map) everything through one open descriptor, so a
concurrent replace or delete yields the whole old entry, the whole new one, or a miss. A
corrupt entry is deleted (under the lock, only if it is still the same file) and reported as a
miss, so the caller rebuilds.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import struct
import time
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from ..api.errors import EpError
from ..fileio import atomic_file, fsync_dir
from ..runtime.artifact import Blob, map_blob

__all__ = ["CacheEntry", "CacheEntryInfo", "CacheError", "CompileCache", "cache_key"]

log = logging.getLogger(__name__)

_MAGIC = b"NXRTCACHE\x00v1\n"
_HLEN = struct.Struct(">Q")
_PREFIX = len(_MAGIC) + _HLEN.size
_KEY_RE = re.compile(r"[0-9a-fA-F]{16,128}")
_SUFFIX = ".entry"
_TMP_PREFIX = ".tmp-"
_STALE_TMP_S = 3600.0  # a temp file this old belongs to a writer that died
_LOCK_TIMEOUT_S = 120.0  # writers only hold the lock for a rename and a directory scan
#: where a blob starts in its file: its constants then lie aligned when mapped (`runtime.artifact.map_blob`)
_BLOB_ALIGN = 64


class CacheError(EpError):
    """The cache directory cannot be used (not a directory, not writable, lock unobtainable)."""


@dataclass(frozen=True)
class CacheEntry:
    """A verified hit: the blob's size and sha256 matched what `put` recorded."""

    key: str
    blob: Blob = field(repr=False)  # may be 200 MB, mapped from the entry file: kept out of reprs and logs
    meta: dict[str, Any]
    sha256: str = ""  #: the blob's, as checked


@dataclass(frozen=True)
class CacheEntryInfo:
    """One line of a `cache ls`: read from a stat, without opening the entry."""

    key: str
    size: int  # bytes on disk, header included: what counts against max_bytes
    last_used: float  # epoch seconds of the last put or hit


def cache_key(*parts: bytes | str) -> str:
    """Hash `parts` into a key; each part is type-tagged and length-prefixed, so that
    ("ab", "c") and ("a", "bc") differ and no choice of parts can collide with another."""
    h = hashlib.sha256(b"nxrt-tvm.cache_key.v1\0")
    for part in parts:
        if isinstance(part, str):
            tag, data = b"s", part.encode("utf-8")
        elif isinstance(part, (bytes, bytearray, memoryview)):
            tag, data = b"b", bytes(part)
        else:
            raise TypeError(f"cache_key parts must be bytes or str, got {type(part).__name__}")
        h.update(tag + _HLEN.pack(len(data)))
        h.update(data)
    return h.hexdigest()


def _check_key(key: object) -> str:
    """Keys become file names: only hex is allowed, so no key can escape the cache directory."""
    if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
        raise ValueError(
            f"invalid cache key {key!r}: expected a hex string of 16-128 characters (e.g. from cache_key())"
        )
    return key.lower()  # one spelling per key, also on case-insensitive file systems


class CompileCache:
    """Compiled partitions keyed by content, shared safely by concurrent processes."""

    def __init__(self, directory: str | os.PathLike, max_bytes: int | None = 2 * 1024**3):
        if max_bytes is not None and max_bytes < 0:
            raise ValueError(f"max_bytes must be None or >= 0, got {max_bytes}")
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self._root = self.directory / "v1"
        try:
            self._root.mkdir(parents=True, exist_ok=True)
        except OSError as e:  # a path component is a file, permission denied, read-only fs
            raise CacheError(f"cache directory {str(self.directory)!r} is unusable: {e}") from e
        if not os.access(self._root, os.W_OK | os.X_OK):
            raise CacheError(f"cache directory {str(self._root)!r} is not writable")
        self._lock = FileLock(str(self.directory / ".lock"), timeout=_LOCK_TIMEOUT_S)

    def _path(self, key: str) -> Path:
        return self._root / key[:2] / (key + _SUFFIX)

    def _locked(self, timeout: float = _LOCK_TIMEOUT_S) -> Any:
        """Take the directory lock; the returned proxy releases it at the end of a `with`."""
        try:
            return self._lock.acquire(timeout=timeout)
        except Timeout as e:
            raise CacheError(f"timed out after {timeout:.0f} s waiting for {self._lock.lock_file}") from e
        except OSError as e:
            raise CacheError(f"cannot lock cache directory {str(self.directory)!r}: {e}") from e

    def get(self, key: str) -> CacheEntry | None:
        """The verified entry for `key`, or None on a miss (absent, vanished, or corrupt)."""
        return self._read(key, _decode)

    def meta(self, key: str) -> dict[str, Any] | None:
        """The metadata stored under `key`, read without the blob (`get` reads and verifies that), or None
        on a miss: what a partition needs to be judged (a remembered failure or timing) before its blob,
        possibly hundreds of MB, is read and hashed."""
        return self._read(key, _decode_meta)

    def _read(self, key: str, decode: Any) -> Any:
        key = _check_key(key)
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                entry = decode(key, f, os.fstat(f.fileno()).st_size)
                if isinstance(entry, str):
                    log.warning("cache entry %s is corrupt (%s); deleting it", path, entry)
                    self._discard(path, os.fstat(f.fileno()))  # while open: the inode can't be reused
                    return None
        except FileNotFoundError:
            return None  # never written, or evicted/cleared concurrently
        except OSError as e:
            log.warning("cache entry %s is unreadable (%s); treating it as a miss", path, e)
            return None
        with suppress(OSError):  # gone or replaced since: the LRU hint is not worth an error
            os.utime(path, ns=(time.time_ns(),) * 2)  # fine-grained, unlike the kernel's coarse "now"
        return entry

    def _discard(self, path: Path, seen: os.stat_result) -> None:
        """Delete a corrupt entry, unless a writer has replaced it with a new file meanwhile."""
        with suppress(OSError, CacheError), self._locked(timeout=5.0):  # else a later get retries
            st = os.stat(path)
            if (st.st_ino, st.st_dev) == (seen.st_ino, seen.st_dev):
                os.unlink(path)

    def put(self, key: str, blob: bytes, meta: dict) -> None:
        """Store `blob` and `meta` under `key` atomically, then evict LRU entries over max_bytes."""
        key = _check_key(key)
        if not isinstance(blob, (bytes, bytearray, memoryview)):
            raise TypeError(f"blob must be bytes-like, got {type(blob).__name__}")
        if not isinstance(meta, dict):
            raise TypeError(f"meta must be a dict, got {type(meta).__name__}")
        view = memoryview(blob).cast("B")
        try:
            header = json.dumps(
                {
                    "key": key,
                    "size": view.nbytes,
                    "sha256": hashlib.sha256(view).hexdigest(),
                    "created": time.time(),
                    "meta": meta,
                },
                allow_nan=False,
            ).encode()
        except (TypeError, ValueError) as e:
            raise ValueError(f"meta for cache key {key} is not JSON-serialisable: {e}") from e
        header += b" " * (-(_PREFIX + len(header)) % _BLOB_ALIGN)  # JSON ends in blanks as well
        path = self._path(key)

        def publish(tmp: str) -> None:
            with self._locked():  # the slow part (writing) ran outside the lock
                os.replace(tmp, path)
                os.utime(path, ns=(time.time_ns(),) * 2)  # last used: now
                fsync_dir(path.parent)
                self._evict(keep=path)

        try:
            with atomic_file(path, prefix=_TMP_PREFIX, publish=publish) as f:
                f.write(_MAGIC + _HLEN.pack(len(header)) + header)
                f.write(view)
        except OSError as e:
            raise CacheError(f"cannot write cache entry {path}: {e}") from e

    def _scan(self, clean: bool) -> list[tuple[Path, os.stat_result]]:
        """All entries with their stats; with `clean` (lock held) remove stale temp files too."""
        found, now = [], time.time()
        for shard in os.scandir(self._root):
            if not shard.is_dir(follow_symlinks=False):
                continue
            for e in os.scandir(shard.path):
                try:
                    if e.name.startswith(_TMP_PREFIX) and clean and now - e.stat().st_mtime > _STALE_TMP_S:
                        os.unlink(e.path)  # its writer died: temp files are never read
                    elif e.name.endswith(_SUFFIX) and _KEY_RE.fullmatch(e.name[: -len(_SUFFIX)]):
                        found.append((Path(e.path), e.stat(follow_symlinks=False)))
                except FileNotFoundError:
                    continue
        return found

    def _evict(self, keep: Path) -> None:
        """Remove least-recently-used entries until the total fits; never `keep`. Lock held."""
        found = self._scan(clean=True)
        if self.max_bytes is None:
            return
        total = sum(st.st_size for _, st in found)
        for path, st in sorted(found, key=lambda item: item[1].st_mtime_ns):
            if total <= self.max_bytes:
                break
            if path != keep:
                with suppress(FileNotFoundError):
                    os.unlink(path)
                total -= st.st_size

    def __contains__(self, key: object) -> bool:
        """Whether an entry file exists; cheap, unverified: `get` may still report a miss."""
        try:
            return self._path(_check_key(key)).is_file()
        except ValueError:
            return False

    def entries(self) -> list[CacheEntryInfo]:
        """Every entry, most recently used first (for `cache ls`)."""
        infos = [
            CacheEntryInfo(p.name[: -len(_SUFFIX)], st.st_size, st.st_mtime) for p, st in self._scan(False)
        ]
        return sorted(infos, key=lambda i: i.last_used, reverse=True)

    def clear(self) -> None:
        """Remove every entry (and stale temp files); writes in flight are left to finish."""
        with self._locked():
            for path, _ in self._scan(clean=True):
                with suppress(FileNotFoundError):
                    os.unlink(path)

    def total_bytes(self) -> int:
        """Bytes on disk over all entries, headers included: the figure compared to max_bytes."""
        return sum(st.st_size for _, st in self._scan(False))


def _decode(key: str, f: Any, size: int) -> CacheEntry | str:
    """Parse and verify one entry file; a string says why it is corrupt."""
    header = _decode_header(key, f, size)
    if isinstance(header, str):
        return header
    blob = map_blob(f, f.tell(), header["size"])
    if len(blob) != header["size"] or hashlib.sha256(blob).hexdigest() != header["sha256"]:
        return "sha256 mismatch"
    return CacheEntry(key, blob, header["meta"], header["sha256"])


def _decode_meta(key: str, f: Any, size: int) -> dict[str, Any] | str:
    """One entry file's metadata, its header checked (not its blob); a string says why it is corrupt."""
    header = _decode_header(key, f, size)
    return header if isinstance(header, str) else header["meta"]


def _decode_header(key: str, f: Any, size: int) -> dict[str, Any] | str:
    """The header of an entry file read to its end, checked against the key and the file's size."""
    head = f.read(_PREFIX)
    if len(head) < _PREFIX or not head.startswith(_MAGIC):
        return "bad magic or truncated header"
    (hlen,) = _HLEN.unpack_from(head, len(_MAGIC))
    if _PREFIX + hlen > size:
        return f"header length {hlen} exceeds the file size {size}"
    try:
        header = json.loads(f.read(hlen))
        blob_size, digest, meta = header["size"], header["sha256"], header["meta"]
    except (ValueError, KeyError, TypeError) as e:
        return f"unreadable header: {e}"
    if (
        header.get("key") != key
        or not isinstance(meta, dict)
        or not isinstance(blob_size, int)
        or not isinstance(digest, str)
    ):
        return "header does not describe this key"
    if _PREFIX + hlen + blob_size != size:
        return f"size mismatch: header says {blob_size} blob bytes, file holds {size - _PREFIX - hlen}"
    return header
