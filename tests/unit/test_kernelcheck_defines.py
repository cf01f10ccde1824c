"""The operator's check of what a user kernel's configuration becomes: ``#define`` lines of the
source. Names CUDA authors use (``size``, ``T``, ``a``...) and the CUDA headers (``cuda_fp16.h``,
``cuda_bf16.h``) compile as in the job; a name or value that cannot be a define fails the run
up front, naming the field, rather than every trial (no cluster; real NVRTC)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from fleettune.api import TuningRunSpec
from fleettune.controller.spec import SpecError, checked_spec
from fleettune.kernelcheck import KernelSpecError, check_kernel, compile_check
from fleettune_job import nvrtc

SOURCE = """#include <cuda_fp16.h>
#include <cuda_bf16.h>

extern "C" __global__ void scale(float *out, const float *in, int n) {
    const int i = blockIdx.x * size + threadIdx.x;
    if (i < n) out[i] = float(T(in[i]) * T(a)) + b * value;
}
"""

SPEC: dict[str, Any] = {
    "kernel": {
        "source": {
            "configMap": "scale-src",
            "function": "scale",
            "grid": ["cdiv(problem_size[0], size)"],
            "block": ["size"],
            "arguments": [
                {"name": "out", "length": "problem_size[0]", "init": "zeros", "output": True},
                {"name": "inp", "length": "problem_size[0]"},
                {"name": "n", "kind": "scalar", "dtype": "int32", "value": "problem_size[0]"},
            ],
            "verification": {"atol": 0.1},
        },
        "problemSize": [1000],
        "defaultConfig": {"size": 128, "T": "float", "a": 2, "b": 1, "value": 3},
    },
    "parameters": [
        {"name": "size", "values": [64, 128, 256]},
        {"name": "a", "values": [1, 2]},
        {"name": "T", "type": "categorical", "values": ["float", "__half", "__nv_bfloat16"]},
        {"name": "b", "values": [0, 1]},
        {"name": "value", "values": [1, 3]},
    ],
    "targets": [{"name": "a100", "nodeSelector": {"pool": "a100"}}],
}


def spec_doc(**parameter_changes: Any) -> dict[str, Any]:
    doc = copy.deepcopy(SPEC)
    for index, change in parameter_changes.items():
        doc["parameters"][int(index.lstrip("p"))].update(change)
    return doc


def refusal(doc: dict[str, Any]) -> str:
    with pytest.raises(KernelSpecError) as err:
        check_kernel(TuningRunSpec.model_validate(doc))
    return str(err.value)


def test_a_value_that_cannot_be_a_define_fails_the_run_up_front_naming_the_field() -> None:
    doc = spec_doc(p2={"values": ["float", "1);}//", "__half"]})
    message = refusal(doc)
    assert message.startswith("spec.parameters[2].values[1]: parameter T has a value that cannot be a compile-time "
                              "constant: '1);}//'"), message
    # The operator's verdict for the run: Ready=False, reason InvalidSpec, before any Job.
    with pytest.raises(SpecError) as err:
        checked_spec(doc, None)
    assert err.value.reason == "InvalidSpec" and str(err.value) == message


@pytest.mark.parametrize(("name", "why"), [
    ("float", "C++ keyword"),
    ("__half", "reserves"),
    ("problem_size_0", "problem size's dimension 0"),
    ("defined", "preprocessor"),
])
def test_a_name_that_cannot_be_a_define_is_refused_naming_the_parameter(name: str, why: str) -> None:
    doc = spec_doc(p3={"name": name})
    doc["kernel"]["defaultConfig"] = {**SPEC["kernel"]["defaultConfig"], name: 1}
    message = refusal(doc)
    assert message.startswith(f"spec.parameters[3].name: '{name}'") and why in message, message


def test_a_permutation_cannot_be_a_define() -> None:
    doc = spec_doc(p4={"name": "order", "type": "permutation", "size": 3, "values": None})
    assert refusal(doc).startswith("spec.parameters[4].type: a permutation cannot be a #define")


def test_a_default_value_that_cannot_be_a_define_is_named() -> None:
    doc = copy.deepcopy(SPEC)
    doc["kernel"]["defaultConfig"]["T"] = "unsigned; int"
    assert refusal(doc).startswith("spec.kernel.defaultConfig.T: parameter T has a value that cannot be")


def test_names_cuda_authors_use_pass_the_checks_without_a_cluster() -> None:
    check_kernel(TuningRunSpec.model_validate(SPEC))


needs_nvrtc = pytest.mark.skipif(not nvrtc.available(), reason="libnvrtc not found (pip install "
                                                               "nvidia-cuda-nvrtc-cu12 or set FLEETTUNE_NVRTC)")


@needs_nvrtc
@pytest.mark.skipif(nvrtc.cuda_include_dir() is None, reason="no CUDA headers (pip install nvidia-cuda-runtime-cu12)")
@pytest.mark.parametrize("t", ["float", "__half", "__nv_bfloat16"])
def test_half_and_bfloat16_kernels_with_common_parameter_names_pass_the_compile_check(t: str) -> None:
    doc = copy.deepcopy(SPEC)
    doc["kernel"]["defaultConfig"]["T"] = t
    spec = TuningRunSpec.model_validate(doc)
    assert compile_check(spec, SOURCE, "8.0", (1000,)) is None
    assert compile_check(spec, SOURCE, None, (1000,)) is None
    broken = SOURCE.replace("+ b * value", "+ b * valeu")
    problem = compile_check(spec, broken, "8.0", (1000,))
    assert problem is not None and 'line 6: error: identifier "valeu" is undefined' in problem, problem


@needs_nvrtc
def test_a_parameter_that_replaces_a_member_name_is_named_in_the_compile_error() -> None:
    doc = spec_doc(p4={"name": "x"})
    doc["kernel"]["defaultConfig"] = {**SPEC["kernel"]["defaultConfig"], "x": 3}
    doc["kernel"]["defaultConfig"].pop("value")
    source = SOURCE.replace("b * value", "b * x")
    problem = compile_check(TuningRunSpec.model_validate(doc), source, "8.0", (1000,))
    assert problem is not None and "expected a member name" in problem
    assert problem.endswith("(parameter 'x' is a #define: it replaces every x of the source, the member name in "
                            "'.x' too; rename the parameter)"), problem
