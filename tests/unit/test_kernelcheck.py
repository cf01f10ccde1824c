"""The operator's up-front checks of a run's kernel (no cluster; real NVRTC where installed)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from fleettune.api import TuningRunSpec
from fleettune.kernelcheck import KernelSpecError, check_kernel, check_source_data, compile_check
from fleettune_job import nvrtc

SOURCE = """
extern "C" __global__ void scale(float *out, const float *in, float factor, int n) {
    int i = blockIdx.x * block_size_x + threadIdx.x;
    if (i < n) out[i] = in[i] * factor;
}
extern "C" __global__ void scale_reference(float *out, const float *in, float factor, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * factor;
}
"""

SPEC: dict[str, Any] = {
    "kernel": {
        "source": {
            "configMap": "scale-src",
            "function": "scale",
            "grid": ["cdiv(problem_size[0], block_size_x)"],
            "block": ["block_size_x"],
            "arguments": [
                {"name": "out", "length": "problem_size[0]", "init": "zeros", "output": True},
                {"name": "inp", "length": "problem_size[0]", "init": "data", "dataKey": "in.txt"},
                {"name": "factor", "kind": "scalar", "value": "2.5"},
                {"name": "n", "kind": "scalar", "dtype": "int32", "value": "problem_size[0]"},
            ],
        },
        "problemSize": [1000],
        "defaultConfig": {"block_size_x": 128},
    },
    "parameters": [{"name": "block_size_x", "values": [32, 64, 128, 256]}],
    "targets": [{"name": "a100", "nodeSelector": {"pool": "a100"}}],
}


def spec(**kernel_changes: Any) -> TuningRunSpec:
    doc = copy.deepcopy(SPEC)
    for path, value in kernel_changes.items():
        node = doc["kernel"]
        *parents, last = path.split("__")
        for p in parents:
            node = node[int(p)] if p.isdigit() else node[p]
        node[last] = value
    return TuningRunSpec.model_validate(doc)


def test_a_valid_user_kernel_passes() -> None:
    check_kernel(spec())


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"source__grid": ["cdiv(problem_size[0], nope)"]}, "spec.kernel.source.grid: unknown name 'nope'"),
        ({"source__block": ["block_size_x - 128"]}, "spec.kernel.source.block: [0, 1, 1]"),
        ({"source__arguments__0__length": "problem_size[0] * block_size_x"},
         "spec.kernel.source.arguments[0].length: unknown name 'block_size_x'"),
        ({"source__arguments__0__length": "problem_size[0] / 3"}, "spec.kernel.source.arguments[0].length"),
        ({"source__arguments__0__length": "problem_size[2]"}, "problem_size[2] out of range"),
        ({"source__arguments__3__value": "import os"}, "spec.kernel.source.arguments[3].value"),
    ],
)
def test_expression_problems_name_the_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(KernelSpecError) as err:
        check_kernel(spec(**change))
    assert field in str(err.value)


def test_an_unknown_builtin_is_named_with_the_known_ones() -> None:
    doc = copy.deepcopy(SPEC)
    doc["kernel"] = {"builtin": "convolutoin", "problemSize": [4096, 4096]}
    with pytest.raises(KernelSpecError, match=r"spec.kernel.builtin: unknown built-in kernel 'convolutoin' "
                                              r"\(known: .*convolution"):
        check_kernel(TuningRunSpec.model_validate(doc))


def test_source_configmap_and_keys_must_exist() -> None:
    s = spec()
    with pytest.raises(KernelSpecError, match=r"spec.kernel.source.configMap: ConfigMap 'scale-src' not found"):
        check_source_data(s, None)
    with pytest.raises(KernelSpecError, match=r"spec.kernel.source.key: .* no key 'kernel.cu' \(keys: in.txt\)"):
        check_source_data(s, {"in.txt": "1 2 3"})
    with pytest.raises(KernelSpecError, match=r"spec.kernel.source.arguments\[1\].dataKey: .* no key 'in.txt'"):
        check_source_data(s, {"kernel.cu": SOURCE})
    assert check_source_data(s, {"kernel.cu": SOURCE, "in.txt": "1"}) == SOURCE


needs_nvrtc = pytest.mark.skipif(not nvrtc.available(), reason="libnvrtc not found (pip install "
                                                               "nvidia-cuda-nvrtc-cu12 or set FLEETTUNE_NVRTC)")


@needs_nvrtc
@pytest.mark.parametrize("cc", ["8.0", "8.7", None])
def test_the_source_compiles_for_the_pools_gpu(cc: str | None) -> None:
    assert compile_check(spec(), SOURCE, cc, (1000,)) is None


@needs_nvrtc
def test_compile_errors_carry_the_compilers_message() -> None:
    broken = SOURCE.replace("in[i] * factor;", "in[i] * factr;", 1)
    problem = compile_check(spec(), broken, "8.0", (1000,))
    assert problem is not None
    assert problem.startswith("spec.kernel.source: with kernel.defaultConfig, for sm_80: compile error:")
    assert 'identifier "factr" is undefined' in problem


@needs_nvrtc
def test_a_missing_kernel_or_reference_function_is_named() -> None:
    problem = compile_check(spec(source__function="scale2"), SOURCE, "8.0", (1000,))
    assert problem is not None and "no kernel named 'scale2'" in problem
    problem = compile_check(spec(source__verification={"referenceFunction": "nope"}), SOURCE, "8.0", (1000,))
    assert problem is not None
    assert problem.startswith("spec.kernel.source.verification.referenceFunction:")
    assert compile_check(spec(source__verification={"referenceFunction": "scale_reference"}),
                         SOURCE, "8.0", (1000,)) is None


@needs_nvrtc
def test_too_many_registers_or_shared_memory_fail_for_the_real_architecture() -> None:
    big = SOURCE.replace("if (i < n) out[i] = in[i] * factor;",
                         "__shared__ float pad[64 * 1024]; pad[threadIdx.x] = in[i]; __syncthreads(); "
                         "if (i < n) out[i] = pad[(threadIdx.x + 1) % 32] * factor;", 1)
    problem = compile_check(spec(), big, "7.5", (1000,))
    assert problem is not None and "shared" in problem
