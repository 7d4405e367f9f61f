"""cosh and sinh on CPU: TVM 0.27's LLVM backend has no lowering for ``tirx.cosh``/``tirx.sinh``
("unknown intrinsic" at codegen), so every ONNX Cosh/Sinh the TVM EP claimed failed its build and was
bisected to the fallback. Registered here for the ``llvm`` target, in exp:

- ``cosh(x) = (e^x + e^-x) / 2``, no cancellation;
- ``sinh(x) = (e^x - e^-x) / 2`` where ``|x| >= 0.1``, else its series ``x + x^3/6 + x^5/120`` (the
  difference of exps loses about 1e-7 absolute there: 1e-5 relative at 0.01, worse nearer 0; the
  series' first omitted term is 2e-10 relative at 0.1, less below).

Importing this module registers them (TVM has none to replace).
"""

from __future__ import annotations

from tvm import tirx

__all__ = ["SINH_SERIES_BELOW"]

#: |x| under which sinh is its Taylor series rather than a difference of exponentials
SINH_SERIES_BELOW = 0.1


def _cosh(call: tirx.Call) -> tirx.PrimExpr:
    x = call.args[0]
    return (tirx.exp(x) + tirx.exp(-x)) * tirx.const(0.5, str(call.ty.dtype))


def _sinh(call: tirx.Call) -> tirx.PrimExpr:
    x = call.args[0]
    dtype = str(call.ty.dtype)
    square = x * x
    series = x * (
        tirx.const(1.0, dtype) + square * (tirx.const(1 / 6, dtype) + square * tirx.const(1 / 120, dtype))
    )
    exps = (tirx.exp(x) - tirx.exp(-x)) * tirx.const(0.5, dtype)
    return tirx.Select(tirx.abs(x) < tirx.const(SINH_SERIES_BELOW, dtype), series, exps)


tirx.register_intrin_lowering("tirx.cosh", "llvm", f=_cosh, level=10)
tirx.register_intrin_lowering("tirx.sinh", "llvm", f=_sinh, level=10)
