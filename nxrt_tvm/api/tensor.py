"""Zero-copy tensor views exchanged between EPs through DLPack.

A view borrows its backing memory from the object it wraps (a numpy array, a
TVM tensor, ...). Host access is allowed only for CPU memory: device memory is
never dereferenced on the host.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from .device import DeviceId, DeviceType
from .errors import InvalidTensorView

__all__ = ["TensorView", "ALIGNMENT", "aligned_empty"]

#: Byte alignment TVM-compiled code assumes for its buffers (TVM's from_dlpack checks it).
ALIGNMENT = 64


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A C-contiguous host array whose data pointer is `ALIGNMENT`-aligned."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
    offset = (-raw.ctypes.data) % ALIGNMENT
    return raw[offset : offset + nbytes].view(dtype).reshape(shape)


@functools.lru_cache(maxsize=None)
def _numpy_dtype(text: str) -> np.dtype:
    try:
        return np.dtype(text)
    except TypeError:
        import ml_dtypes  # bfloat16 / float8 names numpy itself does not know

        return np.dtype(getattr(ml_dtypes, text))


@functools.lru_cache(maxsize=None)
def _device(dev_type: int, ordinal: int) -> DeviceId:
    try:
        return DeviceId(DeviceType.from_dlpack_code(dev_type), ordinal)
    except ValueError as exc:
        raise InvalidTensorView(str(exc)) from exc


_HOST = DeviceId(DeviceType.CPU, 0)


class TensorView:
    """A borrowed, typed view of a tensor; the wrapped object owns the memory."""

    __slots__ = ("_obj", "shape", "dtype", "device")

    def __init__(self, obj: Any):
        if not hasattr(obj, "__dlpack__") or not hasattr(obj, "__dlpack_device__"):
            raise InvalidTensorView(f"{type(obj).__name__} does not implement the DLPack protocol")
        self._obj = obj
        dev_type, dev_ordinal = obj.__dlpack_device__()
        self.device: DeviceId = _device(int(dev_type), int(dev_ordinal))
        if type(obj) is np.ndarray:  # the common feed: its shape and dtype are already what a view holds
            self.shape: tuple[int, ...] = obj.shape
            self.dtype: np.dtype = obj.dtype
        else:  # session.run pays this per kernel output: the dtype lookup is cached, as the device's is
            self.shape = tuple(int(d) for d in obj.shape)
            self.dtype = _numpy_dtype(str(obj.dtype))

    @classmethod
    def host_array(cls, array: np.ndarray) -> TensorView:
        """A view of a numpy array, without the DLPack calls a general object needs (a feed, per run)."""
        return cls.known(array, array.shape, array.dtype, _HOST)

    @classmethod
    def known(cls, obj: Any, shape: tuple[int, ...], dtype: np.dtype, device: DeviceId) -> TensorView:
        """A view whose shape, dtype and device the caller has read already (a kernel's output: a TVM
        tensor's dtype costs half a microsecond to read, so a kernel reads it once per output)."""
        view = cls.__new__(cls)
        view._obj, view.shape, view.dtype, view.device = obj, shape, dtype, device
        return view

    @property
    def owner(self) -> Any:
        """The object that owns the memory (keep it alive as long as the view)."""
        return self._obj

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def numpy(self) -> np.ndarray:
        """The host array behind the view, without a copy where the owner allows it."""
        if self.device.type is not DeviceType.CPU:
            raise InvalidTensorView(f"tensor lives on {self.device}; copy it to the host before reading it")
        if isinstance(self._obj, np.ndarray):
            return self._obj
        if self.nbytes == 0:  # DLPack producers may hand out null data for empty tensors
            return np.empty(self.shape, self.dtype)
        return np.from_dlpack(self._obj)

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self._obj.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._obj.__dlpack_device__()

    def __repr__(self) -> str:
        return f"TensorView(shape={self.shape}, dtype={self.dtype}, device={self.device})"
