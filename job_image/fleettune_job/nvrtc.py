"""NVRTC through ctypes: compile CUDA source for a GPU architecture without a GPU.

NVRTC (and the ptxas inside it) needs no device, only libnvrtc: from a CUDA toolkit, the
``nvidia-cuda-nvrtc-cu12`` wheel, or the path in ``FLEETTUNE_NVRTC``. The operator uses
it to check a user kernel before any Job (compile errors, the function's name), the
fleet simulator to answer user-source trials with real compile errors, and the tests to
compile the built-in kernels for every GPU of the fleet.

What a kernel is compiled as is decided here, once, for the job's worker (through cupy),
its compile-ahead pool, the operator's check and the simulator: the text
(:func:`program`: the configuration's ``#define`` lines written into the source), the
CUDA headers (:func:`header_options`) and what cupy's ``RawModule`` adds
(:func:`cupy_options`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

NVRTC_ENV = "FLEETTUNE_NVRTC"
# nvrtcResult: the source does not compile (any other failure is an option the library
# refuses, such as an architecture newer than it knows, or the library itself).
NVRTC_ERROR_COMPILATION = 6
# NVRTC's answer to an include it cannot find.
INCLUDE_TROUBLE = ("cannot open source file", "could not open source file")


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

    @property
    def missing_include(self) -> bool:
        """An ``#include`` was not found: a header this machine lacks (the job image has cupy's
        too), which says nothing about the source."""
        return self.source_error and any(t in self.log for t in INCLUDE_TROUBLE)

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
    ``function``, or includes a header this machine does not have (the job is the judge of
    that); otherwise the compiler's first error lines, or what is missing."""
    from fleettune_job.classify import compiler_summary

    real = compile_source(source, [*options, arch_option(compute_capability)])
    if real.missing_include:
        return None
    if not real.ok:
        return f"compile error: {compiler_summary(real.log)}"
    virtual = compile_source(source, [*options, arch_option(compute_capability, virtual=True)])
    if not virtual.has_entry(function):
        return f'no kernel named {function!r} in the source (a __global__ function declared extern "C")'
    return None


# The header every user kernel may include (cuda_fp16.h needs the runtime's other headers,
# which ship beside it).
HEADER_PROBE = "cuda_fp16.h"


@cache
def cuda_include_dir() -> str | None:
    """The CUDA runtime's headers (``cuda_fp16.h``, ``cuda_bf16.h``, ``cuda_runtime.h``...):
    the ``nvidia-cuda-runtime-cu12`` wheel's, else a CUDA toolkit's (``$CUDA_PATH``,
    ``$CUDA_HOME``, ``/usr/local/cuda``); None when there are none. One directory only:
    headers of two CUDA versions do not mix."""
    candidates = []
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        candidates.append(Path(root) / "cuda_runtime" / "include")
    candidates += [Path(os.environ[var]) / "include" for var in ("CUDA_PATH", "CUDA_HOME") if os.environ.get(var)]
    candidates.append(Path("/usr/local/cuda/include"))
    return next((str(d) for d in candidates if (d / HEADER_PROBE).is_file()), None)


def header_options() -> tuple[str, ...]:
    """``-I`` for the CUDA headers, so that ``#include <cuda_fp16.h>`` works alike in the job,
    the operator's check and the simulator."""
    include = cuda_include_dir()
    return (f"-I{include}",) if include else ()


def cupy_options(options: Iterable[str]) -> tuple[str, ...]:
    """The options cupy's ``RawModule(code=...)`` adds to the configuration's own (cupy 14:
    ``cupy/_core/core.pyx`` assemble_cupy_compiler_options, ``cupy/cuda/compiler.py``): its
    headers, C++17, flush-to-zero (which changes the numbers a kernel computes), and
    functions without an execution space compiled for the device. Where cupy is not
    installed (the operator, the simulator) all but its headers."""
    options = tuple(options)
    extra: list[str] = []
    spec = importlib.util.find_spec("cupy")  # locates the package without importing it (no CUDA here)
    for root in (spec.submodule_search_locations or []) if spec else []:
        include = Path(root, "_core", "include")
        cccl = include / "cupy" / "_cccl"
        extra += [f"-I{d}" for d in (cccl / "cub", cccl / "thrust", cccl / "libcudacxx") if d.is_dir()]
        if include.is_dir():
            extra.append(f"-I{include}")
    if not any("-std=" in o for o in options):
        extra.append("--std=c++17")
    return (*extra, "-ftz=true", "--device-as-default-execution-space")


def job_options(options: Iterable[str]) -> tuple[str, ...]:
    """Everything NVRTC gets when the job's worker compiles with ``options``, cupy's additions
    included (no architecture: the caller's)."""
    options = tuple(options)
    return (*options, *cupy_options(options))


# C++ keywords: defining one as a macro is ill-formed once a standard header is included,
# and the source could no longer use the keyword itself.
CXX_KEYWORDS = frozenset({
    "alignas", "alignof", "and", "and_eq", "asm", "auto", "bitand", "bitor", "bool", "break", "case", "catch",
    "char", "char8_t", "char16_t", "char32_t", "class", "compl", "concept", "const", "consteval", "constexpr",
    "constinit", "const_cast", "continue", "co_await", "co_return", "co_yield", "decltype", "default", "delete",
    "do", "double", "dynamic_cast", "else", "enum", "explicit", "export", "extern", "false", "float", "for",
    "friend", "goto", "if", "inline", "int", "long", "mutable", "namespace", "new", "noexcept", "not", "not_eq",
    "nullptr", "operator", "or", "or_eq", "private", "protected", "public", "register", "reinterpret_cast",
    "requires", "return", "short", "signed", "sizeof", "static", "static_assert", "static_cast", "struct", "switch",
    "template", "this", "thread_local", "throw", "true", "try", "typedef", "typeid", "typename", "union", "unsigned",
    "using", "virtual", "void", "volatile", "wchar_t", "while", "xor", "xor_eq"
})
_PROBLEM_SIZE_DEFINE = re.compile(r"problem_size_\d+")


def define_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a configuration's ``#define`` in CUDA source, or None. Names of
    NVRTC's built-in header (``x``, ``size``, ``T``...) are fine: :func:`program` defines them
    after it."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        return f"{name!r} is not a C identifier"
    if name == "defined":
        return "'defined' is the preprocessor's operator and cannot be defined"
    if name in CXX_KEYWORDS:
        return f"{name!r} is a C++ keyword: as a #define it would replace the keyword in the source"
    if name.startswith("__"):
        return f"{name!r} starts with '__', which C++ reserves for the compiler and CUDA (__global__, __half...)"
    if _PROBLEM_SIZE_DEFINE.fullmatch(name):
        return f"{name!r} is the define of the problem size's dimension {name.rsplit('_', 1)[1]}"
    return None


_INCLUDE_LINE = re.compile(r"\s*#\s*include\b")
_CONDITIONAL_BRANCH = re.compile(r"\s*#\s*(?:else|elif|elifdef|elifndef|endif)\b")


def program(source: str, defines: Mapping[str, str]) -> str:
    """The text NVRTC compiles: ``source`` with a ``#define name value`` line per entry of
    ``defines`` (rendered values).

    Defines in the text rather than ``-D`` options: a ``-D`` option also reaches the header
    NVRTC compiles before the source, whose ``x``, ``y``, ``size``, ``T``... a parameter of
    that name broke (``__nv_nvrtc_builtin_header.h: error: expected an identifier``). The
    headers the source includes are kept from them too: each ``#include`` line is preceded
    by ``#undef`` lines and followed by the defines again, so ``T`` may be ``__half`` beside
    ``#include <cuda_fp16.h>`` (whose code names its own ``T``, ``x`` and ``y``). ``#line``
    directives keep the compiler's line numbers those of ``source``.
    """
    if not defines:
        return source
    names = sorted(defines)
    define = [f"#define {name} {defines[name]}" for name in names]
    undefine = [f"#undef {name}" for name in names]
    out = [*define, "#line 1"]
    defined = True
    moved = False  # directives inserted mid-source (their #line may sit in a skipped #if branch)
    in_comment = continued = False
    for number, line in enumerate(source.split("\n"), start=1):
        if not in_comment and not continued and line.strip() and not line.lstrip().startswith("//"):
            include = _INCLUDE_LINE.match(line) is not None
            if include == defined:
                out += [*(undefine if include else define), f"#line {number}"]
                defined, moved = not include, True
        out.append(line)
        if moved and not in_comment and not continued and _CONDITIONAL_BRANCH.match(line):
            # Directives in a branch the preprocessor skips are not read, their #line included.
            out.append(f"#line {number + 1}")
        continued = line.rstrip("\r").endswith("\\")
        in_comment = _in_block_comment(line, in_comment)
    return "\n".join(out)


def _in_block_comment(line: str, in_comment: bool) -> bool:
    """Whether a ``/* */`` comment is open at the end of ``line`` (``in_comment``: at its start);
    string and character literals and ``//`` comments are skipped."""
    i, n = 0, len(line)
    while i < n:
        if in_comment:
            end = line.find("*/", i)
            if end < 0:
                return True
            in_comment, i = False, end + 2
            continue
        c = line[i]
        if c in "\"'":
            i += 1
            while i < n and line[i] != c:
                i += 2 if line[i] == "\\" else 1
        elif line.startswith("//", i):
            return False
        elif line.startswith("/*", i):
            in_comment = True
            i += 1
        i += 1
    return in_comment
