"""Weights that weightless blobs take as inputs: one device copy of each, shared by the EP's partitions."""

from __future__ import annotations

from collections.abc import Mapping

import onnx
import tvm
from onnx import numpy_helper

from ...api.device import DeviceId
from ...api.errors import EpLoadFailed
from ...api.tensor import aligned_empty
from ...lower.target import tvm_device

__all__ = ["DeviceWeights"]


class DeviceWeights:
    def __init__(self, device: DeviceId):
        self.device = tvm_device(device)
        self._tensors: dict[str, tvm.runtime.Tensor] = {}

    def __len__(self) -> int:
        return len(self._tensors)

    def bind(self, name: str, initializers: Mapping[str, onnx.TensorProto]) -> tvm.runtime.Tensor:
        """The device copy of initializer `name`, made on first use."""
        tensor = self._tensors.get(name)
        if tensor is None:
            if name not in initializers:
                raise EpLoadFailed(
                    name, "a weightless blob needs this initializer, but the model has none of that name"
                )
            array = numpy_helper.to_array(initializers[name])
            host = aligned_empty(array.shape, array.dtype)
            host[...] = array
            tensor = self._tensors[name] = tvm.runtime.tensor(host, self.device)
        return tensor
