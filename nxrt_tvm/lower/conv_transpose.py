"""Transposed convolutions whose stride equals their kernel as a matmul and a pixel shuffle.

A UNet's or a text detector's upsampling (``ConvTranspose``, kernel 2x2, stride 2) sends each input
pixel to its own ``kh x kw`` block of output pixels, so it is ``x[n, h, w, :] @ W[:, oc, i, j]`` written
to ``out[n, oc, h*kh + i, w*kw + j]``: a matmul over input channels, then an interleave. TVM legalises
it as a convolution over the stride-dilated input, three zeros in four at stride 2, with the output
channels (one, in PP-OCR det's head) as the only vector: that kernel took 6.6 of the model's 18 ms. As
a matmul and a transpose, both take their rules.

Static shapes only: over a symbolic height and width, TVM 0.27's FuseTIR fails on the fused shuffle and
bias ("Inconsistent buffers ... mapped to the same relax var", PP-OCR det), so a symbolic build keeps
the transposed convolution; the session's build for the shapes its calls repeat
(`nxrt_tvm.runtime.specialise`) is static, and takes the matmul.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_op, rewrite_call, wildcard

from .fold_affine import constant_array, static_shape
from .strict import own_pass

__all__ = ["ConvTransposeAsMatmul"]


@relax.transform.function_pass(opt_level=0, name="nxrt_tvm.ConvTransposeAsMatmul")
class ConvTransposeAsMatmul:
    """``conv2d_transpose(x, W)`` (NCHW/IOHW, stride == kernel, no padding, dilation or groups) ->
    ``shuffle(matmul(NHWC(x), W as [I, O*kh*kw]))``."""

    def __init__(self) -> None:
        self.pattern = is_op("relax.nn.conv2d_transpose")(wildcard(), wildcard())

    @own_pass
    def transform_function(self, func: relax.Function, _mod: tvm.IRModule, _ctx) -> relax.Function:
        return rewrite_call(self.pattern, self._rewrite, func)

    def _rewrite(self, call: relax.Call, _matches) -> relax.Expr:
        attrs = call.attrs
        data, weight = call.args
        if (attrs.data_layout, attrs.kernel_layout, attrs.out_layout) != ("NCHW", "IOHW", "NCHW"):
            return call
        data_shape = static_shape(getattr(data.ty, "shape", None))
        weight_shape = static_shape(getattr(weight.ty, "shape", None))
        if data_shape is None or weight_shape is None or len(weight_shape) != 4:
            return call
        in_channels, out_channels, kh, kw = weight_shape
        plain = (
            [int(s) for s in attrs.strides] == [kh, kw]
            and [int(p) for p in attrs.padding] == [0, 0, 0, 0]
            and [int(p) for p in attrs.output_padding] == [0, 0]
            and [int(d) for d in attrs.dilation] == [1, 1]
            and int(attrs.groups) == 1
        )
        if not plain:
            return call
        n, _, h, w = data_shape
        value = constant_array(weight)
        columns = out_channels * kh * kw
        matrix = (
            relax.const(np.ascontiguousarray(value.reshape(in_channels, columns)))
            if value is not None
            else relax.op.reshape(weight, [in_channels, columns])
        )
        out_dtype = attrs.out_dtype if str(attrs.out_dtype) not in ("", "void") else None
        product = relax.op.matmul(relax.op.permute_dims(data, [0, 2, 3, 1]), matrix, out_dtype=out_dtype)
        blocks = relax.op.reshape(product, [n, h, w, out_channels, kh, kw])
        shuffled = relax.op.permute_dims(blocks, [0, 3, 1, 4, 2, 5])  # N, O, H, kh, W, kw
        return relax.op.reshape(shuffled, [n, out_channels, h * kh, w * kw])
