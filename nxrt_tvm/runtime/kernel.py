"""A `Kernel` over a compiled Relax VM executable."""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import tvm
from tvm import relax

from ..api.device import DeviceId, DeviceType
from ..api.errors import EpLoadFailed, IndexOutOfBounds, InvalidTensorView, KernelFailed
from ..api.kernel import Kernel, KernelVariant
from ..api.tensor import ALIGNMENT, TensorView, aligned_empty
from ..frontend import GuardFailure, parse_guard_failure
from ..graph.model import ValueInfo
from ..lower.target import tvm_device
from .artifact import Blob, Library

__all__ = ["TvmKernel", "POOL_THREADS", "use_threads"]

#: TVM's pool size: `TVM_NUM_THREADS` as the pool read it at its start (nxrt_tvm sets it on import)
POOL_THREADS = max(1, int(os.environ.get("TVM_NUM_THREADS") or len(os.sched_getaffinity(0))))
_config_pool = tvm.get_global_func("runtime.config_threadpool")
_pool = threading.local()  # the thread count this thread's TVM pool was last given
_BIG_CORES = 1  # TVM's affinity mode kBig, the mode the pool starts in


def use_threads(threads: int) -> None:
    """Run this thread's TVM kernels on `threads` threads (0 or more than the pool: the whole pool).
    TVM's pool belongs to the calling thread and keeps a size until told another, so it is only
    resized where the last session run in this thread wanted another (a resize costs ~1 us)."""
    want = min(threads, POOL_THREADS) if threads > 0 else POOL_THREADS
    if getattr(_pool, "threads", POOL_THREADS) != want:
        _config_pool(_BIG_CORES, want)
        _pool.threads = want


#: Host feeds up to this size are copied into an aligned buffer without asking where they lie: reading a
#: numpy array's address costs more than copying 64 KiB.
_COPY_SMALL_BYTES = 1 << 16


@dataclass(frozen=True)
class _Staged:
    """An aligned host copy of one input, reused by later calls of the same shape and dtype."""

    host: np.ndarray
    tensor: tvm.runtime.Tensor
    start: int  #: its address range, for `_unaliased`
    end: int


def _to_tvm(
    view: TensorView, device: DeviceId, tvm_dev: tvm.runtime.Device, staged: _Staged | None = None
) -> tuple[tvm.runtime.Tensor, _Staged | None]:
    """The view as a TVM tensor, and the aligned host copy made for it (None where it is shared zero-copy).

    Zero-copy where the memory is already what TVM code assumes (aligned, contiguous, writable) and large.
    Otherwise the data is copied into `staged` (a previous call's copy) where its shape and dtype fit: a
    fresh buffer per call costs page faults on every run (numpy's arrays are 16-byte aligned, so most
    feeds are copied).
    """
    owner = view.owner
    if isinstance(owner, tvm.runtime.Tensor):
        return owner, None
    if view.device.type is not DeviceType.CPU:
        return tvm.runtime.from_dlpack(owner), None
    array = view.numpy()
    if device.type is not DeviceType.CPU:  # host data for a GPU kernel: one explicit copy
        return tvm.runtime.tensor(np.ascontiguousarray(array), tvm_dev), None
    return _host_to_tvm(array, tvm_dev, staged)


def _host_to_tvm(
    array: np.ndarray, tvm_dev: tvm.runtime.Device, staged: _Staged | None
) -> tuple[tvm.runtime.Tensor, _Staged | None]:
    """A host array as a TVM tensor for a CPU kernel (`_to_tvm`)."""
    if array.size == 0:  # nothing to share; DLPack producers disagree on empty tensors' pointers and strides
        return tvm.runtime.empty(array.shape, str(array.dtype), tvm_dev), None
    if (
        array.nbytes > _COPY_SMALL_BYTES
        and array.flags.c_contiguous
        and array.flags.writeable
        and array.ctypes.data % ALIGNMENT == 0
    ):
        try:
            return tvm.runtime.from_dlpack(array), None
        except (RuntimeError, BufferError):  # a layout DLPack cannot express as TVM wants it: copy below
            pass
    if staged is None or staged.host.shape != array.shape or staged.host.dtype != array.dtype:
        host = aligned_empty(array.shape, array.dtype)
        start = host.ctypes.data
        staged = _Staged(host, tvm.runtime.from_dlpack(host), start, start + host.nbytes)
    staged.host[...] = array
    return staged.tensor, staged


_array_item = tvm.get_global_func("ffi.ArrayGetItem")
_array_size = tvm.get_global_func("ffi.ArraySize")


def _shape_result(value: object, want: np.dtype | None) -> np.ndarray:
    """A result the VM gives as a `Shape` tuple or a scalar, as an array of ONNX's type."""
    return np.asarray(tuple(value) if not np.isscalar(value) else value, dtype=want or np.int64)


def _unaliased(value: object, staged: Sequence[_Staged]) -> object:
    """A VM result that shares memory with a staged input (a view-like op returned it) copied out of it:
    the next call writes the staged buffer again. (Inputs are staged for CPU kernels only.)"""
    if not staged or not isinstance(value, tvm.runtime.Tensor):
        return value
    start = value.data_ptr()
    if any(s.start <= start < s.end for s in staged):
        return tvm.runtime.tensor(np.from_dlpack(value).copy(), value.device)
    return value


class TvmKernel(Kernel):
    """Runs one compiled partition; one VM per thread, since a VM keeps per-call state.

    `library` is a freshly built executable or one loaded from `blob`, or None where this host cannot
    load it (CUDA code and no GPU: `prepare` says so). Every call passes its inputs, then `weights`
    (weightless builds), then the library's lifted constants.
    """

    def __init__(
        self,
        library: Library | None,
        device: DeviceId,
        name: str,
        inputs: Sequence[ValueInfo],
        outputs: Sequence[ValueInfo],
        weights: Sequence[tuple[str, tvm.runtime.Tensor]] = (),
        blob: Blob | None = None,
        variants: Sequence[KernelVariant] = (),
    ):
        self.library = library
        self.blob = blob  # the exported library, when this kernel came from (or went to) one
        self._variants = list(variants)
        self.device = device
        self.name = name
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        self.input_names = tuple(i.name for i in inputs)
        self.output_names = tuple(o.name for o in outputs)
        self.weight_names = tuple(n for n, _ in weights)
        #: what every call passes after its inputs
        self._tail = [t for _, t in weights] + list(library.constants if library is not None else ())
        self._output_dtypes = tuple(o.dtype for o in outputs)
        self._result_dtypes: list[np.dtype | None] = [None] * len(outputs)  # see `_as_view`
        self._tvm_device = tvm_device(device)
        self._local = threading.local()

    @property
    def module(self) -> relax.VMExecutable | tvm.runtime.Module | None:
        """The library's VM executable (None where this host cannot load it)."""
        return None if self.library is None else self.library.module

    def variants(self) -> list[KernelVariant]:
        return list(self._variants)

    def prepare(self) -> None:
        if not self._tvm_device.exist:
            raise EpLoadFailed(
                str(self.device),
                f"no {self.device.type.value} device is visible to TVM; run on a host that has one, "
                "or compile ahead of time (nxrt-tvm compile) and deploy there",
            )
        self._per_thread()

    def _per_thread(self) -> tuple[tvm.runtime.Function, list]:
        """This thread's VM entry function (looked up once: `vm["main"]` is a module lookup per call) and its
        staged input copies (one slot per input, see `_to_tvm`)."""
        local = self._local
        if not hasattr(local, "main"):
            local.main = relax.VirtualMachine(self.module, self._tvm_device)["main"]
            local.staging = [None] * len(self.input_names)
        return local.main, local.staging

    def compute(self, inputs: Sequence[TensorView]) -> list[TensorView]:
        if len(inputs) != len(self.input_names):
            raise InvalidTensorView(
                f"kernel {self.name} takes {len(self.input_names)} inputs, got {len(inputs)}"
            )
        results = self._call(inputs, partial(_to_tvm, device=self.device, tvm_dev=self._tvm_device))
        return [self._as_view(k, value) for k, value in enumerate(results)]

    def compute_arrays(self, arrays: Sequence[np.ndarray]) -> list[Any]:
        """`compute` without views: a small model's run spent about as long in the views and their
        conversions as in its compiled code (Silero VAD: 82 us in the VM, 140 us a session run)."""
        if self.device.type is not DeviceType.CPU:
            return super().compute_arrays(arrays)
        results = self._call(arrays, partial(_host_to_tvm, tvm_dev=self._tvm_device))
        return [self._as_array(k, value) for k, value in enumerate(results)]

    def _call(self, inputs: Sequence[Any], to_tvm: Callable[..., tuple[Any, _Staged | None]]) -> list[object]:
        """The VM's results for `inputs` (each made a TVM tensor by `to_tvm(input, staged=...)`, given
        this thread's staged copy of it), one per output, none sharing a staged input's memory."""
        main, staging = self._per_thread()
        args, used = [], []
        for k, value in enumerate(inputs):
            tensor, staged = to_tvm(value, staged=staging[k])
            if staged is not None:
                staging[k] = staged
                used.append(staged)
            args.append(tensor)
        count = len(self.output_names)
        try:
            result = main(*args, *self._tail)
        except Exception as exc:
            guard = parse_guard_failure(str(exc))
            if guard is not None:
                raise IndexOutOfBounds(
                    f"TVM kernel {self.name}: {guard.text}{self._bad_index(guard, inputs)}; fix the input "
                    "(onnxruntime refuses it too)",
                    guard.node,
                ) from None
            raise KernelFailed(f"TVM kernel {self.name} failed: {exc}") from exc
        if count == 1:
            outputs = [result]
        else:  # the tuple's items one FFI call each (its Python iterator: 3 us an item)
            returned = _array_size(result)
            if returned != count:
                raise KernelFailed(f"kernel {self.name} returned {returned} outputs, expected {count}")
            outputs = [_array_item(result, k) for k in range(count)]
        return [_unaliased(value, used) for value in outputs] if used else outputs

    def _as_view(self, slot: int, value: object) -> TensorView:
        """Result `slot` as a view of ONNX's declared type.

        Shape computations come back as `Shape` tuples or scalars rather than tensors, and the frontend
        computes some int64 results in int32: ONNX's type wins in both cases. A result's dtype is the
        compiled function's, the same at every call: read once (reading it costs half a microsecond).
        """
        want = self._output_dtypes[slot]
        if not isinstance(value, tvm.runtime.Tensor):
            return TensorView(_shape_result(value, want))
        dtype = self._result_dtypes[slot]
        if dtype is None:
            dtype = self._result_dtypes[slot] = TensorView(value).dtype
        view = TensorView.known(value, value.shape, dtype, self.device)
        if want is None or dtype == want or self.device.type is not DeviceType.CPU:
            return view
        return TensorView(view.numpy().astype(want))

    def _as_array(self, slot: int, value: object) -> np.ndarray:
        """Result `slot` as a host array of ONNX's declared type (`_as_view`)."""
        want = self._output_dtypes[slot]
        if not isinstance(value, tvm.runtime.Tensor):
            return _shape_result(value, want)
        array = np.from_dlpack(value)
        return array if want is None or array.dtype == want else array.astype(want)

    def function_times(self, inputs: Sequence[TensorView], repeat: int) -> dict[str, tuple[float, int]]:
        """Per function the VM calls, the median seconds per call of this kernel and the calls per call:
        the compiled kernels (named as in `variants`) and the VM's builtins (allocation, shape checks),
        timed around each call instruction by a VM instrument on a VM of its own, after one untimed call.
        The instrument's own cost (about a microsecond a call) lands on the builtins' short calls."""
        vm = relax.VirtualMachine(self.module, self._tvm_device)
        runs: list[dict[str, list]] = []
        started: list[float] = []

        def instrument(_func, symbol, before_run, _ret, *_args) -> int:
            if before_run:
                started.append(time.perf_counter())
            else:
                seen = runs[-1].setdefault(symbol, [0.0, 0])
                seen[0] += time.perf_counter() - started.pop()
                seen[1] += 1
            return 0  # VMInstrumentReturnKind.NO_OP: run the call as usual

        vm.set_instrument(instrument)
        args = [_to_tvm(view, self.device, self._tvm_device)[0] for view in inputs]
        main = vm["main"]
        for _ in range(max(repeat, 1) + 1):
            runs.append({})
            main(*args, *self._tail)
        timed = runs[1:]
        names = {name for run in timed for name in run}
        return {
            name: (
                statistics.median(run.get(name, (0.0, 0))[0] for run in timed),
                max(run.get(name, (0.0, 0))[1] for run in timed),
            )
            for name in names
        }

    def _bad_index(self, guard: GuardFailure, inputs: Sequence[TensorView | np.ndarray]) -> str:
        """The first out-of-range index, where the indices are
        this kernel's input (a view or a host array) and index one dim of known size."""
        if guard.indices not in self.input_names or len(guard.extents) != 1 or guard.extents[0] is None:
            return ""
        n = guard.extents[0]
        values = inputs[self.input_names.index(guard.indices)]
        values = values.numpy() if isinstance(values, TensorView) else values
        bad = np.argwhere((values < -n) | (values >= n))
        if not len(bad):
            return ""
        where = tuple(int(i) for i in bad[0])
        return f" (index {int(values[where])} at position {where}, inclusive range [{-n}, {n - 1}])"
