"""1-D convolutions as 1xK 2-D ones, so they take the 2-D path: NHWC, the conv rule's register tile.

TVM legalises ``conv1d`` in NCW, and the conv rule then vectorises over output positions: at stride 4
(an audio front end's 80-tap, stride-4 conv over 16000 samples) each vector load is a gather, 1.6 ms
against onnxruntime's 0.3 ms for the whole model. As ``conv2d`` over ``[N, C, 1, W]`` it is converted
to NHWC like every 2-D convolution (output channels in the vector, input samples broadcast), and
grouped or depthwise ones are handled as theirs are. Constant weights gain their unit axis at compile
time.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_op, rewrite_call, wildcard

from .fold_affine import constant_array
from .strict import own_pass

__all__ = ["Conv1dAsConv2d"]


@relax.transform.function_pass(opt_level=0, name="nxrt_tvm.Conv1dAsConv2d")
class Conv1dAsConv2d:
    """``conv1d(x, W)`` (NCW/OIW) -> ``squeeze(conv2d(x[:, :, None], W[:, :, None]), axis=2)``."""

    def __init__(self) -> None:
        self.pattern = is_op("relax.nn.conv1d")(wildcard(), wildcard())

    @own_pass
    def transform_function(self, func: relax.Function, _mod: tvm.IRModule, _ctx) -> relax.Function:
        return rewrite_call(self.pattern, self._rewrite, func)

    def _rewrite(self, call: relax.Call, _matches) -> relax.Expr:
        attrs = call.attrs
        if (attrs.data_layout, attrs.kernel_layout, attrs.out_layout) != ("NCW", "OIW", "NCW"):
            return call
        data, weight = call.args
        value = constant_array(weight)
        weight2d = (
            relax.const(np.ascontiguousarray(value[:, :, None, :]))
            if value is not None
            else relax.op.expand_dims(weight, 2)
        )
        (left, right) = (int(p) for p in attrs.padding)
        conv = relax.op.nn.conv2d(
            relax.op.expand_dims(data, 2),
            weight2d,
            strides=(1, int(attrs.strides[0])),
            padding=(0, left, 0, right),
            dilation=(1, int(attrs.dilation[0])),
            groups=int(attrs.groups),
            out_dtype=attrs.out_dtype,
        )
        return relax.op.squeeze(conv, [2])
