"""Kernels take their symbolic sizes in one order, whatever the process.

TVM's `call_te` (every legalised op, our fast-math kernels) appends the sizes a kernel needs
beyond its tensors' dims (`height`, `width` of a softmax over a flattened feature map) in the
order a Python set of TIR variables iterates: by object address. The same model then gave
kernels whose parameters came in another order from run to run, and with them other fusions,
other kernel names and other structural hashes (YOLOv8n: 151 to 154 kernels, and tuning records
are keyed by those hashes), and kernels equal but for that order stayed apart. `SizeParamsInOrder`
puts each kernel's size parameters in the order its buffers' shapes use them, with its calls'
arguments, merges the kernels that are then equal and names them in the order they are first called,
after legalisation and after fusion (each makes kernels).
"""

from __future__ import annotations

import re

import tvm
import tvm_ffi
from tvm import relax, tirx

from .strict import own_pass

__all__ = ["MergeNamedKernels", "SizeParamsInOrder"]

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")


def _sorted_sizes(func: tirx.PrimFunc) -> list[int] | None:
    """For each parameter slot of `func`, the index of the parameter that goes there with its size
    parameters in the order they first appear in its buffers' shapes (then by name: several may share
    one, as TVM's Range converter names every length `range_len`); None where they are in order."""
    seen: dict[tirx.Var, int] = {}
    for param in func.params:
        if isinstance(param.ty, tirx.BufferType):
            for dim in param.shape:
                for var in tirx.analysis.undefined_vars(dim):
                    seen.setdefault(var, len(seen))
    slots = [i for i, p in enumerate(func.params) if not isinstance(p.ty, tirx.BufferType)]
    order = sorted(slots, key=lambda i: (seen.get(func.params[i], len(seen)), str(func.params[i].name)))
    if order == slots:
        return None
    perm = list(range(len(func.params)))
    for slot, source in zip(slots, order):
        perm[slot] = source
    return perm


@relax.expr_functor.mutator
class _PermuteCalls(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, perms: dict[str, list[int]], callees: dict[str, tvm.ir.GlobalVar]):
        super().__init__(mod)
        self.perms = perms
        self.callees = callees  #: kernel name -> what its calls now call (itself renamed, or its equal)

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not _calls_kernel(call) or call.args[0].name_hint not in self.callees:
            return call
        name = call.args[0].name_hint
        perm = self.perms.get(name)
        fields = list(call.args[1].fields)
        inputs = relax.Tuple([fields[i] for i in perm[: len(fields)]]) if perm is not None else call.args[1]
        args = [self.callees[name], inputs, *call.args[2:]]
        return relax.Call(call.op, args, call.attrs, call.ty_args, call.span)


def _calls_kernel(call: relax.Expr) -> bool:
    return (
        isinstance(call, relax.Call)
        and call.op.same_as(_CALL_TIR)
        and isinstance(call.args[0], tvm.ir.GlobalVar)
        and isinstance(call.args[1], relax.Tuple)
    )


def _plain_callers(mod: tvm.IRModule) -> dict[str, bool]:
    """Per kernel name: whether every use of it is a `call_tir` whose argument tuple holds all its size
    parameters (a kernel used any other way keeps its order)."""
    plain: dict[str, bool] = {}
    last_size = {  # the index of each kernel's last size parameter
        gv.name_hint: max(
            (i for i, p in enumerate(f.params) if not isinstance(p.ty, tirx.BufferType)), default=-1
        )
        for gv, f in mod.functions_items()
        if isinstance(f, tirx.PrimFunc)
    }

    def visit(expr) -> None:
        if _calls_kernel(expr):
            name = expr.args[0].name_hint
            plain[name] = plain.get(name, True) and len(expr.args[1].fields) > last_size.get(name, 0)
        elif isinstance(expr, relax.Call):
            for arg in expr.args:
                if isinstance(arg, tvm.ir.GlobalVar) and arg.name_hint in last_size:
                    plain[arg.name_hint] = False

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return plain


@tvm.transform.module_pass(opt_level=0, name="nxrt_tvm.SizeParamsInOrder")
@own_pass
def SizeParamsInOrder(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """Each kernel's size parameters in order (`_sorted_sizes`), with the arguments of every call to it;
    kernels then equal merged, and named in call order (`_names_in_call_order`)."""
    plain = _plain_callers(mod)
    perms: dict[str, list[int]] = {}
    kernels: dict[tvm.ir.GlobalVar, tirx.PrimFunc] = {}
    for gv, func in sorted(mod.functions_items(), key=lambda item: item[0].name_hint):
        if not isinstance(func, tirx.PrimFunc) or not plain.get(gv.name_hint, False):
            continue
        perm = _sorted_sizes(func)
        if perm is not None:
            perms[gv.name_hint] = perm
            func = tirx.PrimFunc(
                [func.params[i] for i in perm], func.body, func.ret_type, func.attrs, func.span
            )
        kernels[gv] = func
    if not kernels:
        return mod
    same: dict[str, str] = {}  # kernel name -> the name of the equal kernel it merges into
    first: dict[int, list[tvm.ir.GlobalVar]] = {}
    bare = {gv: func.without_attr("global_symbol") for gv, func in kernels.items()}  # its name
    for gv, func in bare.items():
        bucket = first.setdefault(tvm_ffi.structural_hash(func), [])
        equal = next((k for k in bucket if tvm_ffi.structural_equal(bare[k], func)), None)
        if equal is None:
            bucket.append(gv)
        else:
            same[gv.name_hint] = equal.name_hint
    kept = {gv.name_hint: same.get(gv.name_hint, gv.name_hint) for gv in kernels}
    renamed = _names_in_call_order(mod, kept)
    callees = {name: renamed[survivor] for name, survivor in kept.items()}
    mutator = _PermuteCalls(mod, perms, callees)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gv, mutator.visit_expr(func))
    out = mutator.builder_.get()
    functions = {gv: func for gv, func in out.functions_items() if gv.name_hint not in callees}
    for gv, func in kernels.items():
        if gv.name_hint not in same:
            new = renamed[gv.name_hint]
            symbol = func.attrs is not None and "global_symbol" in func.attrs
            functions[new] = func.with_attr("global_symbol", new.name_hint) if symbol else func
    result = tvm.IRModule(functions, attrs=out.attrs)
    for name, infos in (out.global_infos or {}).items():
        result.update_global_info(name, infos)
    return result


_DIGITS = re.compile(r"\d+$")


def _names_in_call_order(mod: tvm.IRModule, kernels: dict[str, str]) -> dict[str, tvm.ir.GlobalVar]:
    """New global vars for the kernels that stay (`kernels`: each kernel's name -> the name of the one it
    is merged into, or its own), named in the order the Relax functions first call them: each name's
    numbering came from the order TVM made kernels, which merged duplicates shifted. The same model
    compiles to the same kernel names (its executable's bytes still vary: TVM's VMShapeLower orders
    its shape slots by address)."""
    todo = set(kernels.values())
    taken = {gv.name_hint for gv in mod.get_global_vars() if gv.name_hint not in kernels}
    order: dict[str, None] = {}  # the kept kernels, first called first

    def visit(expr) -> None:
        if _calls_kernel(expr) and expr.args[0].name_hint in kernels:
            order.setdefault(kernels[expr.args[0].name_hint])

    for gv, func in sorted(mod.functions_items(), key=lambda item: item[0].name_hint):
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    renamed: dict[str, tvm.ir.GlobalVar] = {}
    for name in [*order, *sorted(todo - order.keys())]:
        base, k = _DIGITS.sub("", name) or name, 0
        new = base
        while new in taken:
            k += 1
            new = f"{base}{k}"
        taken.add(new)
        renamed[name] = tvm.ir.GlobalVar(new)
        relax.expr._update_type(renamed[name], mod.get_global_var(name).ty)  # what add_func gives one
    return renamed


@tvm.transform.module_pass(opt_level=0, name="nxrt_tvm.MergeNamedKernels")
@own_pass
def MergeNamedKernels(mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """`SizeParamsInOrder` again after `NameCompoundSizes`, where a kernel has symbolic dims: kernels that
    differed only in their size expressions are equal once those are named (YOLOv8n's three detection
    heads: 122 kernels, 93 distinct), and one of each is scheduled and built. A static module has
    nothing new to merge (DenseNet-121: 0.08 s saved)."""
    for func in mod.functions.values():
        if isinstance(func, tirx.PrimFunc) and any(
            not isinstance(d, tirx.IntImm)
            for p in func.params
            if isinstance(p.ty, tirx.BufferType)
            for d in p.shape
        ):
            return SizeParamsInOrder(mod)
    return mod
