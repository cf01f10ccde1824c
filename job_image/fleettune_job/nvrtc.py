"""NVRTC through ctypes: compile CUDA source for a GPU architecture without a GPU.

NVRTC (and the ptxas inside it) needs no device, only libnvrtc: from a CUDA toolkit, the
``nvidia-cuda-nvrtc-cu12`` wheel, or the path in ``FLEETTUNE_NVRTC``. The operator uses
it to check a user kernel before any Job (compile errors, the function's name), the
fleet simulator to answer user-source trials with real compile errors, and the tests to
compile the built-in kernels for every GPU of the fleet.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

NVRTC_ENV = "FLEETTUNE_NVRTC"
# nvrtcResult: the source does not compile (any other failure is an option the library
# refuses, such as an architecture newer than it knows, or the library itself).
NVRTC_ERROR_INVALID_OPTION = 5
NVRTC_ERROR_COMPILATION = 6


@dataclass(frozen=True)
class Compiled:
    ok: bool
    log: str
    ptx: str = ""  # with a virtual architecture (compute_XX): the PTX, which names the entry points
    cubin: bytes = b""  # with a real architecture (sm_XX), when asked for
    status: int = 0  # nvrtcCompileProgram's nvrtcResult

    @property
    def source_error(self) -> bool:
        """The source itself does not compile (rather than an option the library refuses)."""
        return self.status == NVRTC_ERROR_COMPILATION

    def has_entry(self, function: str) -> bool:
        """Whether the PTX defines a kernel named ``function`` (extern "C", so unmangled)."""
        return re.search(rf"\.entry\s+{re.escape(function)}\s*\(", self.ptx) is not None


@cache
def library() -> ctypes.CDLL | None:
    """libnvrtc, or None when this machine has none."""
    candidates = [os.environ.get(NVRTC_ENV, "")]
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        candidates.append(str(Path(root) / "cuda_nvrtc" / "lib" / "libnvrtc.so.12"))
    # The CUDA runtime images ship only the versioned library (the unversioned link is in -devel).
    candidates += [ctypes.util.find_library("nvrtc") or "", "libnvrtc.so.12", "/usr/local/cuda/lib64/libnvrtc.so.12",
                   "/usr/local/cuda/lib64/libnvrtc.so"]
    for path in candidates:
        if path:
            try:
                return ctypes.CDLL(path)
            except OSError:
                continue
    return None


def available() -> bool:
    return library() is not None


def arch_option(compute_capability: str, *, virtual: bool = False) -> str:
    """``-arch=sm_80`` (real: runs ptxas, so resource limits fail here) or ``compute_80``
    (virtual: PTX, whose text names the kernels) for a compute capability like ``8.0``."""
    digits = compute_capability.replace(".", "")
    if not digits.isdigit():
        raise ValueError(f"not a compute capability: {compute_capability!r}")
    return f"-arch={'compute' if virtual else 'sm'}_{digits}"


def compile_source(source: str, options: Sequence[str], name: str = "kernel.cu", *, cubin: bool = False) -> Compiled:
    """Compile ``source`` with NVRTC (and return the cubin when ``cubin``: needs ``-arch=sm_XX``);
    raises RuntimeError when libnvrtc is missing."""
    lib = library()
    if lib is None:
        raise RuntimeError(f"libnvrtc not found (install nvidia-cuda-nvrtc-cu12 or set {NVRTC_ENV})")
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None) != 0:
        raise RuntimeError("nvrtcCreateProgram failed")
    try:
        opts = (ctypes.c_char_p * len(options))(*(o.encode() for o in options))
        status = lib.nvrtcCompileProgram(prog, len(options), opts)
        ok = status == 0
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, buf)
        log = buf.value.decode(errors="replace")
        ptx = ""
        if ok and any(o.startswith("-arch=compute_") for o in options):
            lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
            out = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetPTX(prog, out)
            ptx = out.value.decode(errors="replace")
        binary = _cubin(lib, prog) if ok and cubin else b""
        return Compiled(ok, log, ptx, binary, status)
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _cubin(lib: ctypes.CDLL, prog: ctypes.c_void_p) -> bytes:
    size = ctypes.c_size_t()
    if lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)) != 0 or not size.value:
        return b""  # a virtual architecture: PTX only
    out = ctypes.create_string_buffer(size.value)
    if lib.nvrtcGetCUBIN(prog, out) != 0:
        return b""
    return out.raw


def check_kernel(source: str, options: Sequence[str], function: str, compute_capability: str) -> str | None:
    """None when ``source`` compiles for the GPU (ptxas included) and defines the kernel
    ``function``; otherwise the compiler's first error lines, or what is missing."""
    from fleettune_job.classify import compiler_summary

    real = compile_source(source, [*options, arch_option(compute_capability)])
    if not real.ok:
        return f"compile error: {compiler_summary(real.log)}"
    virtual = compile_source(source, [*options, arch_option(compute_capability, virtual=True)])
    if not virtual.has_entry(function):
        return f'no kernel named {function!r} in the source (a __global__ function declared extern "C")'
    return None
