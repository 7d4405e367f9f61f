"""uint8 x int8 matmuls (``matmul(a, b, out_dtype="int32")``, MatMulInteger's import) for the target.

Kept as they are where the CPU has AVX-512 VNNI and the shapes fit its schedule
(`schedules.vnni`); elsewhere in float32 where every partial sum is exact (the float matmul rule, 4x
the throughput of int32 multiplies without VNNI), else with int32 operands.
"""

from __future__ import annotations

import tvm
from tvm import relax, tirx
from tvm.relax.dpl import is_op, rewrite_call, wildcard

from ..frontend import exact_in_float32
from .schedules.vnni import has_vnni, vnni_fits
from .strict import own_pass

__all__ = ["IntegerMatmul"]

#: the largest magnitudes of a uint8 and of an int8 value
_BOUNDS = (255, 128)


def _last_dim(x: relax.Expr) -> int | None:
    """A tensor's last dim where it is static."""
    shape = getattr(x.ty, "shape", None)
    dim = shape.values[-1] if isinstance(shape, relax.ShapeExpr) and shape.values else None
    return int(dim.value) if isinstance(dim, tirx.IntImm) else None


@relax.transform.function_pass(opt_level=0, name="nxrt_tvm.IntegerMatmul")
class IntegerMatmul:
    """See the module docstring."""

    def __init__(self, target: tvm.target.Target):
        self.vnni = has_vnni(target)
        self.pattern = is_op("relax.matmul")(wildcard(), wildcard())

    @own_pass
    def transform_function(self, func: relax.Function, _mod: tvm.IRModule, _ctx) -> relax.Function:
        return rewrite_call(self.pattern, self._rewrite, func)

    def _rewrite(self, call: relax.Call, _matches) -> relax.Expr:
        a, b = call.args
        dtypes = tuple(getattr(x.ty, "dtype", None) for x in (a, b))
        if str(call.attrs.out_dtype) != "int32" or dtypes != ("uint8", "int8"):
            return call
        depth = _last_dim(a)
        if self.vnni and vnni_fits(depth, _last_dim(b)):
            return call
        if exact_in_float32(depth, *_BOUNDS):
            a, b = (relax.op.astype(x, "float32") for x in (a, b))
            return relax.op.astype(relax.op.matmul(a, b, out_dtype="float32"), "int32")
        return relax.op.matmul(relax.op.astype(a, "int32"), relax.op.astype(b, "int32"), out_dtype="int32")
