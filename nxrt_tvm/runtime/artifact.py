"""Compiled modules as bytes: the blob inside an EPContext node, and back.

The blob is the shared library `export_library` writes (code, constants and
the Relax VM bytecode in one file). Loading one loads native code, so callers
check it first (see `epcontext.compat`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

import tvm
from tvm import relax

from ..api.errors import CompileInterrupted, EpLoadFailed
from ..lower.target import host_arch
from .elf import elf_problem

__all__ = ["export_executable", "load_executable"]


def export_executable(executable: relax.VMExecutable, objects: Sequence[str] = ()) -> bytes:
    """The shared library of a compiled partition, as bytes (links with the system C++ compiler); with
    the `objects` of its kernels built elsewhere (`runtime.codegen`)."""
    if shutil.which(os.environ.get("CXX", "g++")) is None:
        raise CompileInterrupted(
            "exporting a compiled partition needs a C++ compiler "
            "(g++) on PATH; install one (e.g. apt-get install g++)"
        )
    with tempfile.TemporaryDirectory(prefix="nxrt-tvm-export-") as tmp:
        path = Path(tmp) / "partition.so"
        executable.export_library(str(path), addons=list(objects))
        return path.read_bytes()


def _scratch_dir() -> str | None:
    """A memory-backed folder (tmpfs) for the file dlopen needs;
    writing a large blob to disk costs more than loading it."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None


#: every library this process loaded, by the sha256 of its bytes (see `load_executable`)
_LOADED: dict[str, tvm.runtime.Module] = {}
_LOADED_LOCK = threading.Lock()


def load_executable(blob: bytes, name: str, sha256: str | None = None) -> tvm.runtime.Module:
    """Load a blob made by `export_executable` (`sha256`: its digest, where the caller checked it).

    TVM never unloads a library (its functions stay registered), so a blob is loaded once per process:
    loading the same bytes again (a second session of a model) shares the first load's module, where a
    new load would map another copy of its code and weights for the process's life. Sessions share
    only the read-only module; each makes its own VM. Malformed ELF is refused before dlopen, which
    would crash on it (see `runtime.elf`).
    """
    digest = sha256 or hashlib.sha256(blob).hexdigest()
    with _LOADED_LOCK:
        module = _LOADED.get(digest)
        if module is None:
            module = _LOADED[digest] = _load(blob, name)
    return module


def _load(blob: bytes, name: str) -> tvm.runtime.Module:
    """dlopen `blob` from a temp file, unlinked once it is mapped."""
    problem = elf_problem(blob, host_arch())
    if problem is not None:
        raise EpLoadFailed(name, f"the compiled partition is not a loadable shared library: {problem}")
    fd, path = tempfile.mkstemp(prefix=f"nxrt-tvm-{name}-", suffix=".so", dir=_scratch_dir())
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        return tvm.runtime.load_module(path)
    except Exception as exc:
        raise EpLoadFailed(name, f"TVM could not load the compiled partition: {exc}") from exc
    finally:
        os.unlink(path)
