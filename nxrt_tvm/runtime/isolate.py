"""Compile in a forked child process, so that TVM aborting or
crashing while compiling costs a decline, not the process.

TVM reports most failures as exceptions, but a bug in a pass, in LLVM code
generation or in a user pass can end in `abort()` or a segfault, and a model
is user input. The child is forked, not spawned: it inherits the imported TVM
and every user pass as they are (passes are not picklable), and costs a few
milliseconds. Threads do not survive a fork, so the child freezes what it
inherits for its garbage collector (objects whose threads stayed in the
parent must not be finalised there) and runs TVM's parallel loops inline
(the pool's workers stayed in the parent too). It compiles, exports the
library (which an EPContext or the compile cache needs anyway) and sends the
bytes back through a pipe; the parent loads them. A child that dies by a signal, or runs past the time
limit, becomes a `CompileFailed` that names the signal. Its temporary files go into a folder the parent
made and removes once it has reaped the child: a killed child runs no cleanup of its own.
"""

from __future__ import annotations

import ctypes
import faulthandler
import gc
import os
import pickle
import select
import shutil
import signal
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import TypeVar

from ..api.errors import CompileFailed, CompileInterrupted, InternalError
from ..lower.strict import raised_by_us, strict

__all__ = ["fork_available", "freeze_inherited", "run_isolated", "start_isolated", "Isolated"]

T = TypeVar("T")


def fork_available() -> bool:
    return hasattr(os, "fork")


def _prctl():
    """Linux's prctl, looked up once in the parent: a forked child must not dlopen (another thread of the
    parent may have held the loader's lock when it forked, and the child would wait on it forever)."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux
        return None


_PRCTL = _prctl()


def _die_with_parent(parent: int) -> None:
    """Linux: the kernel kills this child when its parent dies (a killed compile leaves no orphan builds)."""
    if _PRCTL is None:  # orphans finish their build and exit
        return
    _PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before the call
        os._exit(1)


def freeze_inherited() -> None:
    """The first call of a forked child that runs Python: what it inherited is never finalised there.

    Threads do not survive a fork, and an onnxruntime session left in a garbage cycle by the parent then
    waits forever in its destructor, on a condition variable its thread pool's threads were parked on,
    when the child's garbage collector frees it (a claims worker of `tools/support_profile.py` hung so).
    """
    gc.freeze()


def _child(fn: Callable[[], object], write_fd: int, parent: int, scratch: str) -> None:
    _die_with_parent(parent)
    freeze_inherited()
    tempfile.tempdir = scratch  # the parent removes it, however this child ends
    # TVM's thread pool came across too, without its worker threads: a parallel kernel run while compiling
    # (FoldConstant) would wait for them forever. With one thread, TVM runs parallel loops inline.
    os.environ["TVM_NUM_THREADS"] = "1"
    # a crash here is reported by the parent, as a decline; no traceback dump on stderr
    faulthandler.disable()
    try:
        try:
            payload = pickle.dumps(("ok", fn()), protocol=pickle.HIGHEST_PROTOCOL)
        except CompileFailed as exc:
            payload = pickle.dumps(("failed", str(exc)))
        except InternalError as exc:  # a bug of ours (strict mode): loud in the parent too
            payload = pickle.dumps(("internal", str(exc)))
        except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent as text
            # in strict mode an exception our own code raised (not TVM through it) is a bug: loud too
            text = f"{type(exc).__name__}: {exc}"
            if strict() and raised_by_us(exc):
                payload = pickle.dumps(("internal", f"nxrt-tvm bug: {text}"))
            else:
                payload = pickle.dumps(("failed", text))
        view = memoryview(payload)
        while view:
            view = view[os.write(write_fd, view) :]
    finally:
        os._exit(0)


def _read_all(read_fd: int, pid: int, deadline: float) -> bytes:
    chunks = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([read_fd], [], [], left)[0]:
            os.kill(pid, signal.SIGKILL)
            raise TimeoutError
        chunk = os.read(read_fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


class Isolated:
    """A forked child running `fn()` (`start_isolated`); `result` waits for it."""

    def __init__(self, fn: Callable[[], T], what: str):
        self.what = what
        self.done = False  #: its result was read (or it was killed) and it was reaped
        parent = os.getpid()
        self._scratch = tempfile.mkdtemp(prefix="nxrt-tvm-child-")
        self._read_fd, write_fd = os.pipe()
        with (
            warnings.catch_warnings()
        ):  # Python 3.12+ warns on fork in a threaded process; the child only compiles
            warnings.simplefilter("ignore", DeprecationWarning)
            self.pid = os.fork()
        if self.pid == 0:  # pragma: no cover - the child's coverage is not collected
            os.close(self._read_fd)
            _child(fn, write_fd, parent, self._scratch)
        os.close(write_fd)

    def kill(self) -> None:
        """Stop the child (a sibling failed: its result is not wanted) and reap it."""
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        os.close(self._read_fd)
        self._reaped()

    def result(self, timeout_s: float):
        """The child's (picklable) result; `CompileFailed` if it failed, crashed or ran past `timeout_s`."""
        try:
            return _result(self._read_fd, self.pid, self.what, timeout_s)
        finally:
            self._reaped()

    def _reaped(self) -> None:
        shutil.rmtree(self._scratch, ignore_errors=True)  # what the child left, killed or not
        self.done = True


def start_isolated(fn: Callable[[], T], what: str) -> Isolated:
    """`fn()` started in a forked child, to run while this process works on (see `Isolated.result`)."""
    return Isolated(fn, what)


def run_isolated(fn: Callable[[], T], what: str, timeout_s: float) -> T:
    """`fn()` run in a forked child; its (picklable) result,
    or `CompileFailed` if it failed, crashed or hung."""
    return start_isolated(fn, what).result(timeout_s)


def _result(read_fd: int, pid: int, what: str, timeout_s: float):
    try:
        data = _read_all(read_fd, pid, time.monotonic() + timeout_s)
    except TimeoutError:
        os.waitpid(pid, 0)
        raise CompileInterrupted(
            f"compiling {what} took longer than {timeout_s:.0f} s and was stopped"
        ) from None
    finally:
        os.close(read_fd)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        name = signal.Signals(os.WTERMSIG(status)).name
        # SIGKILL is the OOM killer or a user; SIGSEGV and friends are TVM's, on this partition
        raise (CompileInterrupted if name == "SIGKILL" else CompileFailed)(
            f"TVM crashed ({name}) while compiling {what}"
        )
    if not data:
        raise CompileInterrupted(
            f"the compiler process for {what} exited ({os.WEXITSTATUS(status)}) without a result"
        )
    kind, value = pickle.loads(data)
    if kind == "failed":
        raise CompileFailed(value)
    if kind == "internal":
        raise InternalError(value)
    return value
