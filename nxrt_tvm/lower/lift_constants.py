"""Large constants out of the compiled library: lifted to parameters of `main`, kept as arrays.

TVM serialises a VM executable's constants into its shared library: the export has LLVM pack them into
the object code, and loading the library copies them out again (a ResNet-18's 75 MB of weights: about
120 ms of every first load). Lifted at the very end of the pipeline, after the last constant folding and
the VM's own lowering (so no shape check per call is added for them), they travel beside the code in
the blob (`runtime.artifact`) and reach memory without TVM's serialiser; the kernel passes them after
its inputs at every call.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from .strict import own_pass

__all__ = ["LIFT_MIN_BYTES", "LIFTABLE_DTYPES", "lift_constants"]

#: constants at least this large leave the library; smaller ones (shapes, scales, most biases) stay, as
#: each lifted one is an argument of every call
LIFT_MIN_BYTES = 16 * 1024
#: element types a lifted constant may have: what a blob's index may name (the plugin reads the same)
LIFTABLE_DTYPES = frozenset(
    [
        "float16",
        "float32",
        "float64",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "bool",
    ]
)


@relax.expr_functor.mutator
class _Lifter(relax.PyExprMutator):
    """Replaces each large tensor constant by a new variable (one per constant, however often used)."""

    def __init__(self, mod: tvm.IRModule, min_bytes: int) -> None:
        super().__init__(mod)
        self.min_bytes = min_bytes
        self.params: list[relax.Var] = []
        self.arrays: list[np.ndarray] = []
        self.lifted: dict[tvm.ir.GenericConst, relax.Var] = {}

    def visit_generic_const_(self, const: tvm.ir.GenericConst) -> relax.Expr:
        param = self.lifted.get(const)
        if param is not None or not isinstance(const.ty, relax.TensorType):
            return const if param is None else param
        array = np.from_dlpack(const.value)  # the constant's own memory: VGG-19's 548 MB copied took 1.4 s
        if array.nbytes < self.min_bytes or array.dtype.name not in LIFTABLE_DTYPES:
            return const
        param = self.lifted[const] = relax.Var(f"lifted_{len(self.params)}", const.ty)
        self.params.append(param)
        self.arrays.append(array)
        return param


def lift_constants(arrays: list[np.ndarray], min_bytes: int = LIFT_MIN_BYTES) -> tvm.transform.Pass:
    """The pass lifting `main`'s constants of `min_bytes` or more into parameters after its own; their
    values are put in `arrays`, in parameter order."""

    @tvm.transform.module_pass(opt_level=0, name="nxrt_tvm.LiftConstants")
    @own_pass
    def lift(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        arrays.clear()
        main_var = mod.get_global_var("main")
        main = mod[main_var]
        lifter = _Lifter(mod, min_bytes)
        body = lifter.visit_expr(main.body)
        if not lifter.params:
            return mod
        arrays.extend(lifter.arrays)
        out = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs)
        out[main_var] = relax.Function(
            [*main.params, *lifter.params], body, main.ret_ty, main.is_pure, main.attrs, main.span
        )
        return out

    return lift
