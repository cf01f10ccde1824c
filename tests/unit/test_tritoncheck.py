"""Triton source checked before any Job: read without running it, and compiled with Triton's
own compiler for each pool's GPU (no GPU needed)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from fleettune.api import TuningRunSpec
from fleettune.kernelcheck import KernelSpecError, check_kernel, check_triton_source, compile_check
from fleettune_job import tritonsource
from fleettune_job.tritonsource import TritonSourceError, signature, vet

needs_triton = pytest.mark.skipif(not tritonsource.available(), reason="Triton is not installed")

SOURCE = '''
"""A matmul."""
import triton
import triton.language as tl

SCALE = tl.constexpr(1)


@triton.jit
def matmul(a, b, c, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr = 32):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        x = tl.load(a + rm[:, None] * K + (k + rk)[None, :], mask=(rm[:, None] < M) & ((k + rk)[None, :] < K),
                    other=0.0)
        y = tl.load(b + (k + rk)[:, None] * N + rn[None, :], mask=((k + rk)[:, None] < K) & (rn[None, :] < N),
                    other=0.0)
        acc += tl.dot(x, y)
    tl.store(c + rm[:, None] * N + rn[None, :], acc * SCALE, mask=(rm[:, None] < M) & (rn[None, :] < N))
'''

SPEC: dict[str, Any] = {
    "kernel": {
        "triton": {
            "configMap": "mm",
            "function": "matmul",
            "grid": ["cdiv(problem_size[0], BLOCK_M)", "cdiv(problem_size[1], BLOCK_N)"],
            "arguments": [
                {"name": "a", "dtype": "float16", "length": "problem_size[0] * problem_size[2]"},
                {"name": "b", "dtype": "float16", "length": "problem_size[2] * problem_size[1]"},
                {"name": "c", "length": "problem_size[0] * problem_size[1]", "init": "zeros", "output": True},
                {"name": "M", "kind": "scalar", "dtype": "int32", "value": "problem_size[0]"},
                {"name": "N", "kind": "scalar", "dtype": "int32", "value": "problem_size[1]"},
                {"name": "K", "kind": "scalar", "dtype": "int32", "value": "problem_size[2]"},
            ],
        },
        "problemSize": [512, 512, 512],
        "defaultConfig": {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2},
    },
    "parameters": [{"name": "BLOCK_M", "values": [32, 64, 128, 256]}, {"name": "BLOCK_N", "values": [32, 64, 128]},
                   {"name": "num_warps", "values": [2, 4, 8]}, {"name": "num_stages", "values": [2, 3, 4]}],
    "targets": [{"name": "a100", "device": "NVIDIA-A100-SXM4-80GB"}],
}


def spec(default: dict[str, Any] | None = None, **changes: Any) -> TuningRunSpec:
    doc = copy.deepcopy(SPEC)
    if default is not None:
        doc["kernel"]["defaultConfig"] |= default
    for path, value in changes.items():
        node: Any = doc
        *parents, last = path.split("__")
        for p in parents:
            node = node[int(p)] if p.isdigit() else node[p]
        node[last] = value
    return TuningRunSpec.model_validate(doc)


def test_the_module_is_read_without_running_it() -> None:
    sig = signature(SOURCE, "matmul")
    assert sig.arguments == ("a", "b", "c", "M", "N", "K")
    assert dict(sig.meta) == {"BLOCK_M": False, "BLOCK_N": False, "BLOCK_K": True}


@pytest.mark.parametrize(("text", "says"), [
    ("import os\n", "import of 'os'"),
    ("from subprocess import run\n", "import of 'subprocess'"),
    ("X = open('/etc/passwd').read()\n", "literal"),
    ("print('hello')\n", "found Expr"),
    ("import triton\n@triton.jit\n@staticmethod\ndef f(a):\n    pass\n", "bare @triton.jit"),
    ("import triton\n@triton.jit\ndef f(a, B=__import__('os').getpid()):\n    pass\n", "literals"),
    ("import triton\nclass K:\n    pass\n", "found ClassDef"),
    ("def f(:\n", "line 1"),
])
def test_a_module_that_would_run_something_is_refused(text: str, says: str) -> None:
    with pytest.raises(TritonSourceError, match=says):
        vet(text)


@pytest.mark.parametrize(("changes", "field"), [
    ({"kernel__triton__function": "mm"}, r"spec.kernel.triton.function: no @triton.jit function 'mm'"),
    ({"kernel__triton__arguments__3__name": "rows"}, r"spec.kernel.triton.arguments: matmul takes \(a, b, c, M"),
    ({"parameters__0__name": "BLOCK"}, r"spec.parameters\[0\].name: 'BLOCK' is neither"),
])
def test_the_spec_must_match_the_function(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(KernelSpecError, match=field):
        check_triton_source(spec(**changes), SOURCE)


def test_a_meta_parameter_without_a_default_needs_a_value() -> None:
    doc = spec().model_dump(by_alias=True, exclude_none=True)
    doc["parameters"] = doc["parameters"][1:]
    del doc["kernel"]["defaultConfig"]["BLOCK_M"]
    with pytest.raises(KernelSpecError, match=r"spec.kernel.defaultConfig: meta-parameter 'BLOCK_M'"):
        check_triton_source(TuningRunSpec.model_validate(doc), SOURCE)


def test_launch_options_are_checked_and_expressions_use_meta_parameters() -> None:
    check_kernel(spec())
    with pytest.raises(KernelSpecError, match=r"spec.parameters\[2\].values: num_warps = 3"):
        check_kernel(spec(parameters__2__values=[2, 3]))
    with pytest.raises(KernelSpecError, match=r"spec.kernel.triton.grid"):
        check_kernel(spec(kernel__triton__grid=["cdiv(problem_size[0], BLOCK_X)"]))


@needs_triton
def test_the_default_configuration_compiles_for_each_gpu() -> None:
    s = spec()
    assert compile_check(s, SOURCE, "8.0", (512, 512, 512)) is None
    # The operator's check before any Job: the source against the spec first, then the compile.
    mismatch = compile_check(spec(kernel__triton__function="mm"), SOURCE, "8.0", (512, 512, 512))
    assert mismatch is not None and mismatch.startswith("spec.kernel.triton.function: no @triton.jit function")
    problem = compile_check(spec({"BLOCK_M": 48}), SOURCE, "8.0", (512, 512, 512))
    assert problem is not None and problem.startswith("spec.kernel.triton: with kernel.defaultConfig, for sm_80: ")
    assert "power of 2" in problem


@needs_triton
def test_shared_memory_over_the_gpus_limit_is_named() -> None:
    big = spec({"BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": 128, "num_stages": 4})  # 128 KiB
    problem = compile_check(big, SOURCE, "8.6", (512, 512, 512))
    assert problem is not None and "bytes of shared memory per block for sm_86, which allows 101376" in problem
