"""The TVM execution provider: claims what the Relax ONNX frontend can compile, builds it with TVM.

One module per job: `options` (the option record, parsed once), `provider` (the claim loop and the
contract's methods), `builder` (proof builds, the compile cache, bisection, the build sandbox),
`cost` (claim_policy='cost'), `weights` (one device copy per weight), `context` (EPContext
save/load). The claim policy itself lives in `partition.tvm_rules`.
"""

from .provider import TvmExecutionProvider

__all__ = ["TvmExecutionProvider"]
