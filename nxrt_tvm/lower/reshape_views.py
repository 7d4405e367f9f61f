"""A reshape left alone after fusion is a view, not a copy kernel.

TVM legalises ``reshape`` into a copy kernel and turns it back into a view (`RewriteDataflowReshape`)
only where its index analysis proves the copy is one, which fails on symbolic sizes such as a YOLO
head's ``(h - 1) // 32 * 4 + 4``: the kernel stayed opaque, unfused, and copied with four symbolic
divisions per element (1.9 ms of YOLOv8n's run). Reshaping a row-major tensor never moves data, so
the legalised kernel is marked (`legalize_reshape`) and, where fusion left it on its own, its call
becomes ``R.reshape`` (`ReshapeKernelsAsViews`); reshapes fused into other kernels stay index
arithmetic inside them.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax import PyExprMutator, expr_functor

from .strict import own_pass

__all__ = ["VIEW_ATTR", "legalize_reshape", "ReshapeKernelsAsViews"]

#: the PrimFunc attribute of a legalised reshape
VIEW_ATTR = "nxrt.reshape_view"


def legalize_reshape(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """TVM's own legalisation of ``relax.reshape``, its kernel marked with `VIEW_ATTR`."""
    legalized = tvm.ir.Op.get("relax.reshape").get_attr("FLegalize")(bb, call)
    if isinstance(legalized, relax.Call) and isinstance(legalized.args[0], tvm.ir.GlobalVar):
        gv = legalized.args[0]
        bb.update_func(gv, bb.get()[gv].with_attr(VIEW_ATTR, True))
    return legalized


def _one_tensor(fields) -> bool:
    """One tensor argument; the rest, if any, are the size values TVM passes with it."""
    tensors = [f for f in fields if isinstance(f.ty, relax.TensorType)]
    return len(tensors) == 1 and fields[0].same_as(tensors[0])


@expr_functor.mutator
class _AsViews(PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.call_tir"):
            return call
        gv, args = call.args[0], call.args[1]
        func = self.builder_.get()[gv] if isinstance(gv, tvm.ir.GlobalVar) else None
        shape = getattr(call.ty, "shape", None)
        if (
            not isinstance(func, tvm.tirx.PrimFunc)
            or func.attrs is None
            or VIEW_ATTR not in func.attrs
            or not _one_tensor(getattr(args, "fields", ()))
            or not isinstance(shape, relax.ShapeExpr)
        ):
            return call
        return relax.op.reshape(args.fields[0], shape)


@tvm.transform.module_pass(opt_level=0, name="nxrt_tvm.ReshapeKernelsAsViews")
@own_pass
def ReshapeKernelsAsViews(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """Every call of a marked reshape kernel as ``R.reshape``; the kernels then unused are removed."""
    mutator = _AsViews(mod)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gv, mutator.visit_expr(func))
    return relax.transform.DeadCodeElimination()(mutator.builder_.get())
