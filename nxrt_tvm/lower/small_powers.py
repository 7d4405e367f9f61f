"""``pow(x, c)`` by a small constant as products and square roots, as onnxruntime's Pow computes 2 and 3.

LLVM has no vector ``powf``: a vectorised kernel with ``pow`` calls the scalar library function once per
lane. GPT-2's tanh GELU (``0.5 x (1 + tanh(c (x + 0.044715 x^3)))``) ran 450 us per call on a
[128, 512] map, 40x the rest of its elementwise chain; AlexNet's two local response normalisations
(``x / (k + a * sum(x^2))^0.75``) took 0.8 of its 6.8 ms in ``powf``.

2, 3 and 4 are products (exact where ``pow`` is within its ulp); 0.75 is ``sqrt(x) * sqrt(sqrt(x))`` and
1.5 is ``x * sqrt(x)`` (``sqrt`` is correctly rounded: within 2 ulp of ``pow``). Each agrees with ``pow``
on signs, zeros, infinities and NaN: a product of two factors of one sign is +0 at -0, as ``pow`` is, and
``pow(-inf, 0.75 | 1.5)`` is +inf where the square root of -inf is NaN, so -inf is selected apart.
Exponents whose root would give -0 at -0 (0.5, 0.25) stay ``pow``.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx

from .strict import own_pass

__all__ = ["SmallPowers"]


def _rewritten(base: tirx.PrimExpr, exponent: float, dtype: str) -> tirx.PrimExpr | None:
    """`base` to the power `exponent` without ``pow``, or None for another exponent."""
    if exponent == 4:
        square = base * base
        return square * square
    if exponent in (2, 3):
        return base * base if exponent == 2 else base * base * base
    if exponent not in (0.75, 1.5):
        return None
    root = tirx.sqrt(base)
    value = root * tirx.sqrt(root) if exponent == 0.75 else base * root
    infinity = tirx.const(float("inf"), dtype)
    return tirx.Select(base == -infinity, infinity, value)


def _product(call: tvm.ir.Call):
    if call.op.name != "tirx.pow":
        return call
    base, exponent = call.args
    if not isinstance(exponent, (tirx.FloatImm, tirx.IntImm)):
        return call
    value = _rewritten(base, float(exponent.value), str(call.ty))
    return call if value is None else value


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="nxrt_tvm.SmallPowers")
@own_pass
def SmallPowers(func: tirx.PrimFunc, _mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tirx.PrimFunc:
    """Rewrite every ``pow`` by a constant 2, 3, 4, 0.75 or 1.5 (see the module docstring)."""
    return func.with_body(tvm_ffi.structural_map(func.body, (tvm.ir.Call, _product)))
