"""The precision policy: an approximation is used only where its error cannot change a discrete result.

TVM's `FastMathTransform` replaces every exp, erf, tanh and softmax by a polynomial
(`topi.fast_exp`, `fast_erf`, `fast_tanh`, `fast_softmax`; sigmoid here too): vectorisable, where the
exact functions are scalar libm calls (GELU 9x faster). Their error is a few ulp
(`APPROXIMATIONS`), within the tolerance of any float output. It is not within the
tolerance of a value that is later cast to an integer, rounded, compared, arg-maxed,
used as an index or as a mask: one ulp there moves a position to the neighbouring
bucket (T5's relative-position buckets are `int(log(...) * k)`), flips a branch or
picks another token, and every output after it changes.

`PreciseFastMath` is `FastMathTransform` with that rule: a call is approximated only
when its result reaches no *discrete consumer*, followed backwards through every
binding of the function (whatever the ops in between). A discrete consumer is a call
that turns a float into something discrete: its result (or a field of it) is not a
float tensor while an argument is (casts to integers, comparisons, ArgMax/ArgMin,
TopK's indices, isnan/isinf), or it rounds (floor, ceil, round, sign). Index and mask
operands (Gather indices, Where's condition) are integers or booleans in ONNX, so
the float values they are computed from meet one of those casts or comparisons first.

Quantisation is not a discrete consumer: `quantize` (QuantizeLinear, DynamicQuantizeLinear)
and the rounding that computes its zero point only feed dequantisation and integer matmuls
that come back as floats, and a value within an ulp of a rounding half-point lands on
either neighbour whatever computes it (two runtimes that sum in another order already
disagree there): its tolerance is one quantisation step, not an ulp. So a quantize also ends what
must be exact (the integers it makes are exact whatever computed its input, and casts of them later
are not of its input), and a rounding whose result is cast to 8 bits is a zero point.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import relax, te, topi
from tvm.relax import PyExprMutator, expr_functor

from .fold_affine import op_call
from .strict import own_pass

__all__ = ["APPROXIMATIONS", "Approximation", "PreciseFastMath", "exact_vars", "fast_sigmoid", "fast_softmax"]


@dataclass(frozen=True)
class Approximation:
    """One approximation the policy may use, and its error measured against float64 math."""

    op: str  #: the Relax op it replaces
    replacement: str
    max_error: float  #: the bound tests/lower/test_precision.py holds it to (measured below it)
    error: str  #: "relative" or "absolute"
    domain: tuple[float, float]
    note: str = ""


#: Measured here on 2**20 evenly spaced float32 points per domain (softmax: 4096 rows of 256).
APPROXIMATIONS = (
    Approximation(
        "relax.exp",
        "topi.fast_exp",
        5e-6,
        "relative",
        (-87.0, 88.0),
        "4.1e-6 measured, growing with |x| (range reduction by a float32 ln 2; 1.1e-6 on [-20, 20]); "
        "0 below -87.3 (exact: denormals under 1.2e-38); inf above 88.38 (exact: finite up to 88.72)",
    ),
    Approximation("relax.erf", "topi.fast_erf", 5e-7, "relative", (-8.0, 8.0), "4.2e-7 measured (7 ulp)"),
    Approximation(
        "relax.tanh",
        "topi.fast_tanh",
        5e-7,
        "relative",
        (-9.0, 9.0),
        "3.6e-7 measured (6 ulp); the rational approximation onnxruntime's Tanh uses too",
    ),
    Approximation(
        "relax.sigmoid",
        "nxrt_tvm fast_sigmoid",
        5e-6,
        "relative",
        (-87.0, 87.0),
        "1 / (1 + fast_exp(-x)): fast_exp's error, 4.1e-6 measured at the ends; exactly 1 above 87.3, "
        "0 below -88.38 (exact: under 2.6e-38); the SiLU of EfficientNet/YOLO exports (libm expf per lane: "
        "the convolutions it ends ran 5x slower)",
    ),
    Approximation(
        "relax.nn.softmax",
        "nxrt_tvm fast_softmax",
        5e-7,
        "absolute",
        (-80.0, 80.0),
        "3.2e-7 measured: fast_exp after the row max, times the reciprocal of the row's sum",
    ),
)


def fast_sigmoid(x):
    """``1 / (1 + fast_exp(-x))``: vectorisable, where TVM's sigmoid calls libm's expf lane by lane."""
    return topi.divide(1.0, topi.add(1.0, topi.fast_exp(topi.negative(x))))


def fast_softmax(x, axis: int):
    """`topi.nn.fast_softmax` with each row scaled by the reciprocal of its sum, computed once a row,
    as onnxruntime scales: a division per element (`vdivps`, 5 cycles a vector on a Zen 3) took a
    third of a 500-wide softmax's time."""
    axis = axis % len(x.shape)
    rows = [d for k, d in enumerate(x.shape) if k != axis]

    def row(index):
        return tuple(v for k, v in enumerate(index) if k != axis)

    def along(index, k):
        return (*index[:axis], k, *index[axis:])

    k1 = te.reduce_axis((0, x.shape[axis]), name="k")
    k2 = te.reduce_axis((0, x.shape[axis]), name="k")
    top = te.compute(rows, lambda *i: te.max(x[along(i, k1)], axis=k1), name="T_softmax_maxelem")
    delta = te.compute(x.shape, lambda *i: x[i] - top[row(i)], name="T_softmax_delta")
    exp = topi.fast_exp(delta)
    total = te.compute(rows, lambda *i: te.sum(exp[along(i, k2)], axis=k2), name="T_softmax_expsum")
    scale = te.compute(rows, lambda *i: tvm.tirx.const(1.0, x.dtype) / total[i], name="T_softmax_scale")
    return te.compute(x.shape, lambda *i: exp[i] * scale[row(i)], name="T_softmax_norm")


_FAST = {
    "relax.exp": lambda bb, x, _attrs: bb.call_te(topi.fast_exp, x),
    "relax.sigmoid": lambda bb, x, _attrs: bb.call_te(fast_sigmoid, x, primfunc_name_hint="fast_sigmoid"),
    "relax.erf": lambda bb, x, _attrs: bb.call_te(topi.fast_erf, x),
    "relax.tanh": lambda bb, x, _attrs: bb.call_te(topi.fast_tanh, x),
    "relax.nn.softmax": lambda bb, x, attrs: bb.call_te(
        fast_softmax, x, attrs.axis, primfunc_name_hint="fast_softmax"
    ),
}

#: ops whose float result is discrete all the same
_ROUNDING = frozenset({"relax.floor", "relax.ceil", "relax.round", "relax.sign", "relax.trunc"})
#: quantisation: a rounding whose result only reaches these
#: (through `_QPARAM_PATH`) is a quantisation parameter
_QUANTIZE = frozenset({"relax.quantize", "relax.dequantize"})
_QPARAM_PATH = frozenset({"relax.astype", "relax.clip", "relax.round", *_QUANTIZE})


def _dtypes(ty) -> list[str]:
    if isinstance(ty, relax.TupleType):
        return [d for field in ty.fields for d in _dtypes(field)]
    dtype = getattr(ty, "dtype", None)
    return [] if dtype is None else [str(getattr(dtype, "dtype", dtype))]


def _is_float(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat"))


def _discrete_consumer(call: relax.Call) -> bool:
    if not isinstance(call.op, tvm.ir.Op) or call.op.name in _QUANTIZE:
        return False
    if call.op.name in _ROUNDING:
        return True
    takes_float = any(
        _is_float(d) for arg in call.args if isinstance(arg, relax.Expr) for d in _dtypes(arg.ty)
    )
    return takes_float and any(not _is_float(d) for d in _dtypes(call.ty))


@expr_functor.visitor
class _Collect(relax.PyExprVisitor):
    """Every binding of a function (nested blocks included), in order."""

    def __init__(self) -> None:
        super().__init__()
        self.bindings: list[tuple[relax.Var, relax.Expr]] = []
        self.discrete: list[relax.Var] = []  #: vars bound to a discrete consumer's result

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        self.bindings.append((binding.var, binding.value))
        if isinstance(binding.value, relax.Call) and _discrete_consumer(binding.value):
            self.discrete.append(binding.var)
        super().visit_var_binding_(binding)

    def visit_match_cast_(self, binding: relax.MatchCast) -> None:
        self.bindings.append((binding.var, binding.value))
        super().visit_match_cast_(binding)


def exact_vars(func: relax.Function) -> set[relax.Var]:
    """The variables of `func` whose values reach a discrete consumer: they must be computed exactly."""
    collect = _Collect()
    collect.visit_expr(func)
    values = dict(collect.bindings)
    users: dict[relax.Var, list[relax.Var]] = {}
    for var, value in collect.bindings:
        for used in relax.analysis.free_vars(value):
            users.setdefault(used, []).append(var)

    def quantisation_parameter(var: relax.Var) -> bool:
        """Whether every use of `var` leads only to quantisation (a zero point, a scale): quantize or
        dequantize, or a cast to 8 bits (MatMulInteger's import takes its zero point so, into integer
        arithmetic that comes back as floats)."""
        uses = users.get(var, [])
        return bool(uses) and all(
            isinstance(values[u], relax.Call)
            and isinstance(values[u].op, tvm.ir.Op)
            and values[u].op.name in _QPARAM_PATH
            and (
                values[u].op.name in _QUANTIZE
                or _dtypes(values[u].ty) in (["int8"], ["uint8"])
                or quantisation_parameter(u)
            )
            for u in uses
        )

    quantising = {var for var in collect.discrete if quantisation_parameter(var)}
    exact = {used for var in collect.discrete if var not in quantising for used in _free(values[var])}
    changed = True
    while changed:  # one reverse pass settles straight-line code; nested blocks may need another
        changed = False
        for var, value in reversed(collect.bindings):
            if var in exact and var not in quantising:
                for used in _free(value):
                    if used not in exact:
                        exact.add(used)
                        changed = True
    return exact


def _free(value: relax.Expr) -> list[relax.Var]:
    """The variables an exact `value` needs exact: none through a quantize (what it rounds tolerates an
    ulp, see the module doc: the integers it makes are exact whatever computes its input)."""
    if op_call(value, "relax.quantize") is not None:
        return []
    return list(relax.analysis.free_vars(value))


def _known_shape(expr: relax.Expr) -> bool:
    """`call_te` (the fast ops are TE) needs a shape expression; a tensor of known rank only stays exact."""
    ty = expr.ty
    return isinstance(ty, relax.TensorType) and isinstance(ty.shape, relax.ShapeExpr)


@expr_functor.mutator
class _Approximate(PyExprMutator):
    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.exact: set[relax.Var] = set()
        self._binding: relax.Var | None = None

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        self._binding = binding.var
        super().visit_var_binding_(binding)

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        if (
            isinstance(call.op, tvm.ir.Op)
            and call.op.name in _FAST
            and _known_shape(call.args[0])
            and self._binding is not None
            and self._binding not in self.exact
        ):
            return _FAST[call.op.name](self.builder_, self.visit_expr(call.args[0]), call.attrs)
        return super().visit_call_(call)


@tvm.transform.module_pass(opt_level=0, name="nxrt_tvm.PreciseFastMath")
class PreciseFastMath:
    """`FastMathTransform`, except on values that reach a discrete consumer (see the module doc)."""

    @own_pass
    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        mutator = _Approximate(mod)
        for gv, func in mod.functions_items():
            if isinstance(func, relax.Function):
                mutator.exact = exact_vars(func)
                mutator.builder_.update_func(gv, mutator.visit_expr(func))
        return mutator.builder_.get()
