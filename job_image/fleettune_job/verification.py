"""Verification on the GPU with the job's own kernels (``kernels/verify.cu``).

The array code (:func:`fleettune_job.kernels.base.compare`, a problem's ``reference``)
runs on cupy's elementwise and reduction kernels, which cupy compiles at run time, with
its own headers, into an on-disk cache. A trial Pod's cache is an empty ``emptyDir``, so
every Pod compiled them again: 6 to 8 s of its GPU time on an H200, more than half of a
48-configuration batch Pod's (docs/benchmarks.md). These kernels are plain CUDA with no
headers; a worker compiles them once, in a fraction of a second, in its set-up phase.

Each function falls back to the array code where the kernels do not apply (an output
type they do not cover, an array that is not contiguous) or did not compile: the verdict
never depends on which path checked it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fleettune_job.kernels.base import Problem, compare, describe_mismatch

SOURCE = Path(__file__).resolve().parent / "kernels" / "verify.cu"
TILE = 16  # REF_TILE in verify.cu: the reference kernels' blocks are TILE x TILE
MAX_GRID_Y = 65535
# The (got, expected) type pairs that verify.cu counts mismatches for.
PAIRS = frozenset({("float32", "float64")} | {(t, t) for t in (
    "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")})
# No fused multiply-adds: the tolerance test rounds exactly as numpy's does, so a value on
# the tolerance's edge gets the array code's verdict.
OPTIONS = ("--fmad=false",)
COUNT_BLOCK = 256
COUNT_MAX_BLOCKS = 4096
_FIRST_UNSET = np.iinfo(np.uint64).max

_MODULE: dict[str, Any] = {}


def load(cupy: Any, log: Callable[[str], None] = lambda message: None) -> Any | None:
    """The compiled module of verify.cu, once per process (``log`` hears how it went); None
    when it does not compile or load: then the array code verifies."""
    if "module" not in _MODULE:
        started = time.monotonic()
        try:
            module = cupy.RawModule(code=SOURCE.read_text(), options=OPTIONS)
            module.get_function("count_mismatches_float32_float64")  # compiles and loads the module
        except Exception as exc:
            log(f"verification kernels did not compile ({type(exc).__name__}: {exc}): cupy's array code verifies")
            module = None
        else:
            log(f"verification kernels compiled in {time.monotonic() - started:.2f} s (once per process)")
        _MODULE["module"] = module
    return _MODULE["module"]


def covers(got_dtype: Any, expected_dtype: Any) -> bool:
    """Whether verify.cu compares arrays of these types."""
    return (np.dtype(got_dtype).name, np.dtype(expected_dtype).name) in PAIRS


def mismatch(cupy: Any, got: Any, expected: Any, atol: float, rtol: float = 0.0, *,
             nan_is_unwritten: bool = True) -> str | None:
    """:func:`compare`'s verdict and diagnosis, counted by verify.cu where it can."""
    module = load(cupy)
    if (module is None or tuple(got.shape) != tuple(expected.shape) or not covers(got.dtype, expected.dtype)
            or not (got.flags.c_contiguous and expected.flags.c_contiguous) or got.size == 0):
        return compare(cupy, got, expected, atol, rtol, nan_is_unwritten=nan_is_unwritten)
    # Set from the host: a cupy fill would be one more kernel to compile.
    result = cupy.asarray(np.array([0, 0, _FIRST_UNSET], dtype=np.uint64))
    n = int(got.size)
    blocks = min(-(-n // COUNT_BLOCK), COUNT_MAX_BLOCKS)
    kernel = module.get_function(f"count_mismatches_{got.dtype.name}_{expected.dtype.name}")
    kernel((blocks, 1, 1), (COUNT_BLOCK, 1, 1),
           (got, expected, np.int64(n), np.float64(atol), np.float64(rtol), result))
    n_bad, nans, first = (int(v) for v in cupy.asnumpy(result))
    if n_bad == 0:
        return None
    # One element each, through views: copies, not kernels.
    got_v = float(cupy.asnumpy(got.ravel()[first:first + 1])[0])
    exp_v = float(cupy.asnumpy(expected.ravel()[first:first + 1])[0])
    return describe_mismatch(tuple(got.shape), n_bad, first, got_v, exp_v, atol, rtol,
                             nans if nan_is_unwritten else 0)


# An element check: (got, expected, atol, rtol) -> a diagnosis, or None when they agree.
ElementCheck = Callable[[Any, Any, float, float], str | None]


def array_check(got: Any, expected: Any, atol: float, rtol: float) -> str | None:
    """:func:`compare` on host (numpy) arrays, as for a user kernel's outputs: their initial
    data is the user's, so a NaN is not taken for an element never written."""
    return compare(np, got, expected, atol, rtol, nan_is_unwritten=False)


def outputs_mismatch(got: Mapping[str, Any], expected: Mapping[str, Any], outputs: Sequence[str], atol: float,
                     rtol: float, check: ElementCheck = array_check) -> str | None:
    """A user kernel's verdict on one configuration: ``wrong result in <output>: ...`` for
    the first of ``outputs`` (argument order) with an element off the reference
    configuration's by more than ``atol + rtol * |expected|``; None when every output
    agrees. ``check`` compares one output (on a GPU: :func:`mismatch`, verify.cu's count,
    which agrees with :func:`array_check`)."""
    for name in outputs:
        text = check(got[name], expected[name], atol, rtol)
        if text:
            return f"wrong result in {name}: {text}"
    return None


def reference(cupy: Any, problem: Problem, inputs: Mapping[str, Any], problem_size: Sequence[int]) -> Any:
    """The problem's expected output (float64), by its kernel in verify.cu when it has one."""
    module = load(cupy) if problem.reference_kernel else None
    arrays = list(inputs.values())  # in the problem's input order (kept.draw)
    shape = tuple(int(n) for n in problem.output(problem_size).shape)
    if (module is None or len(shape) != 2 or not 1 <= len(arrays) <= 2
            or any(a.dtype != np.float32 or a.ndim != 2 or not a.flags.c_contiguous for a in arrays)
            or max(*shape, *(n for a in arrays for n in a.shape)) >= 2**31):  # verify.cu's sizes are ints
        return problem.reference(cupy, inputs, problem_size)
    rows, cols = shape
    out = cupy.empty(shape, dtype=np.float64)
    second = arrays[1] if len(arrays) == 2 else arrays[0]
    # verify.cu's reference signature: out, first, second input, out's shape, second's shape;
    # beyond MAX_GRID_Y block rows, the kernels stride over the rest.
    module.get_function(problem.reference_kernel)(
        (-(-cols // TILE), min(-(-rows // TILE), MAX_GRID_Y), 1), (TILE, TILE, 1),
        (out, arrays[0], second, np.int32(rows), np.int32(cols), np.int32(second.shape[0]), np.int32(second.shape[1])))
    return out


def nan_filled(cupy: Any, shape: Sequence[int]) -> Any:
    """A float32 array of NaN, by a memset (every byte 0xFF is a NaN): ``cupy.full`` would
    compile a fill kernel at run time."""
    out = cupy.empty(tuple(shape), dtype=np.float32)
    out.data.memset(0xFF, out.nbytes)
    return out


def device_copy(cupy: Any, array: Any) -> Any:
    """A copy of a contiguous device array by a device-to-device memcpy, not a copy kernel."""
    out = cupy.empty_like(array)
    out.data.copy_from_device(array.data, array.nbytes)
    return out
