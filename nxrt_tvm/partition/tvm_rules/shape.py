"""TVM claim rules for shape, indexing, reduction and resampling ops (see `kit`)."""

from __future__ import annotations

from ...api.claim import Rejected, deny, require
from ..node_context import NodeContext
from .kit import FALLBACK, is_shape_derived, require_attr, require_const, rule

# -- shape-producing ops: the target shape must be known when importing ------------------


def _require_shape_operand(ctx: NodeContext, i: int, what: str) -> None:
    require(
        is_shape_derived(ctx, i),
        Rejected.INPUT,
        f"{what} (input {i}, {ctx.node.input[i]!r}) is read from tensor data at run time",
        accepts=f"a constant {what}, or one computed from tensor shapes (Shape, Gather, Concat, ...)",
        remediation=f"{FALLBACK}; fold {what} to a constant (e.g. onnxsim) or export with static shapes",
    )


# Without: a runtime shape tensor fails to import ("Reshape requires the input new shape to be Shape").
@rule("Reshape")
def _reshape(ctx: NodeContext) -> None:
    _require_shape_operand(ctx, 1, "target shape")


# Without: a runtime shape tensor imports, but the output keeps the data's dims
# where the new shape broadcasts them (data (3,1), shape [2,1,6] gives (2,1,6), not (2,3,6)).
# With a constant shape, a symbolic data dim fails to import ("'Var' object has no
# attribute 'value'"), against a target value of 1 as well as any other.
@rule("Expand")
def _expand(ctx: NodeContext) -> None:
    _require_shape_operand(ctx, 1, "target shape")
    target, data = ctx.const(1), ctx.inputs[0].shape
    if target is not None and data is not None:
        for d, t in zip(reversed(data), reversed(target.tolist())):
            require(
                isinstance(d, int),
                Rejected.SHAPE,
                f"data dim {d!r} is symbolic where the target shape {target.tolist()} has {t}",
                accepts="static data dims under a constant target shape",
                remediation=f"{FALLBACK}; fix the input shape (onnxsim --overwrite-input-shape)",
            )


# Without: a runtime shape tensor imports but fails to legalise (assert in reshape_call_te).
@rule("ConstantOfShape")
def _constant_of_shape(ctx: NodeContext) -> None:
    _require_shape_operand(ctx, 0, "output shape")


# Without: "Dynamic Split not yet supported"; zero-size parts fail to build ("split_indices must be sorted").
@rule("Split", since=13)
def _split(ctx: NodeContext) -> None:
    _split_sizes(ctx, ctx.const(1) if ctx.has_input(1) else None)
    require_const(ctx, 1, "split sizes")


@rule("Split")
def _split_v1(ctx: NodeContext) -> None:
    split = ctx.attr("split")
    _split_sizes(ctx, None if split is None else list(split))


def _split_sizes(ctx: NodeContext, sizes) -> None:
    if sizes is None:
        return
    sizes = [int(s) for s in sizes]
    require(
        all(s > 0 for s in sizes),
        Rejected.INPUT,
        f"split sizes {sizes} contain a zero-size part",
        accepts="split sizes that are all > 0",
        remediation=f"{FALLBACK}; remove the empty outputs from the split",
    )


# Without: "TopK k must be a constant"; sorted=0 is refused by the converter.
@rule("TopK", since=10)
def _topk(ctx: NodeContext) -> None:
    require_const(ctx, 1, "k")
    require_attr(ctx, "sorted", (1,), 1, accepts="sorted=1")


# Without: runtime pads/constant_value/axes fail to import ("Dynamic pads are not supported yet").
@rule("Pad", since=11)
def _pad(ctx: NodeContext) -> None:
    require_const(ctx, 1, "pads", optional=False)
    require_const(ctx, 2, "constant_value")
    require_const(ctx, 3, "axes")


# Without: a runtime `size` fails to import ("Dynamic size ... is not supported").
@rule("AffineGrid")
def _affine_grid(ctx: NodeContext) -> None:
    require_const(ctx, 1, "size", optional=False)


# Without: runtime max_output_boxes_per_class / thresholds give an empty (0, 3) result.
@rule("NonMaxSuppression")
def _nms(ctx: NodeContext) -> None:
    for i, what in ((2, "max_output_boxes_per_class"), (3, "iou_threshold"), (4, "score_threshold")):
        require_const(ctx, i, what)


# Without: mode=CRD is computed as DCR (wrong values).
@rule("SpaceToDepth")
def _space_to_depth(ctx: NodeContext) -> None:
    require_attr(ctx, "mode", ("DCR",), "DCR", accepts="mode=DCR (the default)")


# Without: a dtype attribute different from the input's fails to import ("dtype mismatch").
@rule("EyeLike")
def _eye_like(ctx: NodeContext) -> None:
    dtype = ctx.attr("dtype")
    src = ctx.inputs[0].elem_type if ctx.inputs and ctx.inputs[0] else None
    require(
        dtype is None or dtype == src,
        Rejected.ATTRIBUTE,
        f"dtype={dtype} differs from the input's element type {src}",
        accepts="no dtype attribute, or the input's own element type",
        remediation=f"{FALLBACK}; add a Cast after EyeLike instead",
    )


# -- reductions ---------------------------------------------------------------------------

_REDUCE_AXES_INPUT_SINCE = {"ReduceSum": 13}
_REDUCE_OPS = (
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceMax",
    "ReduceMean",
    "ReduceMin",
    "ReduceProd",
    "ReduceSum",
    "ReduceSumSquare",
)


def _reduce_rule(op: str):
    # Without: runtime axes fail to import ("Only constant axes currently supported");
    # reducing an empty tensor returns garbage instead of the identity (0, 1, -inf, ...);
    # ReduceMax/ReduceMin of bool fail to build ("Cannot decide min_value for type bool").
    def check(ctx: NodeContext) -> None:
        if ctx.opset >= _REDUCE_AXES_INPUT_SINCE.get(op, 18):
            require_const(ctx, 1, "axes")
        shape = ctx.inputs[0].shape if ctx.inputs and ctx.inputs[0] else None
        require(
            shape is None or 0 not in shape,
            Rejected.SHAPE,
            f"input shape {list(shape or ())} is empty (a zero-size dim)",
            accepts="inputs with no zero-size dimension",
            remediation=FALLBACK,
        )
        if op in ("ReduceMax", "ReduceMin"):
            require(
                ctx.inputs[0] is None or ctx.inputs[0].type_name != "bool",
                Rejected.DTYPE,
                "bool input",
                accepts="numeric inputs",
                remediation=f"{FALLBACK}; Cast to uint8 first to let TVM take it",
            )

    check.__name__ = f"_{op.lower()}"
    return check


for _op in _REDUCE_OPS:
    rule(_op)(_reduce_rule(_op))


# -- resampling ---------------------------------------------------------------------------


# Without: runtime scales/sizes fail to import; antialias, axes, keep_aspect_ratio_policy
# and half_pixel_symmetric fail to import or build; a scale that does not give an integral
# output size is applied as out/in by TVM, not as the given scale (wrong values).
@rule("Resize", since=11)
def _resize(ctx: NodeContext) -> None:
    rank = ctx.rank(0)
    require(
        rank in (3, 4, 5),
        Rejected.SHAPE,
        f"input rank {rank}",
        accepts="rank 3, 4 or 5 inputs (resize1d/2d/3d)",
        remediation=FALLBACK,
    )
    require_const(ctx, 2, "scales")
    require_const(ctx, 3, "sizes")
    require_attr(ctx, "antialias", (0,), 0, accepts="antialias=0")
    require(
        ctx.attr("axes") is None,
        Rejected.ATTRIBUTE,
        f"axes={list(ctx.attr('axes') or [])}",
        accepts="no axes attribute (scales/sizes for every dim)",
        remediation=f"{FALLBACK}; give scales or sizes for all dims",
    )
    require_attr(
        ctx, "keep_aspect_ratio_policy", ("stretch",), "stretch", accepts="keep_aspect_ratio_policy=stretch"
    )
    require_attr(
        ctx,
        "coordinate_transformation_mode",
        ("half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel", "tf_crop_and_resize"),
        "half_pixel",
        accepts="half_pixel, align_corners, asymmetric, pytorch_half_pixel, tf_crop_and_resize",
    )
    if ctx.attr("coordinate_transformation_mode") == "tf_crop_and_resize":
        require_const(ctx, 1, "roi")
    scales = ctx.const(2)
    shape = ctx.inputs[0].shape if ctx.inputs[0] else None
    if scales is not None and scales.size and shape is not None:
        for d, s in zip(shape, scales.tolist()):
            if isinstance(d, int):
                out = d * s
                require(
                    abs(out - round(out)) < 1e-6,
                    Rejected.INPUT,
                    f"scale {s} on a dim of size {d} gives a fractional output size {out:g}",
                    accepts="scales that give integral output sizes, or constant sizes",
                    remediation=f"{FALLBACK}; export with sizes instead of scales",
                )


# Without: Upsample-9 reads `scales` from an attribute that no longer exists (import fails).
@rule("Upsample")
def _upsample(ctx: NodeContext) -> None:
    deny(
        Rejected.OP,
        f"Upsample-{ctx.opset} is not imported correctly (scales is an input since opset 9)",
        accepts="Resize",
        remediation=f"{FALLBACK}; re-export with Resize (opset >= 11)",
    )


# Without: a length read from tensor data makes the output's extent a run-time value;
# fused consumers then fail to build ("PrimExpr ... range_len has not been computed").
@rule("Range")
def _range(ctx: NodeContext) -> None:
    for i, what in ((0, "start"), (1, "limit"), (2, "delta")):
        _require_shape_operand(ctx, i, what)


# Without: LLVM's AVX-512 code generation (TVM 0.27, mcpu skylake-avx512 .. znver5) computes
# wrong values, even NaN from reads outside the input, for Tile at some shapes, e.g.
# (2,3,4,5) x [1,6,4,2]; the same TIR is right without AVX-512 (x86-64-v3).
@rule("Tile")
def _tile(ctx: NodeContext) -> None:
    require(
        "avx512f" not in ctx.target_features,
        Rejected.OP,
        "Tile is miscompiled by TVM 0.27's LLVM AVX-512 code generation (wrong values at some shapes)",
        accepts="Tile on targets without AVX-512",
        remediation=(
            f"{FALLBACK}; or target a CPU without AVX-512 (target={{'kind': 'llvm', 'mcpu': 'x86-64-v3'}})"
        ),
    )


# -- indices read from tensor data ----------------------------------------------------------

# TVM's take / gather / gather_nd / scatter kernels do not bounds-check their indices (relax.op.take's
# default mode is "fast"), while ONNX requires an error. Measured on TVM 0.27 with indices fed at run
# time to a (4, 3) tensor: index 4 or 1000 reads garbage; index 2**40 kills the process with SIGSEGV
# (Gather, GatherElements, GatherND, ScatterElements, ScatterND); a Scatter* index of 7 writes outside
# the output buffer. So constant indices must be proven in range here, and the ops whose converters
# guard their indices (`nxrt_tvm.frontend`: a kernel that raises IndexOutOfBounds naming the node) take
# indices computed from tensor shapes, which are not in range by construction either (a position
# table sliced by a too-long sequence). The guard needs the data's rank and, for the ND ops, a static
# last dim of the indices. Indices read from tensor data stay on the fallback for now: claiming them
# is safe with the guard, but today it adds failing builds (the partitions around an embedding
# Gather do not build with symbolic shapes) without joining any partitions.
_INDEX_WHAT = "indices"


def require_bounded_indices(
    ctx: NodeContext,
    i: int,
    extents,
    *,
    allow_negative: bool = True,
    what: str = _INDEX_WHAT,
    guarded: bool = False,
    nd: bool = False,
) -> None:
    """Input `i` holds indices: a constant whose every value is in range, or (`guarded` ops) a value the
    index guard checks at run time (token ids read from the feeds included), raising `IndexOutOfBounds`
    with the node, the value and the first bad index, as onnxruntime raises.

    `extents(value)` gives, for a constant index array, pairs (index values, extent of the
    dim they index) where the extent is an int or a symbolic/unknown dim.
    """
    if not ctx.has_input(i):
        return
    name = ctx.node.input[i]
    value = ctx.const(i)
    if value is None and not guarded:
        deny(
            Rejected.INPUT,
            f"{what} (input {i}, {name!r}) are computed at run time, and TVM does not bounds-check them for "
            f"{ctx.node.op_type}: an out-of-range index reads or "
            "writes outside the tensor and can crash the process",
            accepts=f"constant {what} within the data's bounds",
            remediation=(
                f"{FALLBACK}, which bounds-checks indices; fold the indices to constants (e.g. onnxsim)"
            ),
        )
    if value is None:  # the index guard kernel checks them at run time (`frontend`): IndexOutOfBounds
        data, indices = ctx.inputs[0].shape if ctx.inputs[0] is not None else None, ctx.inputs[i].shape
        require(
            data is not None and (not nd or (bool(indices) and isinstance(indices[-1], int))),
            Rejected.SHAPE,
            f"{what} (input {i}, {name!r}) are read at run time "
            "and must be checked there, but the data's rank"
            + (" or the indices' last dim is unknown" if nd else " is unknown"),
            accepts=f"run-time {what} into data of known rank" + (" with a static last dim" if nd else ""),
            remediation=(
                f"{FALLBACK}, which bounds-checks indices; run shape "
                "inference on the model (onnx.shape_inference)"
            ),
        )
        return
    for values, extent in extents(value):
        values = [int(v) for v in values.reshape(-1).tolist()] if hasattr(values, "reshape") else list(values)
        if not values:
            continue
        lo = -extent if (allow_negative and isinstance(extent, int)) else 0
        if guarded and isinstance(extent, str):
            continue  # a dim the run decides (a sequence, fed empty): the index guard checks it then
        if isinstance(extent, int):
            ok = all(lo <= v < extent for v in values)
            shown = f"[{lo}, {extent})"
        else:  # symbolic or unknown extent: only indices valid for any non-empty dim
            ok = all(v == 0 or (allow_negative and v == -1) for v in values)
            shown = f"a dim of unknown size {extent!r}"
        require(
            ok,
            Rejected.INPUT,
            f"constant {what} (input {i}, {name!r}) {sorted(set(values))[:8]} are not all within {shown}",
            accepts=f"{what} within the data's bounds (TVM does not check them at run time)",
            remediation=f"{FALLBACK}, which reports the out-of-range index; fix the indices",
        )


def _dim(ctx: NodeContext, k: int, axis: int):
    shape = ctx.inputs[k].shape if k < len(ctx.inputs) and ctx.inputs[k] is not None else None
    if shape is None or not shape:
        return None
    return shape[axis % len(shape)]


def _along_axis(ctx: NodeContext, data: int = 0):
    axis = int(ctx.attr("axis", 0))
    return lambda value: [(value, _dim(ctx, data, axis))]


def _nd(ctx: NodeContext, batch_dims: int = 0):
    shape = ctx.inputs[0].shape if ctx.inputs and ctx.inputs[0] is not None else None

    def extents(value):
        if value.ndim == 0:
            return [(value, None)]
        k = value.shape[-1]
        return [
            (
                value[..., j],
                shape[batch_dims + j] if shape is not None and batch_dims + j < len(shape) else None,
            )
            for j in range(k)
        ]

    return extents


def _indices_along_axis(ctx: NodeContext) -> None:
    """Constant indices must be in range; run-time ones are bounds-checked by the index guard."""
    require_bounded_indices(ctx, 1, _along_axis(ctx), guarded=True)


for _op in ("Gather", "GatherElements", "ScatterElements", "Scatter"):
    rule(_op)(_indices_along_axis)


@rule("GatherND")
def _gather_nd(ctx: NodeContext) -> None:
    require_bounded_indices(ctx, 1, _nd(ctx, int(ctx.attr("batch_dims", 0))), guarded=True, nd=True)


@rule("ScatterND")
def _scatter_nd(ctx: NodeContext) -> None:
    require_bounded_indices(ctx, 1, _nd(ctx), guarded=True, nd=True)
