"""Stand-ins for cupy's exception classes (the job classifies errors by these class names)
and for its device arrays."""

from __future__ import annotations

from typing import Any

import numpy as np


class CompileException(Exception):
    def get_message(self) -> str:
        return str(self.args[0])


class CUDADriverError(RuntimeError):
    pass


class CUDARuntimeError(RuntimeError):
    pass


class DeviceArray(np.ndarray):
    """A numpy array with the part of cupy's memory pointer (``.data``) the job uses:
    memset and device-to-device copies."""

    @property
    def data(self) -> MemoryPointer:  # type: ignore[override]
        return MemoryPointer(self)


class MemoryPointer:
    def __init__(self, array: np.ndarray) -> None:
        self.bytes = np.asarray(array).reshape(-1).view(np.uint8)

    def memset(self, value: int, size: int) -> None:
        self.bytes[:size] = value

    def copy_from_device(self, src: MemoryPointer | memoryview, size: int) -> None:
        source = src.bytes if isinstance(src, MemoryPointer) else np.frombuffer(src, dtype=np.uint8)
        self.bytes[:size] = source[:size]


def device_empty(shape: Any, dtype: Any = np.float64) -> DeviceArray:
    return np.empty(shape, dtype=dtype).view(DeviceArray)


def device_empty_like(array: Any) -> DeviceArray:
    return np.empty_like(np.asarray(array)).view(DeviceArray)
