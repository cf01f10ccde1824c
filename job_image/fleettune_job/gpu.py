"""The trial job's GPU: cupy with a usable device, and the kernels this process compiled or loaded.

:func:`load_cupy` imports cupy lazily (the package imports on machines without CUDA) and
raises :class:`~fleettune_job.classify.NoGpu` when there is no usable device.
:func:`compile_kernel` compiles a build with NVRTC once per process, or loads the cubin a
batch supervisor compiled ahead (:func:`use_cubins`); module load happens there too, so
that loader errors surface in the compile phase. :func:`log` is the job's log line on stderr.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from fleettune_job.classify import NoGpu
from fleettune_job.fingerprint import device_fingerprint, device_limits
from fleettune_job.prepare import KernelBuild, Prepared
from fleettune_job.protocol import Fingerprint

# Compiled modules of this process, by build key (source, options and function). Across
# processes cupy's own disk cache (CUPY_CACHE_DIR) avoids recompiling.
_MODULES: dict[str, tuple[Any, Any]] = {}
# Cubins a batch supervisor compiled ahead on the CPU, by build key: (path, compile seconds).
_CUBINS: dict[str, tuple[str, float]] = {}


def log(message: str) -> None:
    print(f"fleettune-job: {message}", file=sys.stderr, flush=True)


def load_cupy() -> Any:
    """cupy with at least one usable CUDA device, or :class:`NoGpu` saying why not."""
    try:
        import cupy
    except Exception as exc:  # ImportError, or a broken CUDA library raising at import
        raise NoGpu(f"no GPU: cupy cannot be imported ({type(exc).__name__}: {exc})") from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        raise NoGpu(f"no GPU: the CUDA runtime finds no usable device ({exc})") from None
    if count < 1:
        raise NoGpu("no GPU: no CUDA device is visible to this container")
    return cupy


def describe_device(cupy: Any) -> Fingerprint:
    """The device's fingerprint, logged with its limits."""
    fp = device_fingerprint(cupy)
    log(f"device {fp.product} (sm {fp.compute_capability}, driver {fp.driver_version}, "
        f"CUDA runtime {fp.cuda_runtime_version}; {device_limits(cupy)})")
    return fp


def use_cubins(cubins: Mapping[str, tuple[str, float]]) -> None:
    """Load these precompiled cubins (build key -> path, compile seconds) instead of compiling."""
    _CUBINS.clear()
    _CUBINS.update(cubins)


def compiled_ahead_s(key: str) -> float:
    """The CPU seconds the cubin of build ``key`` took to compile ahead (0 when none was)."""
    return _CUBINS[key][1] if key in _CUBINS else 0.0


def compile_kernel(cupy: Any, prepared: Prepared | KernelBuild) -> tuple[Any, Any, str]:
    """(module, kernel, origin: ``cache``, ``cubin`` or ``nvrtc``). Module load happens here
    too, so loader errors (PTX JIT, too much shared memory) surface in the compile phase."""
    key = prepared.key
    hit = _MODULES.get(key)
    if hit is not None:
        return hit[0], hit[1], "cache"
    loaded = _load_cubin(cupy, prepared, key)
    if loaded is not None:
        origin = "cubin"
    else:
        origin = "nvrtc"
        module = cupy.RawModule(code=prepared.code, options=prepared.options)
        loaded = module, module.get_function(prepared.function)
    _MODULES[key] = loaded
    return loaded[0], loaded[1], origin


def _load_cubin(cupy: Any, prepared: Prepared | KernelBuild, key: str) -> tuple[Any, Any] | None:
    """The module compiled ahead, or None: then the worker compiles, whose verdict is the truth."""
    if key not in _CUBINS:
        return None
    path = _CUBINS[key][0]
    try:
        module = cupy.RawModule(path=path)
        return module, module.get_function(prepared.function)
    except Exception as exc:
        log(f"cubin compiled ahead ({path}) did not load ({type(exc).__name__}: {exc}); compiling here")
        return None


def kernel_resources(kernel: Any) -> dict[str, int]:
    out = {}
    for attr in ("num_regs", "shared_size_bytes", "local_size_bytes", "max_threads_per_block"):
        try:
            out[attr] = int(getattr(kernel, attr))
        except Exception:  # attribute missing in this cupy, or the context is gone
            continue
    return out
