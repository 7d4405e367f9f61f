"""A `Kernel` over a compiled Relax VM executable."""
from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import tvm
from tvm import relax

from ..api.device import DeviceId, DeviceType
from ..api.errors import EpLoadFailed, InvalidTensorView, KernelFailed
from ..api.kernel import Kernel
from ..api.tensor import ALIGNMENT, TensorView, aligned_empty
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
    if (
        array.flags.c_contiguous
        and array.flags.writeable
        and array.ctypes.data % ALIGNMENT == 0
        and array.size > 0
    ):
        host = tvm.runtime.from_dlpack(array)
    else:
        staged = aligned_empty(array.shape, array.dtype)
        staged[...] = array
        host = tvm.runtime.from_dlpack(staged)
    if device.type is not DeviceType.CPU:  # host data for a GPU kernel: one explicit copy
        return tvm.runtime.tensor(array, tvm_dev)
    return host


class TvmKernel(Kernel):
    """Runs one compiled partition; one VM per thread, since a VM keeps per-call state."""

    def __init__(
        self,
        executable: relax.VMExecutable,
        device: DeviceId,
        input_names: Sequence[str],
        output_names: Sequence[str],
        output_dtypes: Sequence[np.dtype | None],
    ):
        self.executable = executable
        self.device = device
        self.input_names = tuple(input_names)
        self.output_names = tuple(output_names)
        self._output_dtypes = tuple(output_dtypes)
        self._tvm_device = tvm_device(device)
        self._local = threading.local()
        if not self._tvm_device.exist:
            raise EpLoadFailed(
                str(device), f"no {device.type.value} device is visible to TVM; run on a host that has one, "
                "or compile ahead of time and deploy there"
            )
        self._vm()  # fail at load, not at the first run

    def _vm(self) -> relax.VirtualMachine:
        vm = getattr(self._local, "vm", None)
        if vm is None:
            vm = self._local.vm = relax.VirtualMachine(self.executable, self._tvm_device)
        return vm

    def compute(self, inputs: Sequence[TensorView]) -> list[TensorView]:
        if len(inputs) != len(self.input_names):
            raise InvalidTensorView(f"kernel takes {len(self.input_names)} inputs, got {len(inputs)}")
        args = [_to_tvm(v, self.device, self._tvm_device) for v in inputs]
        try:
            result = self._vm()["main"](*args)
        except Exception as exc:
            raise KernelFailed(f"TVM kernel for {self.output_names} failed: {exc}") from exc
        outputs = [result] if len(self.output_names) == 1 else list(result)
        if len(outputs) != len(self.output_names):
            raise KernelFailed(f"kernel returned {len(outputs)} outputs, expected {len(self.output_names)}")
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
