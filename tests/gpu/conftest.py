"""GPU tests run only where cupy finds a CUDA device; elsewhere they skip and say why."""

from __future__ import annotations

from functools import cache

import pytest


@cache
def gpu_missing_reason() -> str | None:
    try:
        import cupy
    except Exception as exc:
        return f"no GPU tests: cupy is not importable ({type(exc).__name__}: {exc})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return f"no GPU tests: the CUDA runtime finds no device ({exc})"
    if count < 1:
        return "no GPU tests: no CUDA device is visible"
    return None


@pytest.fixture(autouse=True)
def _require_gpu() -> None:
    reason = gpu_missing_reason()
    if reason:
        pytest.skip(reason)
