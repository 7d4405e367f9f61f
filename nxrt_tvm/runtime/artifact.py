"""Compiled modules as bytes: the blob inside an EPContext node or a compile-cache entry, and back.

A blob is the shared library `export_library` writes (code, VM bytecode, small constants), packed with
the large constants the build lifted out of it (`lower.lift_constants`): a magic, an index (JSON), then
the library and each constant at 64-byte aligned offsets. A build with nothing lifted (CUDA, a model
without weights) is the library alone. The plugin (`plugin/pack.c`) reads the same layout. Loading a
blob loads native code, so callers check it first (see `epcontext.compat`); its index is checked here.
"""

from __future__ import annotations

import io
import json
import math
import mmap
import os
import shutil
import struct
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np
import tvm
from tvm import relax

from ..api.errors import CompileInterrupted, EpLoadFailed
from ..lower.lift_constants import LIFTABLE_DTYPES
from ..lower.target import host_arch
from .elf import elf_problem

__all__ = [
    "Blob",
    "Library",
    "blob_problem",
    "export_executable",
    "load_executable",
    "map_blob",
    "write_blob",
]

#: a blob in memory: bytes, or a view of a blob file mapped by `map_blob`
Blob = bytes | memoryview

PACKED_MAGIC = b"NXRTPKD\x01"  #: a packed blob's first bytes (a library alone starts b"\x7fELF")
_INDEX_SIZE = struct.Struct("<Q")
_ALIGN = 64


@dataclass(frozen=True)
class Library:
    """A compiled partition ready to run: its VM executable (built here, or loaded from a blob) and the
    constants lifted out of it, which every call of `main` passes after its inputs."""

    module: relax.VMExecutable | tvm.runtime.Module
    constants: tuple[tvm.runtime.Tensor, ...] = field(default=(), repr=False)

    @classmethod
    def of(
        cls, module: relax.VMExecutable | tvm.runtime.Module, constants: Sequence[np.ndarray]
    ) -> "Library":
        """`module` with its lifted `constants` as TVM tensors (`_tensor`)."""
        return cls(module, tuple(_tensor(c) for c in constants))

    def blob(self) -> bytes:
        """This library as a blob (an executable built with its kernels' code in it)."""
        return export_executable(self.module, constants=[np.from_dlpack(c) for c in self.constants])


def _tensor(array: np.ndarray) -> tvm.runtime.Tensor:
    """`array` as a TVM tensor over its own memory where TVM can take it (64-byte aligned as kernels
    assume, writable, contiguous: a mapped blob's constants are then never copied), else a copy."""
    flags = array.flags
    if array.nbytes and flags.writeable and flags.c_contiguous and array.ctypes.data % _ALIGN == 0:
        return tvm.runtime.from_dlpack(array)
    return tvm.runtime.tensor(array)


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def export_executable(
    executable: relax.VMExecutable, objects: Sequence[str] = (), constants: Sequence[np.ndarray] = ()
) -> bytes:
    """The blob of a compiled partition, in memory (`write_blob`)."""
    buffer = io.BytesIO()
    write_blob(buffer, executable, objects, constants)
    return buffer.getvalue()


def write_blob(
    file: BinaryIO,
    executable: relax.VMExecutable,
    objects: Sequence[str] = (),
    constants: Sequence[np.ndarray] = (),
) -> None:
    """Write the blob of a compiled partition to `file`: its shared library (linked by the system C++
    compiler, with the `objects` of its kernels built elsewhere: `runtime.codegen`), packed with its
    lifted `constants`, each written from where it lies (VGG-19's 548 MB are not gathered in memory)."""
    if shutil.which(os.environ.get("CXX", "g++")) is None:
        raise CompileInterrupted(
            "exporting a compiled partition needs a C++ compiler "
            "(g++) on PATH; install one (e.g. apt-get install g++)"
        )
    with tempfile.TemporaryDirectory(prefix="nxrt-tvm-export-") as tmp:
        path = Path(tmp) / "partition.so"
        executable.export_library(str(path), addons=list(objects))
        library = path.read_bytes()
    if constants:
        _write_packed(file, library, constants)
    else:
        file.write(library)


def _write_packed(file: BinaryIO, library: bytes, constants: Sequence[np.ndarray]) -> None:
    """The magic, the index's size and the index, then from the next aligned offset (the data's start)
    the library and each constant; the index gives offsets from the data's start."""
    arrays = [np.ascontiguousarray(c) for c in constants]
    entries, end = [], _aligned(len(library))
    for array in arrays:
        entries.append([end, array.dtype.name, list(array.shape)])
        end = _aligned(end + array.nbytes)
    index = json.dumps({"library": len(library), "constants": entries}).encode()
    head = PACKED_MAGIC + _INDEX_SIZE.pack(len(index)) + index
    file.write(head + bytes(_aligned(len(head)) - len(head)))
    parts = [(0, memoryview(library))]
    parts += [(entry[0], memoryview(a.reshape(-1).view(np.uint8))) for entry, a in zip(entries, arrays)]
    at = 0
    for offset, data in parts:
        file.write(bytes(offset - at))
        file.write(data)
        at = offset + data.nbytes
    file.write(bytes(end - at))


class _Malformed(ValueError):
    """A packed blob's index describes parts that are not there."""


def _head(view: memoryview) -> tuple[int, int, list[tuple[int, str, tuple[int, ...]]]] | None:
    """Where a packed blob's data starts, its library's size and its constants' entries, as its head says
    (None where the blob is not packed); a head that does not parse raises `_Malformed`."""
    at = len(PACKED_MAGIC) + _INDEX_SIZE.size
    if view[: len(PACKED_MAGIC)] != PACKED_MAGIC:
        return None
    if len(view) < at:
        raise _Malformed("its header is truncated")
    (size,) = _INDEX_SIZE.unpack_from(view, len(PACKED_MAGIC))
    if at + size > len(view):
        raise _Malformed("its index runs past its end")
    try:
        index = json.loads(bytes(view[at : at + size]))
        library_size = int(index["library"])
        entries = [(int(o), str(d), tuple(int(n) for n in shape)) for o, d, shape in index["constants"]]
    except (ValueError, TypeError, KeyError) as exc:
        raise _Malformed(f"its index is unreadable: {exc}") from None
    return _aligned(at + size), library_size, entries


def _unpack(blob: Blob) -> tuple[bytes, list[np.ndarray]]:
    """The library of a blob and its constants (views into the blob), its index checked first: a
    malformed one raises `_Malformed`, never reads past the blob's end."""
    view = memoryview(blob)
    head = _head(view)
    if head is None:
        return bytes(view), []
    start, library_size, entries = head
    data = view[start:]
    if not 0 < library_size <= len(data):
        raise _Malformed(f"its library of {library_size} bytes does not fit in it")
    arrays = []
    for offset, dtype, shape in entries:
        if dtype not in LIFTABLE_DTYPES or any(n < 0 for n in shape):
            raise _Malformed(f"a constant of type {dtype!r} and shape {shape}")
        count = math.prod(shape)
        if offset < library_size or offset + count * np.dtype(dtype).itemsize > len(data):
            raise _Malformed("a constant lies outside its data")
        arrays.append(np.frombuffer(data, dtype, count, offset).reshape(shape))
    return bytes(data[:library_size]), arrays


def _checked_parts(blob: Blob) -> tuple[bytes, list[np.ndarray]] | str:
    """The library and constants of `blob`, or what makes it unsafe to load on this host (an index
    describing parts that are not there, a library dlopen would crash on: see `runtime.elf`)."""
    try:
        library, constants = _unpack(blob)
    except _Malformed as exc:
        return f"its packed index is malformed: {exc}"
    problem = elf_problem(library, host_arch())
    return problem if problem is not None else (library, constants)


def blob_problem(blob: Blob) -> str | None:
    """What makes `blob` unsafe to load on this host, or None (`_checked_parts`)."""
    parts = _checked_parts(blob)
    return parts if isinstance(parts, str) else None


def _scratch_dir() -> str | None:
    """A memory-backed folder (tmpfs) for the file dlopen needs;
    writing a large blob to disk costs more than loading it."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None


#: every library this process loaded, by the sha256 of its bytes (see `load_executable`)
_LOADED: dict[str, Library] = {}
_LOADED_LOCK = threading.Lock()


def load_executable(blob: Blob, name: str, sha256: str | None = None) -> Library:
    """Load a blob made by `export_executable` (`sha256`: its digest, where the caller checked it).

    TVM never unloads a library (its functions stay registered), so a blob with a digest (an EPContext,
    a compile-cache hit) is loaded once per process: loading the same bytes again (a second session of a
    model) shares the first load's module and constants, where a new load would map another copy of its
    code and weights for the process's life. A blob without one (a build of this session) is loaded on its
    own, unhashed (VGG-19's 548 MB: 0.6 s). Sessions share only read-only state; each makes its own VM.
    Malformed ELF is refused before dlopen, which would crash on it (see `runtime.elf`).
    """
    if sha256 is None:
        return _load(blob, name)
    with _LOADED_LOCK:
        library = _LOADED.get(sha256)
        if library is None:
            library = _LOADED[sha256] = _load(blob, name)
    return library


def _load(blob: Blob, name: str) -> Library:
    """dlopen the blob's library from a temp file, unlinked once it is mapped; copy its constants out."""
    parts = _checked_parts(blob)
    if isinstance(parts, str):
        raise EpLoadFailed(name, f"the compiled partition is not a loadable shared library: {parts}")
    library, constants = parts
    fd, path = tempfile.mkstemp(prefix=f"nxrt-tvm-{name}-", suffix=".so", dir=_scratch_dir())
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(library)
        module = tvm.runtime.load_module(path)
    except Exception as exc:
        raise EpLoadFailed(name, f"TVM could not load the compiled partition: {exc}") from exc
    finally:
        os.unlink(path)
    return Library.of(module, constants)


#: blobs smaller than this are read whole: mapping them saves nothing
_MAP_MIN_BYTES = 1 << 20


def map_blob(file: BinaryIO, offset: int = 0, size: int | None = None) -> Blob:
    """The blob stored at `offset` of an open file (to its end, or `size` bytes), ready to check and load.

    Its head and library are read into memory, so the code that is checked is the code that loads, whatever
    the file does next; its constants stay mapped from the file, copy-on-write (never written back), so
    neither reading nor loading copies the weights (`Library.of` hands them to TVM as they lie). A blob that
    is not packed, or small, is read whole. The file must not be truncated while the blob is in use (a
    mapped page past its end faults): writers replace files whole (`fileio.atomic_file`).
    """
    fd = file.fileno()
    size = os.fstat(fd).st_size - offset if size is None else size
    private = _private_size(fd, offset, size)
    if private >= size or size < _MAP_MIN_BYTES:
        return _pread(fd, size, offset)
    mapped = mmap.mmap(fd, offset + size, access=mmap.ACCESS_COPY)
    view = memoryview(mapped)[offset : offset + size]
    head = _pread(fd, private, offset)
    if len(head) < private:  # the file shrank since it was measured: a short blob its checks refuse
        return head
    view[:private] = head  # these pages are private copies now, no longer the file's
    return view


def _pread(fd: int, size: int, offset: int) -> bytes:
    """Up to `size` bytes at `offset` (fewer only where the file ends first)."""
    chunks, done = [], 0
    while done < size:
        chunk = os.pread(fd, size - done, offset + done)
        if not chunk:
            break
        chunks.append(chunk)
        done += len(chunk)
    return b"".join(chunks)


def _private_size(fd: int, offset: int, size: int) -> int:
    """How many of the blob's first bytes hold its head and library (all of them where it is not packed,
    or its head does not parse: checks then refuse it from the copy read whole)."""
    at = len(PACKED_MAGIC) + _INDEX_SIZE.size
    head = _pread(fd, at, offset)
    if len(head) == at and head[: len(PACKED_MAGIC)] == PACKED_MAGIC:
        (index_size,) = _INDEX_SIZE.unpack_from(head, len(PACKED_MAGIC))
        if at + index_size <= size:
            try:
                start, library_size, _ = _head(memoryview(_pread(fd, at + index_size, offset)))
            except _Malformed:
                return size
            return min(size, start + max(library_size, 0))
    return size
