"""How a configuration reaches CUDA source: ``#define`` lines written into the text
(``nvrtc.program``), the CUDA headers on the include path (``nvrtc.header_options``), compiled
for real with NVRTC (no GPU needed), as the job's worker, its compile-ahead pool, the
operator's check and the simulator all compile it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fleettune_job import nvrtc
from fleettune_job.ahead import Build, compile_build
from fleettune_job.prepare import PreparedUser, prepare, user_defines, user_program
from fleettune_job.protocol import Argument, KernelRef, Trial, Verification

needs_nvrtc = pytest.mark.skipif(not nvrtc.available(), reason="libnvrtc not found (pip install "
                                 "nvidia-cuda-nvrtc-cu12 or set FLEETTUNE_NVRTC)")
needs_headers = pytest.mark.skipif(nvrtc.cuda_include_dir() is None, reason="no CUDA headers (pip install "
                                   "nvidia-cuda-runtime-cu12)")

# Names NVRTC's built-in header uses itself (`unsigned int x, y, z;`, `size`, `T`, ...): as -D
# options they broke that header, far from the parameter.
COMMON_NAMES = ["x", "y", "size", "width", "height", "value", "offset", "mode", "type", "a", "b", "extra",
                "flags", "base"]
SUM = " + ".join(f"{name} * {1 << i}" for i, name in enumerate(COMMON_NAMES))
PROBE = 'extern "C" __global__ void probe(T *out) {\n    out[0] = T(' + SUM + ');\n}\n'


def _ptx(code: str, options: tuple[str, ...] = ()) -> nvrtc.Compiled:
    return nvrtc.compile_source(code, [*options, nvrtc.arch_option("8.0", virtual=True)])


@needs_nvrtc
def test_parameters_named_like_the_builtin_headers_compile_and_their_values_reach_the_source() -> None:
    values = {name: 1 for name in COMMON_NAMES} | {"size": 0, "flags": 0}
    config: dict[str, int | str] = {**values, "T": "int"}
    code, options = user_program(PROBE, config, [1000])
    compiled = _ptx(code, options)
    assert compiled.ok, compiled.log
    expected = sum(values[name] << i for i, name in enumerate(COMMON_NAMES))
    # The sum folds to one constant, stored as an int (T): the values are the configuration's.
    assert re.search(rf"\b{expected}\b", compiled.ptx), compiled.ptx
    assert compiled.has_entry("probe")
    # As -D options the same configuration breaks NVRTC's own header, not the source.
    as_options = [f"-D{name}={value}" for name, value in user_defines(config, [1000]).items()]
    broken = _ptx(PROBE, tuple(as_options))
    assert not broken.ok and "__nv_nvrtc_builtin_header.h" in broken.log


HALF = """#include <cuda_fp16.h>
#include <cuda_bf16.h>

extern "C" __global__ void scale(float *out, const float *in, int n) {
    const int i = blockIdx.x * size + threadIdx.x;
    if (i < n) out[i] = float(T(in[i]) * T(a)) + b + y * value;
}
"""


@needs_nvrtc
@needs_headers
@pytest.mark.parametrize("t", ["__half", "__nv_bfloat16", "float"])
def test_half_and_bfloat16_kernels_include_the_cuda_headers_beside_parameters_named_like_theirs(t: str) -> None:
    # cuda_fp16.h names its own a, y and value (`make_half2(const __half x, const __half y)`): the
    # parameters are undefined around each #include, defined again after it.
    code, options = user_program(HALF, {"T": t, "size": 128, "a": 2, "b": 1, "y": 3, "value": 4}, [1000])
    assert nvrtc.check_kernel(code, options, "scale", "8.0") is None
    assert nvrtc.check_kernel(code, options, "scale", "9.0") is None


@needs_nvrtc
def test_without_the_headers_an_include_is_for_the_job_to_judge(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvrtc, "header_options", lambda: ())
    config = {"T": "float", "size": 128, "a": 2, "b": 1, "y": 0, "value": 0}
    code, options = user_program(HALF, config, [1000])
    compiled = nvrtc.compile_source(code, [*options, "-arch=sm_80"])
    assert compiled.missing_include, compiled.log
    assert nvrtc.check_kernel(code, options, "scale", "8.0") is None
    # A header nobody has is no reason to refuse either (the job image adds cupy's and CCCL's).
    code, options = user_program("#include <cub/cub.cuh>\n" + HALF, config, [1])
    assert nvrtc.check_kernel(code, options, "scale", "8.0") is None


@needs_nvrtc
@needs_headers
def test_compiler_messages_keep_the_line_numbers_of_the_source() -> None:
    source = """// line 1
#include <cuda_fp16.h>
/* a comment that names
#include <no_such_header.h> */
#if use_bf16
#include <cuda_bf16.h>
#endif
extern "C" __global__ void f(float *out) {
    out[0] = width;
    oops;
}
"""
    for use_bf16 in (0, 1):
        code, options = user_program(source, {"width": 2, "use_bf16": use_bf16}, [1])
        compiled = nvrtc.compile_source(code, [*options, "-arch=sm_80"])
        assert re.search(r"\(10\): error: identifier \"oops\" is undefined", compiled.log), compiled.log


def test_the_program_defines_every_name_before_the_source_and_keeps_includes_from_them() -> None:
    assert nvrtc.program("int a;\n", {}) == "int a;\n"
    source = "#include <a.h>\n\n// note\n#include <b.h>\nint k = T;\n/*\n#include <c.h>\n*/\n"
    code = nvrtc.program(source, {"T": "float", "N": "4"})
    assert code.split("\n") == [
        "#define N 4", "#define T float", "#line 1",
        "#undef N", "#undef T", "#line 1", "#include <a.h>", "", "// note", "#include <b.h>",
        "#define N 4", "#define T float", "#line 5", "int k = T;", "/*", "#include <c.h>", "*/", "",
    ]
    # A directive continued on the next line, and quotes that hide comment markers.
    code = nvrtc.program('#define S "/*"\n#include \\\n  <d.h>\nint k;\n', {"K": "1"})
    assert code.split("\n")[3:] == ["#undef K", "#line 2", "#include \\", "  <d.h>", "#define K 1", "#line 4",
                                    "int k;", ""]


@pytest.mark.parametrize(("name", "why"), [
    ("defined", "preprocessor's operator"),
    ("float", "C++ keyword"),
    ("template", "C++ keyword"),
    ("__half", "reserves"),
    ("problem_size_1", "problem size's dimension 1"),
    ("1x", "not a C identifier"),
])
def test_names_that_cannot_be_a_define_say_why(name: str, why: str) -> None:
    problem = nvrtc.define_name_problem(name)
    assert problem is not None and why in problem


@pytest.mark.parametrize("name", [*COMMON_NAMES, "T", "N", "_private", "problem_size", "block_size_x"])
def test_common_names_can_be_defines(name: str) -> None:
    assert nvrtc.define_name_problem(name) is None


@needs_nvrtc
@needs_headers
def test_the_job_compiles_ahead_what_the_operator_checked(tmp_path: Path) -> None:
    src = tmp_path / "scale.cu"
    src.write_text(HALF)
    kernel = KernelRef(
        source_path=str(src), function="scale", grid=["cdiv(problem_size[0], size)"], block=["size"],
        arguments=[Argument(name="out", length="problem_size[0]", output=True),
                   Argument(name="inp", length="problem_size[0]"),
                   Argument(name="n", kind="scalar", dtype="int32", value="problem_size[0]")],
        verification=Verification(reference_config={"T": "float", "size": 128, "a": 2, "b": 1, "y": 0, "value": 0},
                                  atol=0.1),
    )
    config = {"T": "__half", "size": 64, "a": 2, "b": 1, "y": 3, "value": 4}
    prepared = prepare(Trial(run="r", target="t", index=0, kernel=kernel, problem_size=[1000], config=config))
    assert isinstance(prepared, PreparedUser) and prepared.reference is not None
    for build in (prepared.candidate, prepared.reference):
        artefact = compile_build(Build.of(build), "8.0", str(tmp_path))
        assert artefact.path and not artefact.error, artefact
    # What the operator compiles for the same configuration is what the job compiles.
    code, options = user_program(HALF, config, [1000])
    assert (code, options) == (prepared.candidate.code, nvrtc.job_options(prepared.candidate.options))
    assert f"-I{nvrtc.cuda_include_dir()}" in options
