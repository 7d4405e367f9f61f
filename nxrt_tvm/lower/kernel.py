"""A `Kernel` over a compiled Relax VM executable."""
from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import tvm
from tvm import relax

from ..api.device import DeviceId, DeviceType
from ..api.errors import EpLoadFailed, InvalidTensorView, KernelFailed
from ..api.kernel import Kernel, KernelVariant
from ..api.tensor import ALIGNMENT, TensorView, aligned_empty
from ..graph.model import ValueInfo
from .target import tvm_device

__all__ = ["TvmKernel"]


def _to_tvm(view: TensorView, device: DeviceId, tvm_dev: tvm.runtime.Device) -> tvm.runtime.Tensor:
    """Zero-copy where the memory is already what TVM code assumes (aligned, contiguous, writable)."""
    owner = view.owner
    if isinstance(owner, tvm.runtime.Tensor):
        return owner
    if view.device.type is not DeviceType.CPU:
        return tvm.runtime.from_dlpack(owner)
    array = view.numpy()
    if device.type is not DeviceType.CPU:  # host data for a GPU kernel: one explicit copy
        return tvm.runtime.tensor(np.ascontiguousarray(array), tvm_dev)
    if array.size == 0:  # nothing to share; DLPack producers disagree on empty tensors' pointers and strides
        return tvm.runtime.empty(array.shape, str(array.dtype), tvm_dev)
    if array.flags.c_contiguous and array.flags.writeable and array.ctypes.data % ALIGNMENT == 0:
        try:
            return tvm.runtime.from_dlpack(array)
        except (RuntimeError, BufferError):  # a layout DLPack cannot express as TVM wants it: copy below
            pass
    staged = aligned_empty(array.shape, array.dtype)
    staged[...] = array
    return tvm.runtime.from_dlpack(staged)


class TvmKernel(Kernel):
    """Runs one compiled partition; one VM per thread, since a VM keeps per-call state.

    `module` is a freshly built executable or a module loaded from `blob`, or None
    where this host cannot load it (CUDA code and no GPU: `prepare` says so);
    `weights` (weightless builds) are appended to every call's arguments.
    """

    def __init__(
        self,
        module: relax.VMExecutable | tvm.runtime.Module | None,
        device: DeviceId,
        name: str,
        inputs: Sequence[ValueInfo],
        outputs: Sequence[ValueInfo],
        weights: Sequence[tuple[str, tvm.runtime.Tensor]] = (),
        blob: bytes | None = None,
        variants: Sequence[KernelVariant] = (),
    ):
        self.module = module
        self.blob = blob  # the exported library, when this kernel came from (or went to) one
        self._variants = list(variants)
        self.device = device
        self.name = name
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        self.input_names = tuple(i.name for i in inputs)
        self.output_names = tuple(o.name for o in outputs)
        self.weight_names = tuple(n for n, _ in weights)
        self._weights = [t for _, t in weights]
        self._output_dtypes = tuple(o.dtype for o in outputs)
        self._tvm_device = tvm_device(device)
        self._local = threading.local()

    def variants(self) -> list[KernelVariant]:
        return list(self._variants)

    def prepare(self) -> None:
        if not self._tvm_device.exist:
            raise EpLoadFailed(
                str(self.device), f"no {self.device.type.value} device is visible to TVM; run on a host that has one, "
                "or compile ahead of time (nxrt-tvm compile) and deploy there"
            )
        self._vm()

    def _vm(self) -> relax.VirtualMachine:
        vm = getattr(self._local, "vm", None)
        if vm is None:
            vm = self._local.vm = relax.VirtualMachine(self.module, self._tvm_device)
        return vm

    def compute(self, inputs: Sequence[TensorView]) -> list[TensorView]:
        if len(inputs) != len(self.input_names):
            raise InvalidTensorView(f"kernel {self.name} takes {len(self.input_names)} inputs, got {len(inputs)}")
        args = [_to_tvm(v, self.device, self._tvm_device) for v in inputs]
        try:
            result = self._vm()["main"](*args, *self._weights)
        except Exception as exc:
            raise KernelFailed(f"TVM kernel {self.name} failed: {exc}") from exc
        outputs = [result] if len(self.output_names) == 1 else list(result)
        if len(outputs) != len(self.output_names):
            raise KernelFailed(f"kernel {self.name} returned {len(outputs)} outputs, expected {len(self.output_names)}")
        return [_as_view(value, want) for value, want in zip(outputs, self._output_dtypes)]


def _as_view(value: object, want: np.dtype | None) -> TensorView:
    """A VM result as a view of ONNX's declared type.

    Shape computations come back as `Shape` tuples or scalars rather than
    tensors, and the frontend computes some int64 results in int32: ONNX's
    type wins in both cases.
    """
    if not isinstance(value, tvm.runtime.Tensor):
        return TensorView(np.asarray(tuple(value) if not np.isscalar(value) else value, dtype=want or np.int64))
    view = TensorView(value)
    if want is None or view.dtype == want or view.device.type is not DeviceType.CPU:
        return view
    return TensorView(view.numpy().astype(want))
