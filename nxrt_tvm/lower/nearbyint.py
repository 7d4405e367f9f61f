"""``tirx.nearbyint`` marked vectorisable: TVM 0.27 marks ``tirx.round`` so, but not ``nearbyint``,
which is what Relax's ``round`` (ONNX Round, and the rounding of every quantisation step of
`fake_quant` and `qlinear`) legalises to. `VectorizeLoop` turned each loop holding one into scalar
code, left to LLVM's loop vectoriser: the epilogue of a QDQ MobileNetV2's 8 -> 48 channel uint8
convolution became 32 scatter stores per tile, 212 us where the vector form takes 30. On LLVM both
ops are one ``vrndscaleps`` (ties to even) per vector.

Importing this module registers the mark (TVM has none to replace).
"""

from __future__ import annotations

import tvm

if tvm.ir.Op.get("tirx.nearbyint").get_attr("TVectorizable") is None:
    tvm.ir.register_op_attr("tirx.nearbyint", "TVectorizable", True)
