"""What a Relax module calls, for tests that check which ops or kernels a pass left."""

from __future__ import annotations

import tvm
from tvm import relax


def called(mod: tvm.IRModule) -> list[str]:
    """Each call in the module's Relax functions, in order: the kernel's name for a ``call_tir``, else
    the op's name."""
    names = []

    def visit(expr) -> None:
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
            names.append(expr.args[0].name_hint if expr.op.name == "relax.call_tir" else expr.op.name)

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return names


def matmul_dtypes(mod: tvm.IRModule) -> list[tuple[str, str, str]]:
    """(operand dtype, operand dtype, out dtype) of every Relax matmul in the module."""
    found = []

    def visit(expr) -> None:
        if isinstance(expr, relax.Call) and getattr(expr.op, "name", "") == "relax.matmul":
            a, b = (str(x.ty.dtype) for x in expr.args)
            found.append((a, b, str(expr.attrs.out_dtype)))

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return found
