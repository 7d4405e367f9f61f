"""Device vocabulary: which class of device an EP runs on, and which instance."""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["DeviceType", "DeviceId", "EpId"]


class DeviceType(enum.Enum):
    """A class of compute device, named as DLPack names them."""

    CPU = "cpu"
    CUDA = "cuda"

    @property
    def dlpack_code(self) -> int:
        """The DLDeviceType code, so views can be checked against `__dlpack_device__`."""
        return {DeviceType.CPU: 1, DeviceType.CUDA: 2}[self]

    @classmethod
    def from_dlpack_code(cls, code: int) -> "DeviceType":
        for member in cls:
            if member.dlpack_code == int(code):
                return member
        raise ValueError(f"DLPack device type {code} is not one nxrt-tvm runs on (cpu=1, cuda=2)")


@dataclass(frozen=True, order=True)
class DeviceId:
    """A specific device instance: a `DeviceType` plus an ordinal."""

    type: DeviceType
    ordinal: int = 0

    def __str__(self) -> str:
        return f"{self.type.value}:{self.ordinal}"


class EpId(str):
    """The stable name of an execution provider (e.g. ``TvmExecutionProvider``).

    A `str` subclass so it prints, compares and serialises as the plain name
    that onnxruntime users pass in ``providers=[...]``.
    """

    __slots__ = ()
