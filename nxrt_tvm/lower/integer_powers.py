"""``pow(x, 2|3|4)`` as products, as onnxruntime's Pow computes a small integer exponent.

LLVM has no vector ``powf``: a vectorised kernel with ``pow`` calls the scalar library function once per
lane. GPT-2's tanh GELU (``0.5 x (1 + tanh(c (x + 0.044715 x^3)))``) ran 450 us per call on a
[128, 512] map, 40x the rest of its elementwise chain. Products are exact where ``pow`` is within its
ulp, and agree with it on signs, zeros, infinities and NaN for these exponents.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx

from .strict import own_pass

__all__ = ["IntegerPowers"]

_EXPONENTS = (2, 3, 4)


def _product(call: tvm.ir.Call):
    if call.op.name != "tirx.pow":
        return call
    base, exponent = call.args
    if not isinstance(exponent, (tirx.FloatImm, tirx.IntImm)) or exponent.value not in _EXPONENTS:
        return call
    if int(exponent.value) == 4:
        square = base * base
        return square * square
    product = base
    for _ in range(int(exponent.value) - 1):
        product = product * base
    return product


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="nxrt_tvm.IntegerPowers")
@own_pass
def IntegerPowers(func: tirx.PrimFunc, _mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tirx.PrimFunc:
    """Rewrite every ``pow`` by a constant 2, 3 or 4 into multiplications."""
    return func.with_body(tvm_ffi.structural_map(func.body, (tvm.ir.Call, _product)))
