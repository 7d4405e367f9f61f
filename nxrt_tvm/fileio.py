"""Atomic file writes: readers see the old file or the new one, never a partial write.

One home for what the EPContext writer, the compile cache and the tuning state share: a temp
file beside the target with the mode `open()` would give, fsynced, then renamed into place.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import BinaryIO

__all__ = ["atomic_file", "atomic_write", "fsync_dir", "new_file_mode"]


def new_file_mode() -> int:
    """The mode `open()` gives a new file (0666 less the umask).

    `tempfile.mkstemp` creates 0600 files: renamed into place, a compiled model or
    tuning log would be unreadable by the service account that deploys it.
    Read from /proc, as `os.umask` can only be read by setting it (racy across threads).
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o644


def fsync_dir(path: Path) -> None:
    """Make a rename survive a power cut; best effort (not every platform opens directories)."""
    with suppress(OSError):
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextmanager
def atomic_file(
    path: Path,
    prefix: str | None = None,
    publish: Callable[[str], None] | None = None,
    mode: int | None = None,
) -> Iterator[BinaryIO]:
    """Write `path` through the yielded file; on success it is synced and renamed into place
    (`publish(tmp)` instead where the caller renames, e.g. under its lock); on failure no temp remains.
    `mode` replaces `open()`'s default (e.g. 0o600 for a private key)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=prefix or f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, new_file_mode() if mode is None else mode)
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        if publish is None:
            os.replace(tmp, path)
        else:
            publish(tmp)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write(path: Path, data: bytes, mode: int | None = None) -> None:
    with atomic_file(path, mode=mode) as f:
        f.write(data)
