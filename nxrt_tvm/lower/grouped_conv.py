"""Grouped convolutions as one convolution per group, so each runs the conv rule's register tile.

A grouped conv reads input channel ``o // (O / g) * (C / g) + c``: the division
on the output channel keeps every default rule off it (AlexNet's two-group 5x5
conv ran 230 ms on dlight's reduction rule, 2 ms split in two). Split into
``g`` plain convolutions over channel slices and concatenated, with constant
weight slices folded at compile time, it is the conv rule's case. A pointwise
(1x1, stride 1) grouped conv with a constant weight, ShuffleNet's, is instead
one matmul batched over the groups (``W[g, o, c] @ x[n, g, c, h*w]``): one kernel, not a split, a concat and a
kernel per group. Depthwise convolutions (one input channel per group) keep
their own form: the conv rule tiles them directly.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.relax.dpl import is_op, rewrite_call, wildcard

from .fold_affine import constant_array
from .strict import own_pass

__all__ = ["SplitGroupedConv", "MAX_GROUPS", "conv2d_like"]

#: more groups than this stay one grouped conv (ResNeXt's 32 and ShuffleNet's 3 or 8 are split)
MAX_GROUPS = 64


def conv2d_like(call: relax.Call, data: relax.Expr, weight: relax.Expr, **changes) -> relax.Expr:
    """A conv2d with `call`'s strides, padding, dilation, groups, layouts and out dtype, less `changes`."""
    attrs = call.attrs
    kwargs = {
        "strides": attrs.strides,
        "padding": attrs.padding,
        "dilation": attrs.dilation,
        "groups": attrs.groups,
        "data_layout": attrs.data_layout,
        "kernel_layout": attrs.kernel_layout,
        "out_layout": attrs.out_layout,
        "out_dtype": attrs.out_dtype,
    }
    return relax.op.nn.conv2d(data, weight, **{**kwargs, **changes})


@relax.transform.function_pass(opt_level=0, name="nxrt_tvm.SplitGroupedConv")
class SplitGroupedConv:
    """``conv2d(x, W, groups=g)`` (NCHW/OIHW, 1 < g, several input channels per group) ->
    ``concat([conv2d(x_i, W_i) for i < g], axis=1)``, or a batched matmul where pointwise."""

    def __init__(self) -> None:
        self.pattern = is_op("relax.nn.conv2d")(wildcard(), wildcard())

    @own_pass
    def transform_function(self, func: relax.Function, _mod: tvm.IRModule, _ctx) -> relax.Function:
        if func.attrs is not None and "Primitive" in func.attrs and int(func.attrs["Primitive"]) != 0:
            return func
        return rewrite_call(self.pattern, self._split, func)

    def _split(self, call: relax.Call, _matches) -> relax.Expr:
        attrs = call.attrs
        groups = int(attrs.groups)
        data, weight = call.args
        shape = getattr(data.ty, "shape", None)
        if (
            groups == 1
            or groups > MAX_GROUPS
            or (attrs.data_layout, attrs.kernel_layout, attrs.out_layout) != ("NCHW", "OIHW", "NCHW")
            or shape is None
            or not isinstance(shape[1], tirx.IntImm)
            or int(shape[1]) == groups  # depthwise
        ):
            return call
        value = constant_array(weight)
        if value is not None and _pointwise(call, value):
            return _grouped_matmul(call, data, value, shape, groups)
        xs = relax.op.split(data, groups, axis=1)
        if value is not None:  # sliced here: constant weights stay constants, packed at compile time
            ws = [relax.const(np.ascontiguousarray(w)) for w in np.split(value, groups, axis=0)]
        else:
            split = relax.op.split(weight, groups, axis=0)
            ws = [relax.TupleGetItem(split, i) for i in range(groups)]
        convs = [conv2d_like(call, relax.TupleGetItem(xs, i), ws[i], groups=1) for i in range(groups)]
        return relax.op.concat(convs, axis=1)


def _pointwise(call: relax.Call, weight: np.ndarray) -> bool:
    """A float 1x1 conv that reads each pixel once (no stride or padding)."""
    attrs = call.attrs
    return (
        weight.shape[2:] == (1, 1)
        and all(int(s) == 1 for s in attrs.strides)
        and all(int(p) == 0 for p in attrs.padding)
        and call.args[0].ty.dtype in ("float32", "float16")
    )


def _grouped_matmul(call: relax.Call, data: relax.Expr, value: np.ndarray, shape, groups: int) -> relax.Expr:
    """A grouped 1x1 conv as one matmul batched over its groups, ``W[g, o, c] @ x[n, g, c, h*w]``: the
    matmul rule's tile, without a split, a concat and a kernel per group around it."""
    n, c, h, w = shape
    o = value.shape[0]
    x = relax.op.reshape(data, (n, groups, int(c) // groups, h * w))
    weight = relax.const(np.ascontiguousarray(value.reshape(groups, o // groups, -1)))
    dtype = call.attrs.out_dtype
    y = relax.op.matmul(weight, x, out_dtype=dtype if dtype else None)
    return relax.op.reshape(y, (n, o, h, w))
