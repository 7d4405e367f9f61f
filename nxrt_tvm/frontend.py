"""ONNX -> Relax: the one module that touches TVM's private ONNX frontend API.

TVM's importer looks its converters up in `onnx_frontend._get_convert_map()`
(one class per op, `_impl_vN` per opset). Ours replace TVM's where TVM's are
unsafe on shapes that only the user's input decides:

- `Slice` with bounds that are symbolic (computed from input shapes): TVM
  builds it with `assume_inbound=True`, so an end past the data is not
  clamped as ONNX requires; a position table sliced to a too-long sequence
  read past its end (garbage values, then a SIGSEGV in the gather after it).
- `Gather`, `GatherElements`, `GatherND`, `Scatter`, `ScatterElements`,
  `ScatterND` with indices that are not constants, or constants into a dim
  of symbolic size (BERT's pooler reads token 0 of a sequence that may be
  fed empty): TVM's kernels never check an index (`take`'s mode is "fast").
  Every such index first goes through an index guard kernel, which checks it against the dim it indexes (ONNX
  allows [-n, n)), makes it non-negative, and otherwise fails the call with a
  message naming the node (`IndexOutOfBounds` in the kernel).
- `Range` over a size (`Range(0, seq, 1)`, position ids): TVM's length is a
  fresh var unrelated to `seq`, so `[batch, seq] + [len]` does not build; ours
  is an expression of `seq`.
- `Add`, `Sub`, `Mul`, `Div`, `Pow`, `Where`, `Concat`, comparisons and
  logic with operand sizes Relax cannot prove equal: a clamped size (`table[:seq]` is `min(seq, 64)`
  long) against `seq`, an upsampled map (`2 * ceil(h / 32)`) against a skip
  connection (`ceil(h / 16)`), `unk__24` against 384. The result's shape is
  unknown and the build fails; ours checks the sizes at run time, as
  onnxruntime does (equal, or 1 where the op broadcasts; a mismatch raises),
  and gives the result the size that decides it (see `_resolve_sizes`).
- `Dropout`: TVM's `R.nn.dropout` returns a tuple that its layout conversion fails
  on, so one Dropout kept every convolution in its partition between transposes
  (SqueezeNet 2.4x onnxruntime); ours is the data and an all-true mask, ONNX's
  inference meaning.
- `BitShift` by an amount outside [0, bits) (run-time amounts): undefined in
  LLVM, garbage on AVX2; ours gives ONNX's 0 or sign fill.
- `Max`, `Min`, `Sum`, `Mean` of tensors: TVM broadcasts, stacks and reduces
  them; `R.stack` has no layout rule, so one Max in a partition kept every
  convolution in it in NCHW (a 1-D conv written as Nx1 2-D ran 50x slower
  than onnxruntime). Ours fold the inputs pairwise (maximum, add, ...), as TVM
  itself does where shapes are unknown: elementwise ops that fuse.
- `Clip`: TVM emits its bounds as TE kernels (`emit_te(topi.maximum)`), which
  layout conversion cannot see through: each ReLU6 between NHWC convolutions
  became transpose, clip, transpose (a third of MobileNetV2's run time). Ours
  are Relax `maximum`/`minimum`.
- `MaxPool`, `AveragePool` of an input shorter than the window: onnxruntime
  pools what is there (trunc of the size division), TVM gives a zero-size map
  (floor). Ours extend such an input by the missing part first (see
  `_pool_like_onnxruntime`).

- `MatMulInteger` (dynamic int8 quantisation): TVM multiplies int32 vectors (`vpmulld`, 4x the cost
  of an fp32 FMA here), a quantised BERT's dense layers ran 4x slower than onnxruntime. uint8
  activations by constant int8 weights with no weight zero point (what `quantize_dynamic` writes) are
  ``matmul(a, b, out_dtype="int32") - a_zero_point * colsum(b)``: the 8-bit operands kept for
  `lower.integer_matmul` to give AVX-512 VNNI, or float32 where that is exact. Other operands, where
  their ranges (their int8/uint8 types less the zero points, or a constant's own values) bound every
  partial sum below 2^24 (K * max|a| * max|b|, `exact_in_float32`), are computed in float32 and cast
  back: the same integers, on the float matmul rule.

Two converters add ops TVM has none for: `LSTM` and `GRU` (layout 0, default activations, no
sequence_lens, peepholes or clip: the claim rule declines the rest). Every step's input projection
is one matmul; the recurrence is one kernel (`recurrence`).

One converter adds opsets TVM's lacks: `Resize` 11 and 13 (TVM has only 18,
so every opset-17 torch export's upsampling was declined) through TVM's
opset-18 implementation, whose inputs and attributes are theirs plus ones
(antialias, axes, keep_aspect_ratio_policy) that the earlier opsets fix to
their defaults.

Models at old opsets (the ONNX model zoo's opset-8/9 CNNs, Paddle's opset 11/12
exports) use op versions older than TVM's lowest converter for Conv, Relu,
BatchNormalization, Concat, Reshape, Gemm, ...: where the later versions only
added types, negative axes or optional inputs (`EARLIER_VERSIONS`), TVM's lowest
converter also serves those versions. Ops whose meaning changed (Softmax's 2-D
coercion before 13, attributes that became inputs) are not in the table.

The overrides are installed only while `import_onnx` runs (under a lock), so
other users of TVM's frontend in the process see TVM's own converters.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import re
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import onnx
import tvm
from tvm import relax, sym, tirx
from tvm.relax.frontend.onnx import from_onnx, onnx_frontend

from .api.errors import CompileFailed
from .api.registry import default_opset
from .recurrence import Recurrence, recurrence_kernel

__all__ = [
    "EARLIER_VERSIONS",
    "GUARD_MARKER",
    "exact_in_float32",
    "GuardFailure",
    "convert_map",
    "min_opset",
    "import_onnx",
    "parse_guard_failure",
]

#: Prefix of the message an index guard fails with; `parse_guard_failure` reads it back.
GUARD_MARKER = "nxrt-index-guard"


# -- the index guard ------------------------------------------------------------------------


_GUARD_SOURCE = """
@T.prim_func(private=True, s_tir=True)
def guard(a: T.handle, e: T.handle, b: T.handle):
    T.func_attr(
        {{
            "tirx.noalias": True,
            "op_pattern": 8,
            "tirx.is_scheduled": True,
            "nxrt.schedule_rule": "IndexGuard",
        }}
    )
    m = T.int64()
    k = T.int64()
    A = T.match_buffer(a, (m, k), "{dtype}")
    E = T.match_buffer(e, (k,), "{dtype}")
    B = T.match_buffer(b, (m, k), "{dtype}")
    for i, j in T.grid(m, k):
        with T.sblock("index_guard"):
            vi, vj = T.axis.remap("SS", [i, j])
            assert A[vi, vj] >= T.{dtype}(0) - E[vj] and A[vi, vj] < E[vj], {message!r}
            B[vi, vj] = T.if_then_else(A[vi, vj] < T.{dtype}(0), A[vi, vj] + E[vj], A[vi, vj])
"""


def _guard_func(dtype: str, message: str) -> tirx.PrimFunc:
    """indices [m, k] and the extents [k] of the dims they index -> the indices made non-negative.

    Opaque to fusion (op_pattern 8: its assert stays in a kernel of its own) and scheduled as
    written, a serial loop over the index values (a few per token or row).
    """
    return tvm.script.from_source(_GUARD_SOURCE.format(dtype=dtype, message=message))


def _dims(expr: relax.Expr) -> list | None:
    """A tensor's dims, None where unknown (no shape, or a shape that is itself a run-time value)."""
    shape = getattr(expr.ty, "shape", None)
    return list(shape.values) if isinstance(shape, relax.ShapeExpr) else None


def _shown(dims: list) -> str:
    return "[" + ", ".join(str(int(d)) if isinstance(d, tirx.IntImm) else str(d) for d in dims) + "]"


def _guard(bb: relax.BlockBuilder, indices: relax.Expr, extents: list, node: tuple[str, str]) -> relax.Expr:
    """`indices` (last axis of length len(extents) when
    several dims are indexed) checked and made non-negative."""
    dtype = indices.ty.dtype.dtype
    shape = _dims(indices)
    k = len(extents)
    flat = bb.normalize(relax.op.reshape(indices, (-1, k)))
    bounds = bb.normalize(relax.op.shape_to_tensor(relax.ShapeExpr([tirx.Cast("int64", d) for d in extents])))
    if dtype != "int64":
        bounds = bb.normalize(relax.op.astype(bounds, dtype))
    op, name = node
    index_input = _NODE_INPUTS.get(name, ["", "?"])[1]
    message = (
        f"{GUARD_MARKER}: {op} node {name!r}: an index in {index_input!r} "
        f"is outside [-n, n) of the data dims n = {_shown(extents)}"
    )
    gv = bb.add_func(_guard_func(dtype, message), _GUARD_NAME)
    checked = bb.normalize(relax.call_tir(gv, (flat, bounds), relax.TensorType(_dims(flat), dtype)))
    target = relax.ShapeExpr(shape) if shape is not None else relax.op.shape_of(indices)
    return bb.normalize(relax.op.reshape(checked, target))


def _needs_guard(indices: relax.Expr, extents: list) -> bool:
    """Indices known only at run time, or constants into a dim whose size only the run decides (index 0 of
    a sequence fed empty). ONNX types indices int32/int64: no unsigned index reaches a guard."""
    if isinstance(indices, relax.ShapeExpr) or indices.ty.dtype.dtype.startswith("uint"):
        return False
    constant = isinstance(indices, tvm.ir.GenericConst)
    return not constant or not all(isinstance(e, tirx.IntImm) for e in extents)


def _non_negative_const(indices: tvm.ir.GenericConst, extent: tirx.PrimExpr) -> tvm.ir.GenericConst:
    """Constant indices into a dim of static size, the negative ones counted from its end (ONNX's rule,
    applied here so that `_drop_known_normalization` removes the converter's run-time version)."""
    values = indices.value.numpy()
    if not (values < 0).any() or not isinstance(extent, tirx.IntImm):
        return indices
    return relax.const(np.where(values < 0, values + extent.value, values).astype(values.dtype))


def _node(op: str, attr: dict) -> tuple[str, str]:
    """(op, node name) of the node being converted; names are kept to characters a message can quote."""
    return op, _quotable(attr.get("tvm_custom", {}).get("name") or "?")


def _quotable(name: str) -> str:
    return re.sub(r"[^0-9A-Za-z_./:-]", "_", name)


def _describe(op: str, attr: dict) -> str:
    return "{} node {!r}".format(*_node(op, attr))


# -- operand sizes Relax cannot relate ------------------------------------------------------
#
# An ONNX Slice of a table by a run-time length (transformers' position ids,
# `position_ids[:, :seq]`) has the size `min(seq, 64)`: the end is clamped to the
# table, as ONNX says. Added to a `[batch, seq, 64]` tensor, Relax cannot tell
# whether `min(seq, 64)` broadcasts against `seq` or equals it, so the `add` keeps
# an unknown shape: every shape computation after it is a run-time `shape_of`, and
# the build fails ("CodeGenVM cannot emit this Relax operator directly"). So do an
# FPN's upsampled map (`2 * ((h - 1) // 32 + 1)`) concatenated with or added to its
# skip connection (`(h - 1) // 16 + 1`), which are equal only where h is a multiple
# of 32, and a YOLO head's anchors against its predictions.
#
# onnxruntime checks such sizes when it runs. So do we: each operand whose size
# Relax cannot prove to be the result's goes through a size check, a copy kernel of
# its own to the result's shape that asserts the sizes match (or that the operand's
# is 1, where the op broadcasts): a mismatch raises a typed error naming the node, as
# onnxruntime does, instead of reading past the data. (A Relax `match_cast` says the
# same, but TVM 0.27 recurses without end on it in FuseTIR and other passes: a segfault.)

_ANALYZER = sym.Analyzer()


def _clamp_of(dim: tirx.PrimExpr, other: tirx.PrimExpr) -> bool:
    """Whether `dim` is `min(other, c)` (either order) with a constant c > 1."""
    if not isinstance(dim, tirx.Min):
        return False
    for size, bound in ((dim.a, dim.b), (dim.b, dim.a)):
        if isinstance(bound, tirx.IntImm) and int(bound) > 1 and _ANALYZER.can_prove_equal(size, other):
            return True
    return False


#: what a failed size check says, after the node (the session reports it as the kernel's error)
SIZE_CHECK_MESSAGE = (
    "nxrt-size-check: {node}: operand sizes that must match (or be 1 where the op broadcasts) differ "
    "at run time, as onnxruntime refuses them too: a size clamped to a table's length (a Slice by a "
    "run-time length) means the input is too long for this model; an upsampled map against a skip "
    "connection means the input's height or width is not a multiple of the model's stride"
)


def _size_check(rank: int, dtype: str, broadcast: tuple[bool, ...], node: str) -> tirx.PrimFunc:
    """A copy of an [a0..] tensor to [b0..] that asserts a_i == b_i, or a_i == 1 on the axes that
    `broadcast` (read at index 0 there). Opaque to fusion (its assert stays in a kernel of its own)."""
    ins = [f"a{k}" for k in range(rank)]
    outs = [f"b{k}" for k in range(rank)]
    loops = [f"i{k}" for k in range(rank)]
    axes = [f"v{k}" for k in range(rank)]
    same = " and ".join(
        f"({a} == {b} or {a} == 1)" if wide else f"{a} == {b}" for a, b, wide in zip(ins, outs, broadcast)
    )
    read = [
        f"T.if_then_else({a} == 1, T.int64(0), {v})" if wide else v
        for a, v, wide in zip(ins, axes, broadcast)
    ]
    source = "\n".join(
        [
            "@T.prim_func(private=True, s_tir=True)",
            "def size_check(a: T.handle, b: T.handle):",
            '    T.func_attr({"tirx.noalias": True, "op_pattern": 8, "tirx.is_scheduled": True,'
            ' "nxrt.schedule_rule": "SizeCheck"})',
            *(f"    {d} = T.int64()" for d in ins + outs),
            f"    A = T.match_buffer(a, ({', '.join(ins)},), {dtype!r})",
            f"    B = T.match_buffer(b, ({', '.join(outs)},), {dtype!r})",
            f"    assert {same or 'True'}, {SIZE_CHECK_MESSAGE.format(node=node)!r}",
            f"    for {', '.join(loops)} in T.grid({', '.join(outs)}):",
            '        with T.sblock("size_check"):',
            f"            {', '.join(axes)} = T.axis.remap({'S' * rank!r}, [{', '.join(loops)}])",
            f"            B[{', '.join(axes)}] = A[{', '.join(read)}]",
        ]
    )
    return tvm.script.from_source(source)


def _is_one(dim: tirx.PrimExpr) -> bool:
    return isinstance(dim, tirx.IntImm) and int(dim) == 1


def _never_one(dim: tirx.PrimExpr) -> bool:
    """Whether `dim` cannot be 1 (a constant > 1, `2 * h`): an operand of that size fixes the result's."""
    return _ANALYZER.can_prove(tirx.NE(dim, tirx.IntImm(str(dim.ty.dtype), 1)))


def _result_size(dims: list, broadcast: bool) -> tirx.PrimExpr:
    """The size operands of sizes `dims` (not all provably equal) give the result wherever the op is valid.

    Without broadcasting any operand's. With it, a size that cannot be 1 (the others must equal it or be 1),
    or `n` against `min(n, c)` (1 only where `n` is); else ONNX's rule as an expression, the first size that
    is not 1 (`select(a == 1, b, a)`)."""
    if not broadcast:
        return dims[0]
    for dim in dims:
        if _never_one(dim):
            return dim
    for dim in dims:
        if all(_ANALYZER.can_prove_equal(d, dim) or _clamp_of(d, dim) for d in dims):
            return dim
    size = dims[0]
    for dim in dims[1:]:
        size = tirx.Select(tirx.EQ(size, tirx.IntImm(str(size.ty.dtype), 1)), dim, size)
    return size


def _resolve_sizes(
    bb: relax.BlockBuilder, inputs: list, node: str, broadcast: bool = True, axis: int | None = None
) -> list:
    """`inputs` with every operand whose size on an axis Relax cannot prove equal to the others' (so the op's
    result shape would be unknown and its build fail) checked at run time and cast to the result's size
    (`_size_check`). `axis` (Concat's) is left as it is; without `broadcast` sizes must be equal."""
    shapes = [
        _dims(x) if isinstance(x, relax.Expr) and isinstance(x.ty, relax.TensorType) else None for x in inputs
    ]
    ranked = [s for s in shapes if s is not None]
    if len(ranked) < 2:
        return inputs
    rank = max(len(s) for s in ranked)
    skipped = None if axis is None else rank - axis % rank  # counted from the last axis, as below
    sizes: dict[int, tirx.PrimExpr] = {}
    for back in range(1, rank + 1):
        dims = [s[-back] for s in ranked if back <= len(s) and not (broadcast and _is_one(s[-back]))]
        if back == skipped or all(_ANALYZER.can_prove_equal(d, dims[0]) for d in dims[1:]):
            continue
        sizes[back] = _result_size(dims, broadcast)
    out = list(inputs)
    for i, shape in enumerate(shapes):
        if shape is None:
            continue
        resolved = list(shape)
        for back, size in sizes.items():
            if back <= len(shape) and not (broadcast and _is_one(shape[-back])):
                if not _ANALYZER.can_prove_equal(shape[-back], size):
                    resolved[-back] = size
        if any(not r.same_as(d) for r, d in zip(resolved, shape)):
            wide = tuple(broadcast and not r.same_as(d) for r, d in zip(resolved, shape))
            out[i] = _checked_as(bb, inputs[i], resolved, wide, node)
    return out


def _checked_as(bb: relax.BlockBuilder, data: relax.Expr, resolved: list, wide: tuple[bool, ...], node: str):
    """`data` as a tensor of shape `resolved`, checked when it runs to have that shape (`_size_check`;
    `wide`: axes where a size of 1 broadcasts to it)."""
    dtype = str(data.ty.dtype.dtype)
    check = bb.add_func(_size_check(len(resolved), dtype, wide, node), "nxrt_size_check")
    return bb.normalize(relax.call_tir(check, (data,), relax.TensorType(resolved, dtype)))


def _sizes_resolved(base: type, broadcast: bool = True, op: str | None = None) -> type:
    """`base`'s converter (of ONNX's `op`, by default its name) with operand sizes Relax cannot relate
    checked at run time (`_resolve_sizes`)."""
    node_op = op or base.__name__

    def convert(impl):
        @classmethod
        def _impl(cls, bb, inputs, attr, params):
            axis = None if broadcast else int(attr.get("axis", 0))
            resolved = _resolve_sizes(bb, list(inputs), _describe(node_op, attr), broadcast, axis)
            return impl.__func__(cls, bb, resolved, attr, params)

        return _impl

    return _override(base, convert)


def _guarded_along_axis(base: type, op: str) -> type:
    """`base`'s converter with input 1 (indices into data's `axis`) guarded when it is not a constant."""

    def convert(impl):
        @classmethod
        def _impl(cls, bb, inputs, attr, params):
            data, indices = inputs[0], inputs[1]
            dims = (
                [tirx.IntImm("int64", len(data.values))] if isinstance(data, relax.ShapeExpr) else _dims(data)
            )
            axis = int(attr.get("axis", 0)) % len(dims) if dims else None
            if _needs_guard(indices, [dims[axis]] if dims else [None]):
                if not dims:
                    raise ValueError(f"{_describe(op, attr)}: the index guard needs the rank of the data")
                inputs = list(inputs)
                inputs[1] = _guard(bb, indices, [dims[axis]], _node(op, attr))
            elif isinstance(indices, tvm.ir.GenericConst) and dims:
                inputs = list(inputs)
                inputs[1] = _non_negative_const(indices, dims[axis])
            return impl.__func__(cls, bb, inputs, attr, params)

        return _impl

    return _override(base, convert)


def _guarded_nd(base: type, op: str) -> type:
    """`base`'s converter with input 1 (coordinates into data's dims after `batch_dims`) guarded."""

    def convert(impl):
        @classmethod
        def _impl(cls, bb, inputs, attr, params):
            data, indices = inputs[0], inputs[1]
            dims, index_dims = _dims(data), _dims(indices)
            bounded = dims and index_dims and isinstance(index_dims[-1], tirx.IntImm)
            start = int(attr.get("batch_dims", 0))
            extents = dims[start : start + int(index_dims[-1])] if bounded else [None]
            if _needs_guard(indices, extents):
                if not bounded:
                    raise ValueError(
                        f"{_describe(op, attr)}: the index guard needs the "
                        "data's rank and a static last dim of the indices"
                    )
                inputs = list(inputs)
                inputs[1] = _guard(bb, indices, extents, _node(op, attr))
            return impl.__func__(cls, bb, inputs, attr, params)

        return _impl

    return _override(base, convert)


def _override(base: type, convert) -> type:
    """A subclass of TVM's converter `base` whose every `_impl_vN` is `convert(base._impl_vN)`."""
    impls = {n: convert(getattr(base, n)) for n in dir(base) if n.startswith("_impl_v")}
    return type(f"Nxrt{base.__name__}", (base,), impls)


#: a Slice end at least this large means "to the end": torch writes INT64_MAX, tf2onnx INT32_MAX, jax2tf
#: 10**9 for its masked slices. A symbolic axis is taken to be shorter (10**9 float32 elements on one axis
#: are 4 GB); a static one is compared.
_TO_THE_END = 10**9


class _Slice(onnx_frontend.Slice):
    """TVM's Slice, never assuming symbolic bounds are inside the data (ONNX clamps them), and without
    ends that mean "to the end" (`_TO_THE_END`; torch's `x[:, a:]`): an axis sliced whole is not sliced,
    another of a static size ends at that size. TVM's bound analysis reads INT64_MAX as +infinity, and a
    convolution over such a slice of a symbolic dim failed to build ("Check failed: y != kPosInf";
    Silero VAD's STFT, bisected in every session); an INT32_MAX end left a symbolic batch as
    `min(2147483647, n)`, which FuseTIR then found in two forms for one tensor ("Inconsistent buffers
    ... mapped to the same relax var"; Magika's GELU, bisected in its symbolic build)."""

    @classmethod
    def _impl_v13(cls, bb, inputs, attr, params):
        out = onnx_frontend.Slice._impl_v13.__func__(cls, bb, inputs, attr, params)
        if not (isinstance(out, relax.Call) and out.op.name == "relax.strided_slice"):
            return out
        data, axes, begin, end, strides = out.args
        dims = _dims(data)
        if dims is None or not all(isinstance(t, relax.Tuple) for t in (axes, begin, end)):
            return relax.op.strided_slice(data, axes, begin, end, strides, assume_inbound=False)
        steps = [1] * len(end.fields) if strides is None else [_int(s) for s in strides.fields]
        kept = []  # (axis, begin, end, step) of the axes the slice changes
        for axis, b, e, step in zip(axes.fields, begin.fields, end.fields, steps):
            dim, last = dims[_int(axis)], _int(e)
            static = isinstance(dim, tirx.IntImm)
            if last is not None and last >= _TO_THE_END and step == 1 and not (static and int(dim) > last):
                if _int(b) == 0:
                    continue  # the whole axis
                if static:
                    e = dim
            kept.append((axis, b, e, step))
        if not kept:
            return data
        axes_, begin_, end_, steps_ = zip(*kept)
        return relax.op.strided_slice(
            data, list(axes_), list(begin_), list(end_), None if strides is None else list(steps_)
        )


def _int(value: object) -> int | None:
    """A constant integer (None where it is symbolic)."""
    return int(value) if isinstance(value, tirx.IntImm) else None


#: elementwise comparisons and logic, which broadcast as Add does (jax2tf's one-hot: Equal of an iota
#: and the labels, sizes Relax cannot relate)
_COMPARISONS = ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor")


class _Concat(onnx_frontend.Concat):
    """TVM's Concat, taking a shape value among integer tensors: our Cast keeps a shape a shape across an
    integer cast, and jax2tf concatenates one with int32 constants into a Reshape's shape (Magika's
    BroadcastTo), which TVM's Concat refuses ("expects the input to be a Tuple of Tensors"). With
    constant vectors the result is a shape value too (what a Reshape needs); with computed tensors, a
    tensor of their dtype."""

    @classmethod
    def _impl_v13(cls, bb, inputs, attr, params):
        if not any(isinstance(x, relax.ShapeExpr) for x in inputs):
            return onnx_frontend.Concat._impl_v13.__func__(cls, bb, inputs, attr, params)
        if all(isinstance(x, relax.ShapeExpr) or _int_vector(x) is not None for x in inputs):
            values = []
            for x in inputs:
                values.extend(x.values if isinstance(x, relax.ShapeExpr) else _int_vector(x))
            return relax.ShapeExpr(values)
        dtype = next(x.ty.dtype for x in inputs if not isinstance(x, relax.ShapeExpr))
        tensors = [
            bb.normalize(relax.op.astype(relax.op.shape_to_tensor(x), dtype))
            if isinstance(x, relax.ShapeExpr)
            else x
            for x in inputs
        ]
        return onnx_frontend.Concat._impl_v13.__func__(cls, bb, tensors, attr, params)


def _int_vector(x: relax.Expr) -> list[int] | None:
    """A 1-D integer constant's values (None for anything else)."""
    if (
        not isinstance(x, tvm.ir.GenericConst)
        or x.ty.ndim != 1
        or not str(x.ty.dtype).startswith(("int", "uint"))
    ):
        return None
    return [int(v) for v in x.value.numpy()]


class _Cast(onnx_frontend.Cast):
    """TVM's Cast, keeping a shape value a shape value across an integer cast (Paddle's exports cast every
    Shape to int32 and back before Reshape): TVM's turns a symbolic shape into a tensor, and a Reshape
    fed by it cannot be built ("Reshape requires the input new shape to be Shape")."""

    @classmethod
    def _impl_v13(cls, bb, inputs, attr, params):
        to = onnx_frontend.get_type(attr["to"])
        if isinstance(inputs[0], relax.ShapeExpr) and to in ("int32", "int64"):
            return inputs[0]
        return onnx_frontend.Cast._impl_v13.__func__(cls, bb, inputs, attr, params)


class _Dropout(onnx_frontend.Dropout):
    """Inference Dropout (the rule rejects a training_mode that is not a constant false): the data, and
    the mask all true, as ONNX defines them. TVM's is `R.nn.dropout`, a tuple its layout conversion fails
    on ("Expected nested to match tuple"), which kept every convolution of SqueezeNet between
    transposes; its mask came back float32."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        return relax.Tuple([inputs[0], relax.op.ones_like(inputs[0], "bool")])

    _impl_v12 = _impl_v1


def _unit_axes_checked(bb: relax.BlockBuilder, data, axes, node: str):
    """`data` with the symbolic extents of `axes` checked to be 1 at run time (`_size_check`), so they
    are 1 to Relax: a Squeeze of them builds, and a size other than 1 raises naming the node, as
    onnxruntime refuses it."""
    dims = _dims(data) if isinstance(data, relax.Expr) and isinstance(data.ty, relax.TensorType) else None
    if dims is None or axes is None:
        return data
    squeezed = {int(a) % len(dims) for a in axes}
    resolved = [
        tirx.IntImm(str(d.ty.dtype), 1) if i in squeezed and not isinstance(d, tirx.IntImm) else d
        for i, d in enumerate(dims)
    ]
    if all(r.same_as(d) for r, d in zip(resolved, dims)):
        return data
    return _checked_as(bb, data, resolved, (False,) * len(dims), node)


class _Squeeze(onnx_frontend.Squeeze):
    """TVM's Squeeze, with axes of symbolic extent checked to be 1 when it runs (TVM's refuses them:
    "cannot be proven to be 1 at import time"; Paddle's recognisers squeeze their collapsed height)."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        axes = attr.get("axes")
        return cls._squeeze(bb, _unit_axes_checked(bb, inputs[0], axes, _describe("Squeeze", attr)), axes)

    @classmethod
    def _impl_v13(cls, bb, inputs, attr, params):
        axes = onnx_frontend.get_constant(inputs[1], params) if len(inputs) > 1 else None
        if isinstance(axes, tvm.ir.GenericConst):
            axes = tuple(int(x) for x in axes.value.numpy())
        elif axes is not None:
            return onnx_frontend.Squeeze._impl_v13.__func__(cls, bb, inputs, attr, params)  # data-dependent
        data = _unit_axes_checked(bb, inputs[0], axes, _describe("Squeeze", attr))
        return cls._squeeze(bb, data, axes)


class _Range(onnx_frontend.Range):
    """TVM's Range, with the length of an integer range over a size (`Range(0, seq, 1)`, transformers'
    position ids) as an expression of that size. TVM's own converter reads the length back from a tensor
    into a fresh `range_len` var, which nothing relates to `seq`: a later `[batch, seq] + [range_len]`
    then fails to build ("range_len ... has not been computed")."""

    @classmethod
    def _impl_v12(cls, bb, inputs, attr, params):
        start, limit, delta = (_scalar(onnx_frontend.get_constant(x, params)) for x in inputs)
        if isinstance(start, int) and isinstance(delta, int) and delta > 0 and tvm.ir.is_prim_expr(limit):
            dtype = str(inputs[0].value.numpy().dtype)
            length = _ANALYZER.simplify(
                tirx.max(tirx.floordiv(tirx.Cast("int64", limit) - start + delta - 1, delta), 0)
            )
            positions = bb.normalize(relax.op.arange(0, length, 1, "int64"))
            if delta != 1:
                positions = bb.normalize(relax.op.multiply(positions, relax.const(delta, "int64")))
            if start != 0:
                positions = bb.normalize(relax.op.add(positions, relax.const(start, "int64")))
            return positions if dtype == "int64" else relax.op.astype(positions, dtype)
        return onnx_frontend.Range._impl_v12.__func__(cls, bb, inputs, attr, params)


def _scalar(x):
    """A constant one-element input as a Python int (others as they are)."""
    if isinstance(x, tvm.ir.GenericConst) and x.value.numpy().size == 1:
        value = x.value.numpy().reshape(-1)[0]
        return int(value) if np.issubdtype(value.dtype, np.integer) else x
    return x


class _BitShift(onnx_frontend.BitShift):
    """TVM's BitShift, defined for every shift amount: LLVM's shifts are undefined (poison) for amounts
    outside [0, bits), and AVX2 code returned 4 for int8 4 >> 9. Out of range, a left shift gives 0 and a
    right shift the sign fill (0 or -1), as ONNX (opset 28 adds signed types) and onnxruntime define."""

    @classmethod
    def _impl_v11(cls, bb, inputs, attr, params):
        x, y = inputs
        if all(isinstance(i, tvm.ir.GenericConst) for i in inputs):  # folded in numpy by TVM's converter
            return onnx_frontend.BitShift._impl_v11.__func__(cls, bb, inputs, attr, params)
        dtype = x.ty.dtype.dtype
        bits, signed = tvm.DataType(dtype).bits, dtype.startswith("int")
        right = attr.get("direction", b"LEFT").decode("ascii") == "RIGHT"
        in_range = relax.op.less(y, relax.const(bits, dtype))
        if signed:
            in_range = relax.op.logical_and(in_range, relax.op.greater_equal(y, relax.const(0, dtype)))
        amount = relax.op.where(in_range, y, relax.const(0, dtype))
        shifted = (relax.op.right_shift if right else relax.op.left_shift)(x, amount)
        fill = (
            relax.op.right_shift(x, relax.const(bits - 1, dtype))
            if right and signed
            else relax.op.zeros_like(x)
        )
        return relax.op.where(in_range, shifted, fill)


#: every integer of magnitude below this is exact in float32
_FLOAT32_EXACT = 1 << 24


def exact_in_float32(depth: object, bound_a: int | None, bound_b: int | None) -> bool:
    """Whether every partial sum of `depth` products of integers of magnitude at most `bound_a` and
    `bound_b` is an integer float32 holds exactly (None: unbounded)."""
    if bound_a is None or bound_b is None:
        return False
    depth = depth.value if isinstance(depth, tirx.IntImm) else depth
    return isinstance(depth, int) and depth * bound_a * bound_b < _FLOAT32_EXACT


def _dtype(x: relax.Expr | None) -> str:
    return x.ty.dtype.dtype if x is not None and hasattr(x.ty, "dtype") else ""


def _value_range(x: relax.Expr | None) -> tuple[int, int] | None:
    """The smallest and largest value of an integer operand: a constant's own, else its type's; None
    for a wider type (only 8- and 16-bit integers are bounded here)."""
    if x is None:
        return 0, 0
    if isinstance(x, tvm.ir.GenericConst):
        values = x.value.numpy()
        return (int(values.min()), int(values.max())) if values.size else (0, 0)
    dtype = _dtype(x)
    if dtype not in ("int8", "uint8", "int16", "uint16"):
        return None
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def _difference_bound(x: relax.Expr, zero_point: relax.Expr | None) -> int | None:
    """The largest |x - zero_point| over the operand's range."""
    values, zeros = _value_range(x), _value_range(zero_point)
    if values is None or zeros is None:
        return None
    return max(abs(values[0] - zeros[1]), abs(values[1] - zeros[0]))


def _u8_by_s8_weights(a, b, a_zero, b_zero) -> bool:
    """uint8 activations by constant 2-D int8 weights, no weight zero point, one activation zero point."""
    no_b_zero = b_zero is None or (isinstance(b_zero, tvm.ir.GenericConst) and not b_zero.value.numpy().any())
    zero_dims = _dims(a_zero) if a_zero is not None else []
    one_a_zero = zero_dims is not None and all(isinstance(d, tirx.IntImm) and d.value == 1 for d in zero_dims)
    return (
        _dtype(a) == "uint8"
        and _dtype(b) == "int8"
        and isinstance(b, tvm.ir.GenericConst)
        and len(b.value.shape) == 2
        and no_b_zero
        and one_a_zero
    )


class _MatMulInteger(onnx_frontend.MatMulInteger):
    """MatMulInteger as 8-bit operands for `lower.integer_matmul`, else in float32 where that is exact
    (see the module docstring)."""

    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        a, b, a_zero, b_zero = [*inputs, None, None][:4]
        if _u8_by_s8_weights(a, b, a_zero, b_zero):
            product = relax.op.matmul(a, b, out_dtype="int32")
            if a_zero is None:
                return product
            sums = relax.const(b.value.numpy().astype(np.int32).sum(axis=0))  # sum_k b[k, j]
            zero = relax.op.reshape(relax.op.astype(a_zero, "int32"), ())
            return relax.op.subtract(product, relax.op.multiply(zero, sums))
        product = super()._impl_v10(bb, inputs, attr, params)  # matmul(a - a_zp, b - b_zp) in int32
        dims = _dims(a)
        depth = dims[-1] if dims else None
        if not exact_in_float32(depth, _difference_bound(a, a_zero), _difference_bound(b, b_zero)):
            return product
        a, b = (relax.op.astype(operand, "float32") for operand in product.args)
        return relax.op.astype(relax.op.matmul(a, b, out_dtype="float32"), "int32")


class _Recurrent(onnx_frontend.OnnxOpConverter):
    """ONNX LSTM and GRU (layout 0, default activations; the claim rule sees to the rest): every step's
    input projection as one matmul (constant weights prepacked), the biases that add to it folded in,
    then the recurrence as one kernel (`recurrence`)."""

    cell = ""

    @classmethod
    def _impl_v7(cls, bb, inputs, attr, params):
        x, w, r = inputs[0], inputs[1], inputs[2]
        bias = inputs[3]
        lstm = cls.cell == "LSTM"
        spec = Recurrence(
            cls.cell,
            attr.get("direction", b"forward").decode(),  # TVM's attribute parser gives strings as bytes
            int(_dims(r)[-1]),  # R's static [D, gates * H, H]; the attribute is optional
            bool(attr.get("linear_before_reset", 0)) and not lstm,
        )
        d, h, width = spec.directions, spec.hidden, spec.gates * spec.hidden
        dtype = x.ty.dtype.dtype
        steps, batch, depth = _dims(x)
        weights = relax.op.reshape(relax.op.permute_dims(w, [2, 0, 1]), (depth, d * width))
        projected = relax.op.matmul(relax.op.reshape(x, (-1, depth)), weights)  # [S * N, D * gates * H]
        extra = []
        if bias is not None:
            w_bias = relax.op.strided_slice(bias, axes=[1], begin=[0], end=[width])
            r_bias = relax.op.strided_slice(bias, axes=[1], begin=[width], end=[2 * width])
            if spec.linear_before_reset:  # R's h-gate bias is added before the reset gate multiplies
                keep = np.concatenate([np.ones(2 * h), np.zeros(h)]).astype(dtype)
                extra = [relax.op.strided_slice(bias, axes=[1], begin=[width + 2 * h], end=[2 * width])]
                r_bias = relax.op.multiply(r_bias, relax.const(keep))
            folded = relax.op.reshape(relax.op.add(w_bias, r_bias), (d * width,))
            projected = relax.op.add(projected, folded)
        elif spec.linear_before_reset:
            extra = [relax.op.zeros(relax.ShapeExpr([d, h]), dtype)]
        gates = bb.normalize(relax.op.reshape(projected, relax.ShapeExpr([steps, batch, d, width])))
        state = relax.ShapeExpr([d, batch, h])
        initial = [
            inputs[5] if inputs[5] is not None else relax.op.zeros(state, dtype),
            *([inputs[6] if inputs[6] is not None else relax.op.zeros(state, dtype)] if lstm else extra),
        ]
        outputs = [relax.TensorType([steps, d, batch, h], dtype)]
        outputs += [relax.TensorType([d, batch, h], dtype)] * (2 if lstm else 1)
        kernel = bb.add_func(recurrence_kernel(spec), f"recurrence_{cls.cell.lower()}")
        recurrent = bb.normalize(relax.op.permute_dims(r, [0, 2, 1]))
        args = [gates, recurrent, *(bb.normalize(a) for a in initial)]
        return bb.normalize(relax.call_tir(kernel, args, outputs))


class _LSTM(_Recurrent):
    cell = "LSTM"


class _GRU(_Recurrent):
    cell = "GRU"


def _pairwise(base: type) -> type:
    """`base` (a TVM variadic elementwise converter) folding tensor inputs pairwise, never stacking them."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        if all(isinstance(i, tvm.ir.GenericConst) for i in inputs):  # folded in numpy by TVM's converter
            return base._impl_v1.__func__(cls, bb, inputs, attr, params)
        return cls._impl_dynamic(bb, inputs)

    return type(f"Nxrt{base.__name__}", (base,), {"_impl_v1": _impl_v1})


class _Clip(onnx_frontend.Clip):
    """TVM's Clip with Relax maximum/minimum (layout-aware, fusible) instead of TE kernels."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        x = inputs[0]
        dtype = x.ty.dtype.dtype
        lo, hi = float(attr.get("min", -np.inf)), float(attr.get("max", np.inf))
        return relax.op.minimum(relax.op.maximum(x, relax.const(lo, dtype)), relax.const(hi, dtype))

    @classmethod
    def _impl_v11(cls, bb, inputs, attr, params):
        x = inputs[0]
        inputs = [*inputs, None, None][:3]
        if inputs[1] is not None:
            x = bb.normalize(relax.op.maximum(x, cls._sanitize_nan_clip_bound(bb, inputs[1], for_min=True)))
        if inputs[2] is not None:
            x = bb.normalize(relax.op.minimum(x, cls._sanitize_nan_clip_bound(bb, inputs[2], for_min=False)))
        return x

    _impl_v13 = _impl_v11


def _is_empty_const(expr: relax.Expr | None) -> bool:
    return isinstance(expr, tvm.ir.GenericConst) and expr.value.numpy().size == 0


class _Resize(onnx_frontend.Resize):
    """TVM's Resize-18 for Resize 11 and 13: same inputs (X, roi, scales, sizes) and attributes, less
    the three 18 added (their defaults are the earlier behaviour). Resize 11's coordinate mode
    tf_half_pixel_for_nn, removed in 13, is declined by the claim rule.

    Whole-number scales (an FPN's 2x upsampling) give integer sizes: TVM sizes a symbolic axis
    `int64(2.0f * float32(h))`, which Relax cannot relate to `h` (the skip connection it is added to
    then has a size Relax cannot prove equal, see `_resolve_sizes`); `2 * h` is the same for every h
    below 2**24, the sizes that scale is also computed from."""

    @classmethod
    def _impl_v11(cls, bb, inputs, attr, params):
        inputs = list(inputs)
        if len(inputs) > 3 and _is_empty_const(inputs[2]):  # Resize-11's scales is required: empty with sizes
            inputs[2] = None
        return cls._impl_v18(bb, inputs, attr, params)

    _impl_v13 = _impl_v11

    @classmethod
    def _impl_v18(cls, bb, inputs, attr, params):
        inputs = list(inputs)
        scales = onnx_frontend.get_constant(inputs[2], params) if len(inputs) > 2 else None
        if isinstance(scales, tvm.ir.GenericConst):
            values = scales.value.numpy()
            if values.size and np.all(values >= 1) and np.all(values == np.round(values)):
                inputs[2] = relax.ShapeExpr([int(v) for v in values])  # TVM's converter takes these as ints
        return onnx_frontend.Resize._impl_v18.__func__(cls, bb, inputs, attr, params)


def _short_input_fill(n, kernel: int, stride: int, pads: int):
    """How much to extend an axis so that floor division gives onnxruntime's output size.

    onnxruntime sizes a pool's output as trunc((n + pads - kernel) / stride) + 1; ONNX and TVM floor it. They
    differ only where the input is shorter than the window (n + pads < kernel): onnxruntime pools the part
    that is there (a 1x1 image through PP-OCR's 2x2 max pools gives 1x1, TVM 0x0). floor((d + e) / s) equals
    trunc(d / s) for d < 0 when e = (-d) mod s, and e = 0 for d >= 0."""
    return sym.Analyzer().simplify(tirx.floormod(tirx.max(kernel - pads - n, 0), stride))


def _is_zero(dim) -> bool:
    return isinstance(dim, tirx.IntImm) and dim.value == 0


def _pool_like_onnxruntime(base: type) -> type:
    """TVM's pool converter sized as onnxruntime sizes it on inputs shorter than the window.

    Where an axis may need extending, the input is extended by the missing part: with the lowest value for
    MaxPool, with zeros for AveragePool counting pads (onnxruntime divides by the whole window there), and
    for AveragePool not counting pads, zeros divided by the pooled mask of what is data. The extension is
    a copy of the input (a concat per pool whose strided axis is symbolic; conv1d_audio at 16000 samples
    measured 3% slower): TVM's ceil mode, which would need none, cannot size symbolic dims."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        x = inputs[0]
        auto_pad = attr.get("auto_pad", b"NOTSET").decode("utf-8")
        kernel = list(attr.get("kernel_shape"))
        if auto_pad != "NOTSET" or attr.get("ceil_mode", 0):  # VALID has no pads; SAME_* is static
            return base._impl_v1.__func__(cls, bb, inputs, attr, params)
        pads = list(attr.get("pads", [0] * 2 * len(kernel)))
        strides = list(attr.get("strides", [1] * len(kernel)))
        dilations = list(attr.get("dilations", [1] * len(kernel)))
        shape = list(x.ty.shape)
        fills = [
            _short_input_fill(shape[2 + i], (k - 1) * d + 1, s, pads[i] + pads[len(kernel) + i])
            for i, (k, s, d) in enumerate(zip(kernel, strides, dilations))
        ]
        if all(_is_zero(f) for f in fills):
            return base._impl_v1.__func__(cls, bb, inputs, attr, params)
        dtype = x.ty.dtype.dtype
        average = cls.name == "avg_pool"
        lowest = (
            0.0
            if average
            else float(np.finfo(dtype).min if dtype.startswith("float") else np.iinfo(dtype).min)
        )

        def extended(value, fill_value):
            dims = list(value.ty.shape)
            for i, fill in enumerate(fills):
                if not _is_zero(fill):
                    tail = dims[: 2 + i] + [fill] + dims[3 + i :]
                    pad = relax.op.full(relax.ShapeExpr(tail), relax.const(fill_value, dtype), dtype)
                    value = bb.normalize(relax.op.concat([value, pad], axis=2 + i))
                    dims = list(value.ty.shape)
            return value

        if not average or attr.get("count_include_pad", 0):
            return base._impl_v1.__func__(
                cls, bb, [extended(x, lowest)], {**attr, "count_include_pad": 1}, params
            )
        counted = {**attr, "count_include_pad": 1}
        total = bb.normalize(base._impl_v1.__func__(cls, bb, [extended(x, 0.0)], counted, params))
        ones = relax.op.full(relax.ShapeExpr([1, 1, *shape[2:]]), relax.const(1.0, dtype), dtype)
        present = bb.normalize(
            base._impl_v1.__func__(cls, bb, [extended(bb.normalize(ones), 0.0)], counted, params)
        )
        return relax.op.divide(total, present)

    return type(f"Nxrt{base.__name__}", (base,), {"_impl_v1": _impl_v1})


_OVERRIDES: dict[str, type] = {
    "Slice": _Slice,
    "Cast": _Cast,
    "Dropout": _Dropout,
    "Squeeze": _Squeeze,
    "Range": _Range,
    "Resize": _Resize,
    "Clip": _Clip,
    "BitShift": _BitShift,
    "MatMulInteger": _MatMulInteger,
    "LSTM": _LSTM,
    "GRU": _GRU,
    **{op: _pool_like_onnxruntime(getattr(onnx_frontend, op)) for op in ("MaxPool", "AveragePool")},
    **{
        op: _guarded_along_axis(getattr(onnx_frontend, op), op)
        for op in ("Gather", "GatherElements", "Scatter", "ScatterElements")
    },
    **{op: _guarded_nd(getattr(onnx_frontend, op), op) for op in ("GatherND", "ScatterND")},
    **{op: _pairwise(getattr(onnx_frontend, op)) for op in ("Max", "Min", "Sum", "Mean")},
    **{
        op: _sizes_resolved(getattr(onnx_frontend, op))
        for op in ("Add", "Sub", "Mul", "Div", "Pow", "Where", *_COMPARISONS)
    },
    "Concat": _sizes_resolved(_Concat, broadcast=False, op="Concat"),
}


#: op -> the earliest ONNX version whose semantics are those of TVM's lowest converter (every version from
#: it on differs only by added types, negative axes, optional inputs or attributes whose default is the old
#: behaviour: BatchNormalization-14's training_mode, Reshape-14's allowzero). From the ONNX changelog.
EARLIER_VERSIONS = {
    "BatchNormalization": 9,
    "Cast": 6,
    "Concat": 4,
    "Constant": 1,
    "Conv": 1,
    "Gemm": 9,
    "LRN": 1,
    "MatMul": 1,
    "ReduceMean": 1,
    "Relu": 6,
    "Reshape": 5,
    "Shape": 1,
    "Sigmoid": 6,
    "Slice": 10,
    "Transpose": 1,
}


def _from_earlier(base: type, since: int) -> type:
    """`base` with its lowest implementation also registered for versions from `since` on."""
    versions = [int(n[len("_impl_v") :]) for n in dir(base) if n.startswith("_impl_v")]
    if since >= min(versions):
        return base
    lowest = inspect.getattr_static(base, f"_impl_v{min(versions)}")
    return type(f"Nxrt{base.__name__}", (base,), {f"_impl_v{since}": lowest})


_TVM_CONVERTERS = onnx_frontend._get_convert_map()
_OVERRIDES.update(
    {
        op: _from_earlier(_OVERRIDES.get(op) or _TVM_CONVERTERS[op], since)
        for op, since in EARLIER_VERSIONS.items()
    }
)
del _TVM_CONVERTERS


def convert_map() -> dict[str, type]:
    """Every op the import converts, to its converter class (TVM's, or ours where TVM's is unsafe)."""
    return {**onnx_frontend._get_convert_map(), **_OVERRIDES}


def min_opset(op_type: str) -> int:
    """The lowest opset a converter has an implementation for."""
    converter = convert_map()[op_type]
    return min(int(n[len("_impl_v") :]) for n in dir(converter) if n.startswith("_impl_v"))


_INSTALL = threading.Lock()
#: node name -> its input names, for the model being imported (messages name the indices' value)
_NODE_INPUTS: dict[str, list[str]] = {}


@contextlib.contextmanager
def _our_converters(model: onnx.ModelProto) -> Iterator[None]:
    with _INSTALL:
        saved = onnx_frontend._get_convert_map
        onnx_frontend._get_convert_map = lambda: {**saved(), **_OVERRIDES}
        _NODE_INPUTS.update({_quotable(n.name): [_quotable(i) for i in n.input] for n in model.graph.node})
        try:
            yield
        finally:
            onnx_frontend._get_convert_map = saved
            _NODE_INPUTS.clear()


@relax.expr_functor.mutator
class _KnownNormalization(relax.PyExprMutator):
    """TVM's converters count negative indices from the end at run time, ``where(i < 0, i + n, i)`` with
    ``n`` read from the data's shape, even where ``i`` cannot be negative: a constant made non-negative
    at import, or an index guard's output (which did it already). Each such ``where`` is ``i``, and the
    shape reads that fed it go with it (a seq-first torch export's three Gathers of q, k and v cost
    nine kernel calls for it)."""

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if call.op != _WHERE or len(call.args) != 3:
            return call
        cond, shifted, index = call.args
        less, add = self._bound(cond), self._bound(shifted)
        if (
            isinstance(less, relax.Call)
            and less.op == _LESS
            and less.args[0].same_as(index)
            and isinstance(add, relax.Call)
            and add.op == _ADD
            and add.args[0].same_as(index)
            and self._non_negative(index)
        ):
            return index
        return call

    def _bound(self, expr: relax.Expr) -> relax.Expr | None:
        return self.lookup_binding(expr) if isinstance(expr, relax.Var) else expr

    def _non_negative(self, index: relax.Expr) -> bool:
        value = self._bound(index)
        if isinstance(value, tvm.ir.GenericConst):
            return bool((value.value.numpy() >= 0).all())
        if isinstance(value, relax.Call) and value.op == _RESHAPE:  # the guard's output, reshaped back
            value = self._bound(value.args[0])
        return (
            isinstance(value, relax.Call)
            and value.op == _CALL_TIR
            and isinstance(value.args[0], tvm.ir.GlobalVar)
            and value.args[0].name_hint.startswith(_GUARD_NAME)
        )


_WHERE, _LESS, _ADD, _RESHAPE, _CALL_TIR = (
    tvm.ir.Op.get(f"relax.{name}") for name in ("where", "less", "add", "reshape", "call_tir")
)
_GUARD_NAME = "nxrt_index_guard"


def _drop_known_normalization(mod: tvm.IRModule) -> tvm.IRModule:
    mutator = _KnownNormalization(mod)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gv, mutator.visit_expr(func))
    return relax.transform.DeadCodeElimination()(mutator.builder_.get())


def import_onnx(model: onnx.ModelProto) -> tvm.IRModule:
    """Import a standalone partition model; weights become constants so the build can fold them."""
    opset = default_opset(model)
    # The frontend prints on failure and warns on every renamed input: keep both out of the user's output.
    with _our_converters(model), contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            mod = from_onnx(model, opset=opset, keep_params_in_input=False)
        except Exception as exc:
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CompileFailed(
                f"the Relax ONNX frontend rejected partition {model.graph.name!r}: {message}"
            ) from exc
    return _drop_known_normalization(mod)


@dataclass(frozen=True)
class GuardFailure:
    """What an index guard's failure message says."""

    node: str
    indices: str  #: the value the bad index is in
    extents: tuple[int | None, ...]  #: sizes of the dims indexed (None where symbolic)
    text: str


_GUARD_TEXT = re.compile(rf"{GUARD_MARKER}: (\w+ node '([^']*)': an index in '([^']*)' .* n = \[([^\]]*)\])")


def parse_guard_failure(message: str) -> GuardFailure | None:
    """The guard's record when `message` is an index guard's failure, else None."""
    found = _GUARD_TEXT.search(message)
    if not found:
        return None
    text, node, indices, dims = found.groups()
    extents = tuple(int(d) if d.strip().lstrip("-").isdigit() else None for d in dims.split(","))
    return GuardFailure(node, indices, extents, text)
