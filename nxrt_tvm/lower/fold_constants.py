"""Constant kernels evaluated at compile time, built together: TVM's `FoldConstant` in bulk.

After legalisation every computation on weights alone (a conv weight transposed to NHWC, a bias
reshaped, a BatchNorm scale, a weight packed for a schedule's layout) is a `call_tir` on constants.
TVM's `FoldConstant` evaluates each by building its kernel with a full `tirx.build` of its own, LLVM
included: mobilenet_v2 built about 300 such one-kernel modules, 10 of its 17 s to a ready session.
This pass collects the constant calls of a whole module, builds their kernels as one module, runs
them, and repeats for calls whose arguments became constant (a transposed weight packed next). It
runs before each `FoldConstant`, which is left only what this pass did not take (tuple outputs,
shape values, a kernel the batch could not build), so the folded module is the same.
`FoldConstantLayouts` takes the commonest constant calls earlier: before legalisation, a transpose
or reshape of a weight is evaluated by numpy, with no kernel to build at all.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from .strict import own_pass

__all__ = ["fold_constant_calls", "with_bulk_folding", "FoldConstantLayouts"]

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")
#: where the kernels run: the host, as TVM's own `FoldConstant` builds them, but unoptimised: each runs
#: once, on weights, and LLVM's optimisation took most of the pass (mobilenet_v2: 1.19 -> 0.81 s)
_HOST = {"kind": "llvm", "opt-level": 0}


def _static_tensor(ty) -> tuple[list[int], str] | None:
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    if not all(isinstance(d, tvm.tirx.IntImm) for d in ty.shape.values):
        return None
    return [int(d) for d in ty.shape.values], str(ty.dtype.dtype)


def _constant_or_remapped(mutator: relax.PyExprMutator, var: relax.Var, remap) -> relax.Expr:
    """A use of a variable bound to a constant reads the constant (so a call sees its constant
    arguments); any other variable is remapped (`remap`: the mutator's own visit), as the mutator may
    have re-emitted it with a new type: returning the old one left it undefined ("Var lv7 is not
    defined", conv1d_audio)."""
    bound = mutator.lookup_binding(var)
    return bound if isinstance(bound, tvm.ir.GenericConst) else remap(var)


@relax.expr_functor.mutator
class _Folder(relax.PyExprMutator):
    """Replaces each `call_tir` of a kernel in `built` on constant arguments by its value (with no
    `built`, only notes the kernels such calls need in `wanted`); with `layouts`, each transpose or
    static reshape of a constant instead (`_evaluated_layout`)."""

    def __init__(
        self, mod: tvm.IRModule, built: tvm.runtime.Module | None = None, layouts: bool = False
    ) -> None:
        super().__init__(mod)
        self.context = mod
        self.built = built
        self.layouts = layouts
        self.wanted: dict[tvm.ir.GlobalVar, tvm.tirx.PrimFunc] = {}
        self.folded = 0

    def visit_var_(self, var: relax.Var) -> relax.Expr:
        return _constant_or_remapped(self, var, super().visit_var_)

    def visit_dataflow_var_(self, var: relax.DataflowVar) -> relax.Expr:
        return _constant_or_remapped(self, var, super().visit_dataflow_var_)

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if self.layouts:
            return _evaluated_layout(call)
        if call.op != _CALL_TIR or len(call.args) != 2 or len(call.ty_args) != 1:
            return call  # a call with shape-var arguments, or a tuple result: FoldConstant's to decide
        gv, args = call.args[0], call.args[1].fields
        func = self.context[gv] if isinstance(gv, tvm.ir.GlobalVar) else None
        out = _static_tensor(call.ty_args[0])
        if (
            not isinstance(func, tvm.tirx.PrimFunc)
            or out is None
            or not all(isinstance(a, tvm.ir.GenericConst) for a in args)
        ):
            return call
        if self.built is None:
            self.wanted[gv] = func
            return call
        result = tvm.runtime.empty(out[0], out[1], tvm.cpu())
        try:
            self.built[gv.name_hint](*(a.value for a in args), result)
        except Exception:  # noqa: BLE001 - TVM's error (a bounds guard failing): FoldConstant reports it
            return call
        self.folded += 1
        return relax.const(result)


def _fold_round(mod: tvm.IRModule) -> tvm.IRModule | None:
    """`mod` with one round of constant calls folded; None when there is none to fold, or their kernels
    do not build as one module (each is then left to `FoldConstant`, which skips what fails)."""
    functions = [(gv, f) for gv, f in mod.functions_items() if isinstance(f, relax.Function)]
    wanted: dict[tvm.ir.GlobalVar, tvm.tirx.PrimFunc] = {}
    for _, func in functions:
        finder = _Folder(mod)
        finder.visit_expr(func)
        wanted.update(finder.wanted)
    if not wanted:
        return None
    kernels = tvm.IRModule(
        {gv.name_hint: f.with_attr("global_symbol", gv.name_hint) for gv, f in wanted.items()}
    )
    try:
        built = tvm.tirx.build(kernels, target=_HOST)
    except Exception:  # noqa: BLE001 - TVM cannot build one of them (a GPU-bound kernel): left to FoldConstant
        return None
    folded, count = mod.clone(), 0
    for gv, func in functions:
        folder = _Folder(mod, built)
        folded[gv] = relax.analysis.remove_all_unused(folder.visit_expr(func))
        count += folder.folded
    return folded if count else None


def fold_constant_calls() -> tvm.transform.Pass:
    """Evaluate every `call_tir` on constants, all kernels of a round built at once (module doc)."""

    @tvm.transform.module_pass(opt_level=0, name="nxrt_tvm.FoldConstantCalls")
    @own_pass
    def fold(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        while (folded := _fold_round(mod)) is not None:
            mod = folded
        return mod

    return fold


def with_bulk_folding(passes: list[tvm.transform.Pass]) -> list[tvm.transform.Pass]:
    """`passes` with `fold_constant_calls()` before each of TVM's `FoldConstant` (a backend's list)."""
    out: list[tvm.transform.Pass] = []
    for p in passes:
        if p.info.name == "FoldConstant":
            out.append(fold_constant_calls())
        out.append(p)
    return out


def _evaluated_layout(call: relax.Call) -> relax.Expr:
    """A transpose or static reshape of a constant as its value, computed by numpy; any other call as is."""
    if not isinstance(call.op, tvm.ir.Op) or not isinstance(call.args[0], tvm.ir.GenericConst):
        return call
    # the call's dtype, not the array's: a 0-d int64 constant reads back as int32
    value, dtype = call.args[0].value.numpy(), str(call.ty.dtype)
    if call.op.name == "relax.permute_dims":
        axes = None if call.attrs.axes is None else [int(a) for a in call.attrs.axes]
        return relax.const(np.ascontiguousarray(np.transpose(value, axes)), dtype)
    if call.op.name == "relax.reshape" and isinstance(call.args[1], relax.ShapeExpr):
        shape = call.args[1].values
        if all(isinstance(d, tvm.tirx.IntImm) for d in shape):
            return relax.const(value.reshape([int(d) for d in shape]), dtype)
    return call


@tvm.transform.module_pass(opt_level=0, name="nxrt_tvm.FoldConstantLayouts")
@own_pass
def FoldConstantLayouts(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:  # noqa: N802 - a TVM pass
    """Transposes and reshapes of constant weights (the NHWC conversion puts one on every conv weight),
    evaluated by numpy before legalisation: as kernels, `fold_constant_calls` builds, looks up and runs
    each (densenet121: 44 of them, 0.7 s)."""
    folder = _Folder(mod, layouts=True)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            folder.builder_.update_func(gv, relax.analysis.remove_all_unused(folder.visit_expr(func)))
    return folder.builder_.get()
