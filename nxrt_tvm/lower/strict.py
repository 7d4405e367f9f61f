"""Our own bugs surface: an exception in nxrt-tvm's passes or schedule rules is a bug, not a decline.

Without this, a bug in one of our Relax passes became `CompileFailed`, which the claim loop bisects
into a decline ("TVM cannot compile it"), and a bug in a schedule rule silently left the kernel on
TVM's naive loops. Now each is logged as a warning naming the pass or rule and the kernel; in
strict mode (`NXRT_TVM_STRICT=1`, which the test suite sets) it raises `InternalError` instead.

A pass can also be wrong without raising: Relax it leaves ill-formed (a variable used where it is not
defined) fails later, in TVM's code generation, and was bisected into a decline all the same. So in
strict mode each of our passes' Relax output is checked for well-formedness too, and the pass is
blamed only where its input was well formed (the ONNX importer's output is not always).

A schedule rule may still give up on a function through TVM (a schedule primitive refusing it):
that is "does not fit", not a bug. An exception raised by our own code is one.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from tvm import IRModule, relax

from ..api.errors import InternalError

__all__ = ["STRICT_ENV", "strict", "raised_by_us", "own_failure", "own_pass", "take_failure"]

log = logging.getLogger(__name__)

STRICT_ENV = "NXRT_TVM_STRICT"
_PACKAGE = Path(__file__).resolve().parents[1]
_pending = threading.local()  #: a strict-mode failure on its way out through TVM's FFI (which drops its type)
F = TypeVar("F", bound=Callable)


def strict() -> bool:
    return os.environ.get(STRICT_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


def raised_by_us(exc: BaseException) -> bool:
    """Whether the innermost frame of `exc` is nxrt-tvm's code (not a TVM API it called)."""
    tb, last = exc.__traceback__, None
    while tb is not None:
        tb, last = tb.tb_next, tb
    return last is not None and Path(last.tb_frame.f_code.co_filename).resolve().is_relative_to(_PACKAGE)


def own_failure(what: str, exc: BaseException) -> None:
    """Report `exc`, raised inside `what` (our pass or rule): raise `InternalError` in strict mode."""
    text = (
        f"{what} raised {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    )
    if strict():
        error = InternalError(f"nxrt-tvm bug: {text}")
        _pending.error = error
        raise error from exc
    log.warning("nxrt-tvm bug (please report it with the model): %s", text)


def own_pass(fn: F) -> F:
    """Decorate one of our passes (its function or `transform_module`): any exception in it is our bug."""
    what = f"pass {fn.__module__.rpartition('.')[2]}.{fn.__qualname__.replace('.<locals>', '')}"

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            result = fn(*args, **kwargs)
        except InternalError:
            raise
        except Exception as exc:
            own_failure(what, exc)
            raise
        if strict():
            _check_well_formed(what, args, result)
        return result

    return wrapper  # type: ignore[return-value]


def _check_well_formed(what: str, args: tuple, result: object) -> None:
    """Raise `InternalError` where the pass made well-formed Relax ill-formed (strict mode)."""
    if not isinstance(result, IRModule | relax.Function) or relax.analysis.check_well_formed(result):
        return
    given = next((a for a in args if isinstance(a, type(result))), None)
    if given is None or not relax.analysis.check_well_formed(given):
        return  # it came in ill-formed: not this pass's doing
    try:
        relax.analysis.well_formed(result)
    except Exception as exc:  # noqa: BLE001 - TVM's error names the violation
        own_failure(f"{what} (its output is ill-formed Relax)", exc)


def take_failure() -> InternalError | None:
    """The strict-mode failure raised on this thread since the last call, if any (see `_pending`)."""
    error = getattr(_pending, "error", None)
    _pending.error = None
    return error
